// The Trainer's phases and their table (trainer_phase.h).
#include "train/trainer_phase.h"

#include <string>

#include "fsdp/common/error.h"

namespace fsdp::train {
namespace {

using P = TrainerPhase;

bool is_scope(P p) { return p == P::kEvaluating || p == P::kSaving || p == P::kExporting; }
// The phases a scope (evaluate, save, export_hf) may start from, and return to.
bool hosts_scopes(P p) { return p == P::kRestored || p == P::kTraining || p == P::kStopping; }

// What to do instead of an illegal change, for its message.
std::string hint(const std::string& method, P from, P to) {
  if (from == P::kFailed) {
    return "an earlier call failed and the ranks may be at different points of a collective: the Trainer can "
           "only be destroyed";
  }
  if (from == P::kFinished) return "run() finished this Trainer's run; construct a new Trainer for another";
  if (is_scope(from)) return "another of the Trainer's methods is running; call one at a time";
  if (to == P::kRestored) {
    return method == "run" ? "run() runs the whole training from the start; restore() was called already"
                           : "the weights are restored already; call it once";
  }
  if (from == P::kConstructed) return "it needs the weights in place: call restore() first";
  if (from == P::kStopping && to == P::kTraining) {
    return "a rank asked to stop at the last step (stop_requested()); save() and end the run";
  }
  return "see the order of calls in fsdp/train/trainer.h";
}

}  // namespace

const char* to_string(TrainerPhase p) {
  switch (p) {
    case P::kConstructed: return "Constructed";
    case P::kRestored: return "Restored";
    case P::kTraining: return "Training";
    case P::kStopping: return "Stopping";
    case P::kEvaluating: return "Evaluating";
    case P::kSaving: return "Saving";
    case P::kExporting: return "Exporting";
    case P::kFinished: return "Finished";
    case P::kFailed: return "Failed";
  }
  return "?";
}

bool legal(TrainerPhase from, TrainerPhase to) {
  if (to == P::kFailed) return from != P::kFinished;  // any method that throws after its checks
  switch (from) {
    case P::kConstructed: return to == P::kRestored;                               // restore()
    case P::kRestored: return to == P::kTraining || is_scope(to) || to == P::kFinished;  // an --eval-only run() ends
    case P::kTraining: return to == P::kTraining || to == P::kStopping || is_scope(to) || to == P::kFinished;
    case P::kStopping: return is_scope(to) || to == P::kFinished;
    case P::kEvaluating:
    case P::kSaving:
    case P::kExporting: return hosts_scopes(to);  // back where the scope began (PhaseScope)
    case P::kFinished:
    case P::kFailed: return false;
  }
  return false;
}

void require_legal(TrainerPhase phase, TrainerPhase to, const char* method) {
  FSDP_CHECK(legal(phase, to), "Trainer::", method, ": ", hint(method, phase, to), " (phase ", to_string(phase),
             " -> ", to_string(to), " is not legal)");
}

void transition_to(TrainerPhase& phase, TrainerPhase to, const char* method) {
  require_legal(phase, to, method);
  phase = to;
}

PhaseScope::PhaseScope(TrainerPhase& phase, TrainerPhase scope, const char* method) : phase_(phase), before_(phase) {
  transition_to(phase_, scope, method);
}

PhaseScope::~PhaseScope() {
  phase_ = std::uncaught_exceptions() > exceptions_ ? P::kFailed : before_;
}

}  // namespace fsdp::train

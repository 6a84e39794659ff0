// Where a Trainer is in its run (trainer.h's contract for the order of its
// methods): a named phase, a table of the legal changes, and one
// transition_to that refuses any other with a UsageError naming both phases
// and what to call instead, as the engine's states (fsdp/state.h) and the
// asynchronous save's (checkpoint/async_save.h) do.
//
//   Constructed --restore()--> Restored --train_step()--> Training --(a rank asked to stop)--> Stopping
//        |                        |                          |                                    |
//        +---- run() ----> (restore, then as above) ...     +----------- run() ends ------------+--> Finished
//
// evaluate(), save() and export_hf() are scopes (PhaseScope): from Restored,
// Training or Stopping into Evaluating, Saving or Exporting and back. An
// exception thrown after a method's checks (I/O, a collective, a non-finite
// loss) leaves the Trainer Failed: the ranks may be at different points of
// a collective, so every later call is refused and only destruction is left.
#pragma once

#include <exception>

namespace fsdp::train {

enum class TrainerPhase {
  kConstructed,  // built and sharded; the starting weights are not in place yet
  kRestored,     // restore() put the starting weights in place; no step yet
  kTraining,     // the data loader runs; train_step() went at least once
  kStopping,     // some rank asked to stop at the last step (stop_requested()): save and end
  kEvaluating,   // inside evaluate()
  kSaving,       // inside save()
  kExporting,    // inside export_hf()
  kFinished,     // run() returned
  kFailed,       // a method threw after its checks: only destruction is left
};
const char* to_string(TrainerPhase p);
bool legal(TrainerPhase from, TrainerPhase to);

// Throws UsageError unless Trainer::<method> may move `phase` to `to`
// ("Trainer::train_step: it needs the weights in place: call restore()
// first (phase Constructed -> Training is not legal)"): a method checks
// this before its other requirements, so that a refusal changes nothing.
void require_legal(TrainerPhase phase, TrainerPhase to, const char* method);
// require_legal, then `phase` = `to`.
void transition_to(TrainerPhase& phase, TrainerPhase to, const char* method);

// A method that returns to the phase it started in (evaluate, save,
// export_hf): enters `scope` (checked by the table) and, on leaving, goes
// back, or to kFailed when leaving by an exception.
class PhaseScope {
 public:
  PhaseScope(TrainerPhase& phase, TrainerPhase scope, const char* method);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  TrainerPhase& phase_;
  const TrainerPhase before_;
  const int exceptions_ = std::uncaught_exceptions();
};

// A method that moves the phase forward (restore, train_step, run): leaving
// it by an exception once its checks passed (the guard made after them)
// leaves the Trainer kFailed.
class FailsTrainer {
 public:
  explicit FailsTrainer(TrainerPhase& phase) : phase_(phase) {}
  ~FailsTrainer() {
    if (std::uncaught_exceptions() > exceptions_) phase_ = TrainerPhase::kFailed;
  }
  FailsTrainer(const FailsTrainer&) = delete;
  FailsTrainer& operator=(const FailsTrainer&) = delete;

 private:
  TrainerPhase& phase_;
  const int exceptions_ = std::uncaught_exceptions();
};

}  // namespace fsdp::train

// The Trainer's phases (src/train/trainer_phase.h): the table of legal
// changes, edge by edge, and the refusals' messages. The order of a real
// Trainer's calls is checked in test_train.cpp (Train.AHandWrittenLoopEqualsRun).
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "fsdp/common/error.h"
#include "support/errors.h"
#include "train/trainer_phase.h"

namespace fsdp::train {
namespace {

using P = TrainerPhase;

const P kAll[] = {P::kConstructed, P::kRestored, P::kTraining,  P::kStopping, P::kEvaluating,
                  P::kSaving,      P::kExporting, P::kFinished, P::kFailed};

// The contract of fsdp/train/trainer.h written out: restore() first and
// once; train_step() from Restored or Training; evaluate/save/export_hf
// from Restored, Training or Stopping and back; run() ends in Finished;
// any phase but Finished may fail, and nothing leaves Finished or Failed.
std::set<std::pair<P, P>> contract() {
  std::set<std::pair<P, P>> edges = {
      {P::kConstructed, P::kRestored}, {P::kRestored, P::kTraining}, {P::kTraining, P::kTraining},
      {P::kTraining, P::kStopping},    {P::kRestored, P::kFinished}, {P::kTraining, P::kFinished},
      {P::kStopping, P::kFinished},
  };
  for (P host : {P::kRestored, P::kTraining, P::kStopping}) {
    for (P scope : {P::kEvaluating, P::kSaving, P::kExporting}) {
      edges.insert({host, scope});
      edges.insert({scope, host});
    }
  }
  for (P p : kAll) {
    if (p != P::kFinished) edges.insert({p, P::kFailed});
  }
  return edges;
}

TEST(TrainerPhase, TheTableIsTheContract) {
  const auto edges = contract();
  int legal_edges = 0;
  for (P from : kAll) {
    for (P to : kAll) {
      const bool expected = edges.count({from, to}) == 1;
      EXPECT_EQ(legal(from, to), expected) << to_string(from) << " -> " << to_string(to);
      P phase = from;
      if (expected) {
        EXPECT_NO_THROW(transition_to(phase, to, "m")) << to_string(from) << " -> " << to_string(to);
        EXPECT_EQ(phase, to);
        ++legal_edges;
      } else {
        EXPECT_THROW(transition_to(phase, to, "m"), UsageError) << to_string(from) << " -> " << to_string(to);
        EXPECT_EQ(phase, from) << "a refused change leaves the phase as it was";
      }
    }
  }
  EXPECT_EQ(legal_edges, 33);
}

TEST(TrainerPhase, ARefusalSaysWhatToCallInstead) {
  auto refusal = [](P from, P to, const char* method) {
    return testing::usage_error_of([&] { require_legal(from, to, method); });
  };
  const std::string first = refusal(P::kConstructed, P::kTraining, "train_step");
  EXPECT_CONTAINS(first, "Trainer::train_step: it needs the weights in place: call restore() first");
  EXPECT_CONTAINS(first, "(phase Constructed -> Training is not legal)");
  EXPECT_CONTAINS(refusal(P::kTraining, P::kRestored, "restore"), "the weights are restored already; call it once");
  EXPECT_CONTAINS(refusal(P::kRestored, P::kRestored, "run"), "run() runs the whole training from the start");
  EXPECT_CONTAINS(refusal(P::kStopping, P::kTraining, "train_step"), "a rank asked to stop");
  EXPECT_CONTAINS(refusal(P::kFinished, P::kSaving, "save"), "run() finished this Trainer's run");
  EXPECT_CONTAINS(refusal(P::kFailed, P::kEvaluating, "evaluate"), "the Trainer can only be destroyed");
  EXPECT_CONTAINS(refusal(P::kEvaluating, P::kSaving, "save"), "call one at a time");
}

// A scope returns to where it began; leaving it by an exception fails the
// Trainer, and so does a forward-moving method's guard.
TEST(TrainerPhase, ScopesReturnAndFailuresStick) {
  P phase = P::kStopping;
  { PhaseScope s(phase, P::kSaving, "save"); EXPECT_EQ(phase, P::kSaving); }
  EXPECT_EQ(phase, P::kStopping);
  EXPECT_THROW(PhaseScope(phase, P::kTraining, "train_step"), UsageError);
  EXPECT_EQ(phase, P::kStopping);
  try {
    PhaseScope s(phase, P::kExporting, "export_hf");
    throw std::runtime_error("the export failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(phase, P::kFailed);

  phase = P::kTraining;
  { FailsTrainer guard(phase); }
  EXPECT_EQ(phase, P::kTraining);
  try {
    FailsTrainer guard(phase);
    throw std::runtime_error("a collective timed out");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(phase, P::kFailed);
}

}  // namespace
}  // namespace fsdp::train

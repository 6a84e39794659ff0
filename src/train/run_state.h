// The run's state beside the weights: what a checkpoint records about the run
// (trainer_state), what a resume checks against it, and the metrics file
// after a resume (Note [Metrics after a resume]).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/sharded.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/optim/lr_schedule.h"
#include "fsdp/train/options.h"
#include "train/console.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

struct RunState {
  int64_t completed = 0;     // steps done
  int64_t global_batch = 0;  // samples per step over all ranks
  double epochs = 0;         // passes over the data after `completed` steps (fractional)
  int world_size = 1;
  const optim::LrSchedule* schedule = nullptr;
  const nlohmann::json* hf_extras = nullptr;              // Note [Export extras]
  const optim::ShardedGradScaler* scaler = nullptr;       // null without loss scaling
};

// The "trainer_state" a checkpoint records (with the run's data and step options).
nlohmann::json trainer_state(const DataOptions& data, const StepOptions& step, const RunState& s);

// The check of a trainer state read back from a checkpoint (MetadataState's
// Check): MalformedState unless it is null or an object whose fields the
// trainer reads — "step", "grad_scaler", "hf_export", each when present —
// have the shape trainer_state writes. Fields only compared with the run's flags (seed,
// data, ...) may hold anything.
void check_trainer_state(const nlohmann::json& saved);

// A checkpoint `r` was loaded to resume from: checks that it holds the model
// of `cfg` (UsageError otherwise), restores the loss scaler's state (when
// `scaler`), warns through `warn` where the data order (`data`, `step`,
// `global_batch`) differs from the saved run's, logs the resume through
// `say`, and returns the checkpoint's step.
int64_t resume_from(const DataOptions& data, const StepOptions& step, const checkpoint::LoadResult& r,
                    const ModelConfig& cfg, int64_t global_batch, optim::ShardedGradScaler* scaler,
                    const LogLine& say, const LogLine& warn);

// Drops the records of steps >= first_step from the metrics file at `path`
// (Note [Metrics after a resume]); returns how many.
int64_t drop_metrics_from(const std::string& path, int64_t first_step);

}  // namespace fsdp::train

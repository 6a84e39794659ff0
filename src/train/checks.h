// The checks before a run, with the model configuration resolved once by the
// caller (train/model_build.h resolve_model_config); options.h's
// validate_options and check_memory resolve it themselves and call these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/train/options.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

// options.h's validate_options. `resolved`: the configuration, or null to
// resolve it here (where the checks come to it, after the flags that need no
// files). Returns the configuration.
ModelConfigPtr validate_options(const TrainOptions& options, int world_size, const ModelConfigPtr* resolved);

int64_t check_memory(const TrainOptions& options, int world_size, int local_world_size,
                     std::optional<c10::Device> this_rank, const ModelConfigPtr& cfg);

// StepOptions::grad_accum as a run at `world_size` takes it (at_world_size):
// from global_batch_size when that is set; UsageError when it does not divide
// or an explicit grad_accum disagrees (Note [Global batch across world sizes]).
int64_t grad_accum_at(const StepOptions& step, int world_size);

// A file rank 0 writes (--metrics-file, --profile-file): its directory exists,
// it is no directory itself, and this process may write it. `flag` names it.
void check_output_file(const std::string& path, const char* flag);

}  // namespace fsdp::train

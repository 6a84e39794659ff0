// --profile-steps: the traced steps of a run (Note [Traced steps] in profiling.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/train/options.h"
#include "train/console.h"

namespace fsdp::train {

class StepTracer {
 public:
  explicit StepTracer(const LogOptions& log) : log_(log) {}

  // Starts tracing (common/trace.h) when `step` is the first of the traced
  // ones this run reaches.
  void start_if_due(int64_t step);
  bool tracing() const { return tracing_; }
  // Whether tracing ends after the step that completed `completed` steps.
  bool due_to_finish(int64_t completed) const { return tracing_ && completed >= log_.profile_end; }

  // Collective over `group` (every rank calls it): stops tracing, gathers
  // every rank's spans to rank 0, which logs one summary line per traced
  // step and writes the merged trace to log.profile_file atomically.
  // [first, last] are the steps traced. Returns the file on rank 0, "" on
  // the others.
  std::string finish(comm::ProcessGroup& group, const std::string& model_name, int64_t first, int64_t last,
                     const LogLine& say);

 private:
  const LogOptions& log_;
  bool tracing_ = false;
};

}  // namespace fsdp::train

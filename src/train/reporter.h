// The trainer's reporter: what a run tells, on rank 0 unless said: the
// console and its log lines, the metric outputs (the Prometheus endpoint on
// any rank that serves one, the metrics file, TensorBoard, with the run's
// effective configuration beside them) and the traced steps (--profile-steps).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/options.h"
#include "fsdp/train/records.h"
#include "train/console.h"
#include "train/profiling.h"

namespace fsdp::train {

class Reporter {
 public:
  // eval_only: Mode::kEvaluate (its records say so).
  Reporter(const LogOptions& log, int rank, int world_size, bool eval_only);
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  const LogLine& say() const { return say_; }
  const LogLine& warn() const { return warn_; }
  Console& console() { return console_; }
  StepTracer& tracer() { return tracer_; }
  // Progress bars for long checkpoint I/O: rank 0, and only on a terminal.
  bool progress_bars() const { return progress_; }

  // --metrics-port (Note [Prometheus endpoint]): serves this rank's metrics
  // when it is to; collective over the runtime's CPU group (else the world's)
  // when every rank takes any free port. Returns the URL on rank 0 ("" when
  // it serves none). UsageError when the port is in use.
  std::string start_endpoint(const comm::Runtime& rt);
  // Rank 0 opens the metrics file (with `resume`, dropping the records of
  // steps >= start_step first, unless evaluating) and the TensorBoard
  // directory, each with a copy of the effective configuration.
  void open_records(int64_t start_step, bool resume);
  // One record to every output this rank has.
  void publish(MetricScope scope, const StepRecord* step, const EvalRecord* eval);

 private:
  void write_config_copy(const std::string& path, const char* flag);

  const LogOptions log_;
  const int rank_;
  const int world_size_;
  const bool eval_only_;
  // Declared before what writes through them: the console outlives the
  // outputs and the tracer, which may log while they go.
  Console console_;
  const LogLine say_;
  const LogLine warn_;
  const bool progress_;
  std::vector<std::unique_ptr<MetricSink>> sinks_;  // the endpoint (from start_endpoint), then the files (open_records)
  StepTracer tracer_;
};

}  // namespace fsdp::train

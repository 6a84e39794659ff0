// Trainer::Impl: the state of one run on this rank (trainer.h's Trainer),
// shared by trainer.cpp (construction, restore, save, export, the run) and
// step.cpp (a training step, its record, evaluation).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/data/loader.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/trainer.h"
#include "train/console.h"
#include "train/model_build.h"
#include "train/profiling.h"
#include "train/run_data.h"

namespace fsdp::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The state of one run on this rank. Members are declared in the order they
// come to exist, so that they are destroyed in reverse: the loader before the
// data, the optimizer and scaler before the groups they reduce over, the
// checkpoint directory's lock last but for the console and the metric outputs.
class Trainer::Impl {
 public:
  Impl(TrainOptions options, comm::Runtime runtime);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void restore();
  void resume_from_dcp();  // --resume from a PyTorch distributed checkpoint at the top of --checkpoint-dir
  checkpoint::DcpNames dcp_names(checkpoint::DcpLayout layout) const;  // this model's names of a DCP layout
  StepRecord train_step();
  EvalRecord evaluate(int64_t max_windows);
  std::string save();
  std::string start_save();  // run()'s save: with checkpoint.async it returns once staged
  void poll_save();          // after each step: commits a background save whose writers ended
  void finish_saves();       // waits for a save in flight and commits it
  void export_hf();
  TrainSummary run();

  int64_t step() const { return step_; }
  bool stop_requested() const { return stop_; }
  const TrainSummary& summary() const { return summary_; }

 private:
  void start_metrics_endpoint();
  void build();
  void log_plan_and_memory();
  void open_records();
  void write_config_copy(const std::string& path, const char* flag);
  void publish(MetricScope scope, const StepRecord* step, const EvalRecord* eval);
  void begin_training();
  at::Tensor forward_backward();
  void log_step(StepRecord& rec);
  void check_unsharded_contract(int64_t step, const UnshardedMemory& unsharded);
  void finish_trace();
  int agree_stop_reason();
  void report_saved(int64_t step, const checkpoint::SaveResult& r, const std::string& how, double held_s);
  void report_commit(const std::optional<checkpoint::AsyncCommit>& c);
  void require_restored(const char* method) const;

  const TrainOptions o_;
  const comm::Runtime rt_;
  const comm::ProcessGroupPtr world_;
  const int rank_;
  const int W_;
  const bool lead_;
  const bool eval_only_;  // Mode::kEvaluate
  Console console_;
  const LogLine say_;
  const LogLine warn_;
  // Progress bars for long checkpoint I/O: rank 0, and only on a terminal.
  const bool progress_;
  // Where the metrics go: the Prometheus endpoint (from the constructor on),
  // then the metrics file and TensorBoard (opened by restore()).
  std::vector<std::unique_ptr<MetricSink>> sinks_;
  const ModelConfigPtr cfg_;  // resolved once (Note [Building the model])

  // cuda:<local rank> (the NCCL world group's device) or the CPU.
  at::Device device_ = at::kCPU;
  int64_t unsharded_bound_ = 0;  // the plan's bound on the engine's unsharded buffers (Note [Unsharded memory])
  checkpoint::CheckpointDirHold checkpoint_dir_;
  RunData data_;
  BuiltModel model_;
  std::optional<checkpoint::HfImportResult> rank0_import_;  // --sync-module-states --init-from: rank 0 read the files
  FsdpOptions engine_;
  std::shared_ptr<ShardedModel> sharded_;
  double device_peak_flops_ = 0;
  double flops_per_token_ = 0;
  std::unique_ptr<optim::AdamW> opt_;
  optim::LrSchedule sched_;
  // Scalars the trainer reduces (loss, the stop flag, checkpoint agreement)
  // go through their own group, so the FSDP byte counts in the metrics are
  // the engine's alone.
  comm::ProcessGroupPtr scalars_;
  std::unique_ptr<optim::ShardedGradScaler> scaler_;  // null without loss scaling
  // checkpoint.async: the save in flight (Note [Asynchronous save]); null
  // otherwise. Its writer thread ends before the members above go.
  std::unique_ptr<checkpoint::AsyncCheckpointer> async_;
  TrainSummary summary_;
  nlohmann::json model_state_;  // the model family's checkpoint metadata (model_build.h model_state)
  // Note [Export extras]: what --export-hf adds, recorded in every checkpoint.
  nlohmann::json hf_extras_;

  bool restored_ = false;
  bool resumed_ = false;
  int64_t start_step_ = 0;  // where restore() started
  int64_t step_ = 0;        // completed steps
  int64_t saved_at_ = -1;   // the step of the newest checkpoint in checkpoint.dir of this run, -1: none
  // Checkpoint saves since the previous logged step (StepRecord::checkpoint_stall_s, _wait_s).
  double checkpoint_stall_ = 0;
  double checkpoint_wait_ = 0;
  std::unique_ptr<data::BackgroundLoader> loader_;  // from begin_training()
  // The interval since the previous logged step, which its Speed and ETA cover.
  Clock::time_point interval_start_;
  int64_t interval_steps_ = 0;
  double seconds_per_step_ = 0;  // the latest interval's mean, for the ETA
  bool contract_broken_ = false;  // warned once that the unsharded-memory bound failed
  int stop_local_ = 0;            // this rank's stop request at the last step
  bool stop_ = false;             // agreed at the last step: some rank asked to stop
  StepTracer tracer_;
};

}  // namespace fsdp::train

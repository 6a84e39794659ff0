// Trainer::Impl: one run on this rank (trainer.h's Trainer): the step loop's
// state and the three components it drives (the reporter, the data pipeline,
// the checkpointer), shared by trainer.cpp (construction, restore, save,
// export, the run) and step.cpp (a training step, its record, evaluation).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/trainer.h"
#include "train/checkpointer.h"
#include "train/data_pipeline.h"
#include "train/model_build.h"
#include "train/reporter.h"
#include "train/trainer_phase.h"

namespace fsdp::train {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Teardown follows from ownership: members go in the reverse of their
// declaration. The reporter is declared first, so its console and metric
// outputs outlive everything that logs or records; the data pipeline
// before the model (its loader thread reads only the data); the
// checkpointer after the model, optimizer and groups, so that its writer
// thread (checkpoint.async) ends, and then the checkpoint directory's lock
// goes, before the state it staged and the groups it committed over.
class Trainer::Impl {
 public:
  Impl(TrainOptions options, comm::Runtime runtime);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void restore(const char* method = "restore");
  StepRecord train_step();
  EvalRecord evaluate(int64_t max_windows);
  std::string save();
  void export_hf();
  TrainSummary run();

  int64_t step() const { return step_; }
  bool stop_requested() const { return phase_ == TrainerPhase::kStopping; }
  const TrainSummary& summary() const { return summary_; }

 private:
  void build();
  void build_optimizer();
  void log_plan_and_memory();
  void restore_weights(bool resumed);
  SaveTarget save_target();
  std::string start_save();  // run()'s save: with checkpoint.async it returns once staged
  bool run_step();           // one step of run() and what follows it; false: stop
  int64_t run_end() const;   // the step count run() stops at: step.stop_at_step, else step.max_steps
  void begin_training();
  at::Tensor forward_backward();
  void log_step(StepRecord& rec);
  void check_unsharded_contract(int64_t step, const UnshardedMemory& unsharded);
  void finish_trace();
  int agree_stop_reason();

  const TrainOptions o_;
  const comm::Runtime rt_;
  const comm::ProcessGroupPtr world_;
  const int rank_;
  const int W_;
  const bool lead_;
  const bool eval_only_;  // Mode::kEvaluate
  TrainerPhase phase_ = TrainerPhase::kConstructed;
  Reporter reporter_;
  const LogLine& say_;
  const LogLine& warn_;
  const ModelConfigPtr cfg_;  // resolved once (Note [Building the model])
  TrainSummary summary_;

  // cuda:<local rank> (the NCCL world group's device) or the CPU.
  at::Device device_ = at::kCPU;
  int64_t unsharded_bound_ = 0;  // the plan's bound on the engine's unsharded buffers (Note [Unsharded memory])
  std::optional<DataPipeline> data_;  // from build(), after checkpoint.dir is held
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
  // Emplaced first in build() (checkpoint.dir is locked before the data
  // loads), declared after what it saves: see the class's comment.
  std::optional<Checkpointer> checkpointer_;

  // The step loop.
  int64_t start_step_ = 0;  // where restore() started
  int64_t step_ = 0;        // completed steps
  // The interval since the previous logged step, which its Speed and ETA cover.
  Clock::time_point interval_start_;
  int64_t interval_steps_ = 0;
  double seconds_per_step_ = 0;  // the latest interval's mean, for the ETA
  bool contract_broken_ = false;
  bool attention_named_ = false;  // logged the kernel the first attention got  // warned once that the unsharded-memory bound failed
  int stop_local_ = 0;            // this rank's stop request at the last step
};

}  // namespace fsdp::train

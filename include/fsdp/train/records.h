// What a training run reports: one record per step, evaluation and
// checkpoint, and the summary a run returns (fsdp/train/trainer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"  // StepCounters

namespace fsdp::train {

struct EvalRecord {
  int64_t step = 0;         // completed steps when evaluated
  double loss = 0;          // mean over every target token of the windows evaluated
  int64_t targets = 0;      // target tokens evaluated (all ranks)
  double seconds = 0;       // wall time of the evaluation
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double loss_scale = 0;  // fp16: the dynamic loss scale used this step (0 otherwise)
  bool skipped = false;   // fp16: inf/nan gradients, no optimizer step
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  int64_t peak_mem_bytes = 0;  // CPU: peak resident set of the process; CUDA: caching allocator peak on the device
  // The engine's unsharded buffers: the most held at once since the previous
  // logged step (ShardedModel::unsharded_memory), and the plan's bound for it.
  int64_t unsharded_peak_bytes = 0;
  int64_t unsharded_bound_bytes = 0;
  double mfu = -1;            // model FLOPs utilization of this rank; -1 where the device's peak is not known
  int64_t skipped_steps = 0;  // fp16: steps skipped so far (the loss scaler's count)
  StepCounters comm;
  // Checkpoint saves since the previous logged step (-1: no checkpoint.dir):
  // how long they held training, of which waiting for a save in flight, and
  // the host memory staging copies hold now (checkpoint.async).
  double checkpoint_stall_s = -1;
  double checkpoint_wait_s = -1;
  int64_t checkpoint_staging_bytes = -1;
};

// One checkpoint save of a run (TrainSummary::checkpoints), as this rank saw it.
struct CheckpointRecord {
  int64_t step = 0;            // the checkpoint's step
  bool async = false;          // checkpoint.async
  bool staged = false;         // written by the writer thread while training went on (async, within the limit)
  bool committed = false;      // complete and visible
  double stall_s = 0;          // how long it held training: staging and its commit (synchronous: all of it)
  double wait_s = 0;           // how long it waited for the previous save in flight (async)
  double seconds = 0;          // from its start to its commit
  int64_t bytes = 0;           // written by all ranks (rank 0's figure; 0 on the others for DCP)
  int64_t staging_bytes = 0;   // host memory of this rank's staging buffers (async)
};

struct TrainSummary {
  std::vector<StepRecord> steps;  // every step run by this call, on every rank (loss is the global mean)
  int64_t parameters = 0;
  std::string plan;               // ShardedModel::describe()
  int64_t start_step = 0;         // first step run (the resumed checkpoint's step, else 0)
  int64_t end_step = 0;           // completed steps at the end
  std::string resumed_from;       // checkpoint path, "" when not resumed
  std::vector<EvalRecord> evals;
  int stop_reason = 0;            // non-zero: stopped early by stop_requested (its agreed value)
  std::string last_checkpoint;    // path of the last checkpoint saved by this call, "" if none
  std::vector<CheckpointRecord> checkpoints;  // every save this call started, in order
  std::string trace_file;         // rank 0: the --profile-steps trace written by this call, "" if none
  std::string metrics_url;        // rank 0: where its Prometheus metrics were served, "" if not
};

}  // namespace fsdp::train

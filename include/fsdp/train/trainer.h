// The training loop for Llama-family language models on top of fully_shard.
//
// One step, on every rank (DESIGN.md "One training step"):
//   for each of grad_accum micro-batches: forward + backward of loss/grad_accum
//   (gradient synchronization only on the last one), then clip the global
//   gradient norm, AdamW on the local shards, learning rate from the schedule.
// Rank 0 logs
//   Batch 90 Loss: 7.24291, Speed: 9.41 samples/sec, lr: 0.000010
// where Loss is the mean over the whole global batch (all ranks), Speed counts
// global samples per second over the steps since the previous log line, and
// (with a metrics file) appends one JSON object per logged step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/data/dataset.h"
#include "fsdp/fsdp.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"

namespace fsdp::train {

struct DataOptions {
  std::string path;                // required: text, JSON lines, binary tokens, or a directory of .bin shards
  std::string tokenizer = "byte";  // "byte", a SentencePiece .model, or a tiktoken BPE file
  data::DataFormat format = data::DataFormat::kAuto;
  std::string text_field = "text";
  data::TokenDtype token_dtype = data::TokenDtype::kUint16;
  int64_t seq_len = 256;           // T
  bool shuffle = true;
  int64_t prefetch = 2;            // batches the background loader prepares ahead
};

struct StepOptions {
  int64_t batch_size = 8;  // B, per rank and micro-step
  int64_t grad_accum = 1;
  int64_t max_steps = 500;
  double clip_grad = 1.0;  // 0: no clipping
  uint64_t seed = 1337;
};

struct LogOptions {
  int64_t log_every = 10;
  std::string metrics_file;  // "": none; else JSON lines appended by rank 0
  bool quiet = false;        // no log lines (tests)
};

// FSDP choices as the command line names them.
struct ShardingOptions {
  std::string strategy = "full";  // full | grad-op | none | hybrid
  std::string wrap = "block";     // block | size:N | root
  int hybrid_shard_size = 0;      // 0: LOCAL_WORLD_SIZE
  bool sync_module_states = false;
};

struct TrainOptions {
  std::string model = "tiny";  // preset name, HF config.json, or a directory holding one
  std::string device = "cpu";  // cpu | cuda
  DataOptions data;
  StepOptions step;
  optim::AdamWOptions adamw;
  optim::LrSchedule schedule;  // max_steps is taken from step.max_steps
  LogOptions log;
  ShardingOptions sharding;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  int64_t peak_mem_bytes = 0;
  StepCounters comm;
};

struct TrainSummary {
  std::vector<StepRecord> steps;  // every step, on every rank (loss is the global mean)
  int64_t parameters = 0;
  std::string plan;               // ShardedModel::describe()
};

// Cheap checks that need no process group (flags, files exist, the model
// resolves, shapes fit): run before launching workers so bad input fails
// once, fast, with exit code 2.
void validate_options(const TrainOptions& options);

// Trains on the given runtime (every rank calls it). Throws UsageError for bad
// input, Failure for runtime failures.
TrainSummary train(const TrainOptions& options, const comm::Runtime& runtime);

}  // namespace fsdp::train

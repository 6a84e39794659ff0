// The trainer's data pipeline: the run's data (run_data.h: the tokenizer,
// the training rows and their sampler, the validation data), the background
// loader that prepares the training batches, and the evaluation windows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/data/loader.h"
#include "fsdp/train/options.h"
#include "train/run_data.h"

namespace fsdp::train {

class DataPipeline {
 public:
  // Loads the data (load_run_data, which says what each argument is for)
  // for a model of `cfg` trained by `world_size` ranks, this one `rank`.
  DataPipeline(const DataOptions& data, const StepOptions& step, const EvalOptions& eval,
               const std::string& init_from, bool eval_only, const ModelConfig& cfg, int world_size, int rank,
               const LogLine& warn);
  DataPipeline(const DataPipeline&) = delete;
  DataPipeline& operator=(const DataPipeline&) = delete;

  const RunData& data() const { return data_; }
  const data::BatchSampler& sampler() const { return *data_.sampler; }
  int64_t global_batch() const { return data_.global_batch; }
  bool has_validation() const { return data_.has_validation(); }

  // Starts the background loader at `step`'s batches (the first train_step:
  // an --eval-only run reads no training batch).
  void start(int64_t step);
  // The next micro-batch. Requires: start().
  data::Batch next() { return loader_->next(); }
  void stop();
  // This rank's evaluation batches: the first max_windows windows (0: all).
  std::unique_ptr<data::EvalBatches> eval_batches(int64_t max_windows) const;

 private:
  const DataOptions o_;
  const int world_size_;
  const int rank_;
  RunData data_;
  // After the data: the loader's thread reads the sampler, so it ends first.
  std::unique_ptr<data::BackgroundLoader> loader_;
};

}  // namespace fsdp::train

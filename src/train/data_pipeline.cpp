// The trainer's data pipeline (data_pipeline.h).
#include "train/data_pipeline.h"

#include "fsdp/common/error.h"

namespace fsdp::train {

DataPipeline::DataPipeline(const DataOptions& data, const StepOptions& step, const EvalOptions& eval,
                           const std::string& init_from, bool eval_only, const ModelConfig& cfg, int world_size,
                           int rank, const LogLine& warn)
    : o_(data),
      world_size_(world_size),
      rank_(rank),
      data_(load_run_data(data, step, eval, init_from, eval_only, cfg, world_size, rank, warn)) {}

void DataPipeline::start(int64_t step) {
  FSDP_ASSERT(loader_ == nullptr, "the data loader started twice");
  data::LoaderOptions lopt;
  lopt.queue_depth = o_.prefetch;
  loader_ = std::make_unique<data::BackgroundLoader>(data_.sampler, /*start_step=*/step, lopt);
}

void DataPipeline::stop() {
  if (loader_) loader_->stop();
}

std::unique_ptr<data::EvalBatches> DataPipeline::eval_batches(int64_t max_windows) const {
  return data_.eval_batches(o_.seq_len, world_size_, rank_, max_windows);
}

}  // namespace fsdp::train

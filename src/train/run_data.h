// What a run reads: the tokenizer, the training and validation data, and
// the sampler that orders the training windows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "fsdp/data/dataset.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/train/trainer.h"
#include "train/console.h"

namespace fsdp::train {

struct RunData {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::optional<int64_t> bos;  // the tokenizer's special token ids (none: unset / empty)
  std::vector<int64_t> eos;
  std::shared_ptr<const data::TokenDataset> train;
  std::shared_ptr<const data::TokenDataset> validation;  // null without eval.val_data
  std::shared_ptr<const data::BatchSampler> sampler;
  int64_t global_batch = 0;  // G: samples per optimizer step over all ranks
};

// Loads options.data.tokenizer, the data and eval.val_data for a model of
// `cfg` trained by `world_size` ranks (this one `rank`), warning through
// `warn` when --init-from's special token ids differ from the tokenizer's.
// UsageError: a tokenizer larger than the vocabulary, token ids outside it, a
// global batch larger than an epoch of the data (training).
RunData load_run_data(const TrainOptions& options, const models::LlamaConfig& cfg, int world_size, int rank,
                      const LogLine& warn);

}  // namespace fsdp::train

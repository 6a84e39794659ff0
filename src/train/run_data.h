// What a run reads: the tokenizer, the training and validation data, and
// the sampler that orders the training rows: windows of a token stream, or
// an encoder-decoder's (input, target) pairs (the model family's DataKind).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/data/dataset.h"
#include "fsdp/data/pairs.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/train/options.h"
#include "train/console.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

struct RunData {
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::optional<int64_t> bos;  // the tokenizer's special token ids (none: unset / empty)
  std::vector<int64_t> eos;
  // Validation data, null without eval.val_data: a token stream or pairs.
  std::shared_ptr<const data::TokenDataset> validation;
  std::shared_ptr<const data::PairDataset> validation_pairs;
  std::shared_ptr<const data::BatchSampler> sampler;  // its rows(): the training data
  int64_t global_batch = 0;  // G: samples per optimizer step over all ranks
  int64_t pad_id = 0;        // the pairs' input padding

  bool has_validation() const { return validation != nullptr || validation_pairs != nullptr; }
  // This rank's evaluation batches: the first max_rows windows (or pairs; 0: all).
  std::unique_ptr<data::EvalBatches> eval_batches(int64_t seq_len, int world_size, int rank, int64_t max_rows) const;
};

// Loads data.tokenizer, the data and eval.val_data for a model of `cfg`
// trained by `world_size` ranks (this one `rank`), its sampler ordering the
// rows in batches of `step` (batch_size, grad_accum, seed), warning through
// `warn` when the special token ids of `init_from` (hf.init_from; "": none)
// differ from the tokenizer's. `eval_only` (Mode::kEvaluate): no training
// batch is read. UsageError: a tokenizer larger than the vocabulary, token
// ids outside it, a global batch larger than an epoch of the data (training).
RunData load_run_data(const DataOptions& data, const StepOptions& step, const EvalOptions& eval,
                      const std::string& init_from, bool eval_only, const ModelConfig& cfg, int world_size, int rank,
                      const LogLine& warn);

}  // namespace fsdp::train

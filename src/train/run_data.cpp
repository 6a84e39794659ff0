#include "train/run_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"

namespace fsdp::train {
namespace {

std::shared_ptr<const data::TokenDataset> load_data(const DataOptions& o, const std::string& path,
                                                    const data::Tokenizer* tokenizer) {
  data::DatasetOptions dopt;
  dopt.path = path;
  dopt.format = o.format;
  dopt.text_field = o.text_field;
  dopt.token_dtype = o.token_dtype;
  // BOS before every document where the tokenizer's own files say so (a tokenizer.json
  // template "<s> $A"); EOS after every document in any case.
  dopt.add_bos = tokenizer != nullptr && tokenizer->adds_bos();
  // Half of what is free: the model and the other ranks on this machine need the rest.
  if (const int64_t free = available_host_memory_bytes(); free > 0) dopt.memory_budget = free / 2;
  return data::load_dataset(dopt, tokenizer);
}

// "bos 1, eos 2" / "bos null, eos [128001, 128009]" for logs.
std::string token_ids_text(std::optional<int64_t> bos, const std::vector<int64_t>& eos) {
  const std::string e = eos.empty()       ? std::string("null")
                        : eos.size() == 1 ? std::to_string(eos[0])
                                          : fmt::format("[{}]", fmt::join(eos, ", "));
  return fmt::format("bos {}, eos {}", bos ? std::to_string(*bos) : std::string("null"), e);
}

// With --init-from, the special token ids of its config.json (which --export-hf
// keeps) may name other tokens than the tokenizer's (which training uses).
void warn_about_token_ids(const std::string& tokenizer, const std::string& init_from, const ModelConfig& cfg,
                          const RunData& d, const LogLine& warn) {
  const std::optional<int64_t> bos = cfg.bos_token_id();
  const std::vector<int64_t> eos = cfg.eos_token_id();
  if (init_from.empty() || (!bos.has_value() && eos.empty())) return;
  const bool bos_differs = bos && d.bos && *bos != *d.bos;
  const bool eos_differs = !eos.empty() && !d.eos.empty() && std::find(eos.begin(), eos.end(), d.eos[0]) == eos.end();
  if (bos_differs || eos_differs) {
    warn(fmt::format("DataOptions::tokenizer {} uses {} but {}/config.json says {}; training uses the tokenizer's ids, "
                     "HfOptions::export_dir keeps the config's (they belong to the weights' vocabulary)",
                     tokenizer, token_ids_text(d.bos, d.eos), init_from,
                     token_ids_text(bos, eos)));
  }
}

// Pairs for an encoder-decoder (DataKind::kPairs), cut to --seq-len / --target-len.
std::shared_ptr<const data::PairDataset> load_pairs(const DataOptions& o, const std::string& path,
                                                     const data::Tokenizer& tokenizer, int64_t pad_id) {
  data::PairOptions po;
  po.path = path;
  po.input_field = o.input_field;
  po.target_field = o.target_field;
  po.input_len = o.seq_len;
  po.target_len = o.target_len > 0 ? o.target_len : o.seq_len;
  po.pad_id = pad_id;
  if (const int64_t free = available_host_memory_bytes(); free > 0) po.memory_budget = free / 2;
  return data::load_pairs(po, tokenizer);
}

}  // namespace

std::unique_ptr<data::EvalBatches> RunData::eval_batches(int64_t seq_len, int world_size, int rank,
                                                         int64_t max_rows) const {
  if (validation_pairs) {
    return std::make_unique<data::EvalRows>(validation_pairs, world_size, rank, max_rows, pad_id);
  }
  FSDP_CHECK(validation != nullptr, "Trainer::evaluate needs eval.val_data (EvalOptions::val_data PATH)");
  return std::make_unique<data::EvalWindows>(validation, seq_len, world_size, rank, max_rows);
}

RunData load_run_data(const DataOptions& data, const StepOptions& step, const EvalOptions& eval,
                      const std::string& init_from, bool eval_only, const ModelConfig& cfg, int world_size, int rank,
                      const LogLine& warn) {
  RunData d;
  d.tokenizer = data::make_tokenizer(data.tokenizer);
  FSDP_CHECK(d.tokenizer->vocab_size() <= cfg.vocab_size(), "tokenizer ", d.tokenizer->name(), " has ",
             d.tokenizer->vocab_size(), " tokens but model '", cfg.name(), "' has vocab_size ", cfg.vocab_size(),
             "; choose a model with a large enough vocabulary or another tokenizer");
  if (d.tokenizer->bos_id() >= 0) d.bos = d.tokenizer->bos_id();
  if (d.tokenizer->eos_id() >= 0) d.eos = {d.tokenizer->eos_id()};
  warn_about_token_ids(data.tokenizer, init_from, cfg, d, warn);
  std::shared_ptr<const data::RowSource> rows;
  if (cfg.data_kind() == DataKind::kPairs) {
    d.pad_id = cfg.pad_token_id();
    auto train = load_pairs(data, data.path, *d.tokenizer, d.pad_id);
    train->validate(cfg.vocab_size());
    rows = train;
    if (!eval.val_data.empty()) {
      d.validation_pairs = load_pairs(data, eval.val_data, *d.tokenizer, d.pad_id);
      d.validation_pairs->validate(cfg.vocab_size());
    }
  } else {
    auto train = load_data(data, data.path, d.tokenizer.get());
    train->validate(cfg.vocab_size());
    rows = data::token_windows(train, data.seq_len);
    if (!eval.val_data.empty()) {
      d.validation = load_data(data, eval.val_data, d.tokenizer.get());
      d.validation->validate(cfg.vocab_size());
    }
  }

  data::SamplerOptions sopt;
  sopt.seq_len = data.seq_len;
  sopt.batch_size = step.batch_size;
  sopt.world_size = world_size;
  sopt.rank = rank;
  sopt.grad_accum = step.grad_accum;
  sopt.seed = step.seed;
  sopt.shuffle = data.shuffle;
  d.sampler = std::make_shared<const data::BatchSampler>(rows, sopt);
  d.global_batch = d.sampler->global_batch_size();
  // One optimizer step reads each window at most once: a global batch past the
  // epoch (a slip of --grad-accum) would repeat the data inside every step and
  // could run for years.
  FSDP_CHECK(eval_only || d.global_batch <= d.sampler->samples_per_epoch(),
             "one optimizer step reads StepOptions::batch_size ", step.batch_size, " x StepOptions::grad_accum ",
             step.grad_accum, " x ", world_size, " ranks = ", d.global_batch, " windows, but DataOptions::path ",
             data.path, " holds only ", d.sampler->samples_per_epoch(), " windows of DataOptions::seq_len ",
             data.seq_len, " per epoch — lower StepOptions::grad_accum or StepOptions::batch_size (or "
             "DataOptions::seq_len), or give more data");
  return d;
}

}  // namespace fsdp::train

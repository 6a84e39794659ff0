#include "train/run_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"

namespace fsdp::train {
namespace {

std::shared_ptr<const data::TokenDataset> load_data(const TrainOptions& o, const std::string& path,
                                                    const data::Tokenizer* tokenizer) {
  data::DatasetOptions dopt;
  dopt.path = path;
  dopt.format = o.data.format;
  dopt.text_field = o.data.text_field;
  dopt.token_dtype = o.data.token_dtype;
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
void warn_about_token_ids(const TrainOptions& o, const models::LlamaConfig& cfg, const RunData& d,
                          const LogLine& warn) {
  if (o.hf.init_from.empty() || (!cfg.bos_token_id.has_value() && cfg.eos_token_id.empty())) return;
  const bool bos_differs = cfg.bos_token_id && d.bos && *cfg.bos_token_id != *d.bos;
  const bool eos_differs = !cfg.eos_token_id.empty() && !d.eos.empty() &&
                           std::find(cfg.eos_token_id.begin(), cfg.eos_token_id.end(), d.eos[0]) ==
                               cfg.eos_token_id.end();
  if (bos_differs || eos_differs) {
    warn(fmt::format("--tokenizer {} uses {} but {}/config.json says {}; training uses the tokenizer's ids, "
                     "--export-hf keeps the config's (they belong to the weights' vocabulary)",
                     o.data.tokenizer, token_ids_text(d.bos, d.eos), o.hf.init_from,
                     token_ids_text(cfg.bos_token_id, cfg.eos_token_id)));
  }
}

}  // namespace

RunData load_run_data(const TrainOptions& o, const models::LlamaConfig& cfg, int world_size, int rank,
                      const LogLine& warn) {
  RunData d;
  d.tokenizer = data::make_tokenizer(o.data.tokenizer);
  FSDP_CHECK(d.tokenizer->vocab_size() <= cfg.vocab_size, "tokenizer ", d.tokenizer->name(), " has ",
             d.tokenizer->vocab_size(), " tokens but model '", cfg.name, "' has vocab_size ", cfg.vocab_size,
             "; choose a model with a large enough vocabulary or another tokenizer");
  if (d.tokenizer->bos_id() >= 0) d.bos = d.tokenizer->bos_id();
  if (d.tokenizer->eos_id() >= 0) d.eos = {d.tokenizer->eos_id()};
  warn_about_token_ids(o, cfg, d, warn);
  d.train = load_data(o, o.data.path, d.tokenizer.get());
  d.train->validate(cfg.vocab_size);
  if (!o.eval.val_data.empty()) {
    d.validation = load_data(o, o.eval.val_data, d.tokenizer.get());
    d.validation->validate(cfg.vocab_size);
  }

  data::SamplerOptions sopt;
  sopt.seq_len = o.data.seq_len;
  sopt.batch_size = o.step.batch_size;
  sopt.world_size = world_size;
  sopt.rank = rank;
  sopt.grad_accum = o.step.grad_accum;
  sopt.seed = o.step.seed;
  sopt.shuffle = o.data.shuffle;
  d.sampler = std::make_shared<const data::BatchSampler>(d.train, sopt);
  d.global_batch = d.sampler->global_batch_size();
  // One optimizer step reads each window at most once: a global batch past the
  // epoch (a slip of --grad-accum) would repeat the data inside every step and
  // could run for years.
  FSDP_CHECK(o.mode == Mode::kEvaluate || d.global_batch <= d.sampler->samples_per_epoch(),
             "one optimizer step reads --batch-size ", o.step.batch_size, " x --grad-accum ", o.step.grad_accum,
             " x ", world_size, " ranks = ", d.global_batch, " windows, but --data ", o.data.path, " holds only ",
             d.sampler->samples_per_epoch(), " windows of --seq-len ", o.data.seq_len,
             " per epoch — lower --grad-accum or --batch-size (or --seq-len), or give more data");
  return d;
}

}  // namespace fsdp::train

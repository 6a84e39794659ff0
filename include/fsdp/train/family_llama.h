// The Llama family's configuration behind the ModelConfig seam, for the few
// places that handle a Llama config themselves (tests, fsdp-inspect's Llama-only
// notes and --calibrate).
#pragma once

#include "fsdp/models/llama_config.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

// A ModelConfig of the Llama family for `cfg` (validated by its users).
ModelConfigPtr llama_model_config(const models::LlamaConfig& cfg);
// The LlamaConfig of a Llama-family config; null for another family.
const models::LlamaConfig* as_llama(const ModelConfig& cfg);
// What Hugging Face export and import need of a Llama-family model:
// hf_model_info(*llama_model_config(cfg)).
checkpoint::HfModelInfo llama_hf_info(const models::LlamaConfig& cfg);
// torchtitan's Llama names (Note [DCP keys]); q/k rows in Meta's
// interleaved-rotary order for `heads` and `kv_heads` heads. UsageError for a
// parameter torchtitan's Llama does not have (a bias, a q/k norm).
checkpoint::DcpNames torchtitan_llama_names(int64_t heads, int64_t kv_heads);

}  // namespace fsdp::train

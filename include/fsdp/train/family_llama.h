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

}  // namespace fsdp::train

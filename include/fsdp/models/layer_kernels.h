// Which implementation of the layers' elementwise work and of the loss a model
// runs (fsdp-train --kernels). Apart from layers.h so that what only names the
// choice — the chunked loss and its memory count (chunked_loss.h) — needs no
// torch::nn.
#pragma once

#include <optional>
#include <string>

namespace fsdp::models {

enum class LayerKernels {
  kReference,  // Hugging Face's operations one by one: the reference
  kFused,      // one kernel where LibTorch has one (RMSNorm: at::_fused_rms_norm), else
               // our own (SwiGLU, rotary: models/kernels.h); the loss's gradient written
               // over its logits (Note [Fused cross-entropy] in src/models/chunked_loss.cpp)
};
const char* to_string(LayerKernels kernels);  // "reference" | "fused"
// nullopt for any other name.
std::optional<LayerKernels> parse_layer_kernels(const std::string& name);

}  // namespace fsdp::models

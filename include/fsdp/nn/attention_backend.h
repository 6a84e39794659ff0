// Which of LibTorch's attention kernels scaled_dot_product_attention prefers
// (fsdp-train --attention-backend; Note [Attention backend] in
// src/nn/attention_backend.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace fsdp::nn {

enum class AttentionBackend {
  kFlash,  // LibTorch's own order: flash, memory-efficient, math, cuDNN (what PyTorch users run)
  kCudnn,  // cuDNN first, then flash, memory-efficient, math
};
const char* to_string(AttentionBackend backend);  // "flash" | "cudnn"
// nullopt for any other name.
std::optional<AttentionBackend> parse_attention_backend(const std::string& name);

// Sets LibTorch's SDPA priority order for this process (a process-wide
// setting of LibTorch's context: every later attention follows it). A kernel
// that cannot take a call (its shape, dtype, mask or device) passes it to the
// next in the order, so kCudnn falls back to flash. The CPU has flash and
// math kernels only and ignores the order: both run the CPU's flash kernel.
void set_attention_backend(AttentionBackend backend);

// The kernel SDPA picked for this process's first causal attention
// (nn::causal_attention): "flash_attention", "cudnn_attention",
// "efficient_attention", "math", ...; empty before the first.
std::string first_attention_kernel();

// Records the kernel SDPA picks for these arguments (causal, no mask, no
// dropout, default scale) if none is recorded yet; nn::causal_attention calls
// it. Only the first call looks: later ones cost an atomic load.
void note_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa);

}  // namespace fsdp::nn

#include "fsdp/nn/attention_backend.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::nn {

// Note [Attention backend]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch 2.11 tries SDPA's CUDA kernels in the order flash,
// memory-efficient, math, cuDNN: cuDNN's attention, which on Hopper can be
// the faster of the fused kernels at long sequences, runs only when the
// others refuse a call. --attention-backend cudnn puts it first and keeps
// flash as the fallback; flash (the default) leaves LibTorch's order alone,
// the one the FSDP2 peer runs with. Which is faster is the GPU call's to
// measure (one row each); the run logs the kernel the first attention got,
// so a row says what it ran. The order is LibTorch's process-wide setting,
// which is why this is a process option and not a layer's.

const char* to_string(AttentionBackend backend) { return backend == AttentionBackend::kCudnn ? "cudnn" : "flash"; }

std::optional<AttentionBackend> parse_attention_backend(const std::string& name) {
  if (name == "flash") return AttentionBackend::kFlash;
  if (name == "cudnn") return AttentionBackend::kCudnn;
  return std::nullopt;
}

void set_attention_backend(AttentionBackend backend) {
  using B = at::SDPBackend;
  const std::vector<B> order = backend == AttentionBackend::kCudnn
      ? std::vector<B>{B::cudnn_attention, B::flash_attention, B::efficient_attention, B::math, B::overrideable}
      : std::vector<B>{B::flash_attention, B::efficient_attention, B::math, B::cudnn_attention, B::overrideable};
  std::vector<int64_t> codes;
  for (B b : order) codes.push_back(static_cast<int64_t>(b));
  at::globalContext().setSDPPriorityOrder(codes);
}

namespace {

constexpr int64_t kNone = -100;  // no attention ran yet (SDPBackend's codes are >= -1)
std::atomic<int64_t> g_first{kNone};

const char* kernel_name(int64_t code) {
  switch (static_cast<at::SDPBackend>(code)) {
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::flash_attention: return "flash_attention";
    case at::SDPBackend::efficient_attention: return "efficient_attention";
    case at::SDPBackend::cudnn_attention: return "cudnn_attention";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none (SDPA refused every kernel)";
  }
}

}  // namespace

void note_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa) {
  if (g_first.load(std::memory_order_relaxed) != kNone) return;
  if (!q.is_cpu() && !q.is_cuda()) return;  // SDPA's choice is a CPU and CUDA operator (not the meta device's)
  const int64_t code = at::_fused_sdp_choice(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                             /*scale=*/std::nullopt, enable_gqa);
  int64_t expected = kNone;
  g_first.compare_exchange_strong(expected, code);
}

std::string first_attention_kernel() {
  const int64_t code = g_first.load();
  return code == kNone ? std::string() : std::string(kernel_name(code));
}

}  // namespace fsdp::nn

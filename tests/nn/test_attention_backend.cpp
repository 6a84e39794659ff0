// --attention-backend (Note [Attention backend] in src/nn/attention_backend.cpp):
// the order it gives LibTorch's SDPA, and the CPU, which has no cuDNN, running
// its flash kernel under either order.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "fsdp/nn/attention_backend.h"
#include "fsdp/nn/recompute.h"

namespace fsdp::nn {
namespace {

TEST(AttentionBackend, NamesRoundTrip) {
  for (AttentionBackend b : {AttentionBackend::kFlash, AttentionBackend::kCudnn}) {
    EXPECT_EQ(parse_attention_backend(to_string(b)), b);
  }
  EXPECT_FALSE(parse_attention_backend("cuDNN").has_value());
  EXPECT_FALSE(parse_attention_backend("").has_value());
}

TEST(AttentionBackend, SetsLibTorchsPriorityOrder) {
  using B = at::SDPBackend;
  set_attention_backend(AttentionBackend::kCudnn);
  auto order = at::globalContext().sDPPriorityOrder();
  EXPECT_EQ(order[0], B::cudnn_attention);
  EXPECT_EQ(order[1], B::flash_attention);  // the fallback
  set_attention_backend(AttentionBackend::kFlash);
  order = at::globalContext().sDPPriorityOrder();
  // LibTorch 2.11's own order, which the FSDP2 peer runs with.
  const std::array<B, at::num_sdp_backends> libtorch{B::flash_attention, B::efficient_attention, B::math,
                                                     B::cudnn_attention, B::overrideable};
  EXPECT_EQ(order, libtorch);
}

TEST(AttentionBackend, TheCpuRunsItsFlashKernelUnderEitherOrder) {
  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 4, 16, 8}), k = at::randn({2, 2, 16, 8}), v = at::randn({2, 2, 16, 8});
  EXPECT_EQ(first_attention_kernel(), "");
  set_attention_backend(AttentionBackend::kCudnn);
  const at::Tensor under_cudnn = causal_attention(q, k, v, /*enable_gqa=*/true);
  EXPECT_EQ(first_attention_kernel(), "flash_attention");
  set_attention_backend(AttentionBackend::kFlash);
  const at::Tensor under_flash = causal_attention(q, k, v, /*enable_gqa=*/true);
  EXPECT_TRUE(at::equal(under_cudnn, under_flash));
  EXPECT_EQ(first_attention_kernel(), "flash_attention");
}

}  // namespace
}  // namespace fsdp::nn

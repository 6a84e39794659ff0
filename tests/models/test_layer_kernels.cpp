// --kernels fused (models::LayerKernels) against the reference. The fused
// RMSNorm (at::_fused_rms_norm: LibTorch's composite of the same arithmetic on
// the CPU, its own kernel on CUDA) rounds its bf16 output once where
// Hugging Face's rounds twice: fp32 outputs and gradients equal the
// reference's bit for bit, bf16 within one bf16 ulp of the largest (2^-7 of
// it). The fused SwiGLU (models::fused_swiglu: its CPU twin here, the same
// functor the jiterator compiles on CUDA) computes silu(g) * u and its two
// gradients in fp32 and rounds once: fp32 within 4 fp32 ulps of the largest
// value, bf16 within one bf16 ulp. The fused rotary (models::fused_rotary, the
// same way: Note [Rotary as one elementwise kernel]) and its gradient, on the
// attention's strided view of a projection, are Hugging Face's rotary within
// 1e-6 of the largest value in fp32 and one bf16 ulp in bf16, in the
// reference's layout. A tiny Llama trained 20 steps keeps every step's loss
// within 1e-6 relative in fp32 and 1% in bf16.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <iostream>

#include "fsdp/models/kernels.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/llama.h"
#include "chain_training.h"
#include "models_test_util.h"
#include "support/tiny_llama.h"

namespace fsdp::models {
namespace {

TEST(LayerKernels, FusedRmsNormIsTheReferenceInFp32AndOneRoundingInBf16) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    RMSNorm reference(64, 1e-5, at::TensorOptions().dtype(dtype));
    RMSNorm fused(64, 1e-5, at::TensorOptions().dtype(dtype));
    {
      at::NoGradGuard no_grad;
      const at::Tensor w = at::randn({64}, gen).to(dtype);
      reference->weight().copy_(w);
      fused->weight().copy_(w);
    }
    EXPECT_EQ(set_layer_kernels(*fused, LayerKernels::kFused), 1);
    const at::Tensor x0 = (at::randn({3, 5, 64}, gen) * 3).to(dtype);
    const at::Tensor g = at::randn({3, 5, 64}, gen).to(dtype);
    const at::Tensor x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
    const at::Tensor y1 = reference(x1), y2 = fused(x2);
    const auto g1 = torch::autograd::grad({y1}, {x1, reference->weight()}, {g});
    const auto g2 = torch::autograd::grad({y2}, {x2, fused->weight()}, {g});
    if (dtype == at::kFloat) {
      EXPECT_TRUE(y1.equal(y2)) << (y1 - y2).abs().max().item<double>();
      EXPECT_TRUE(g1[0].equal(g2[0])) << (g1[0] - g2[0]).abs().max().item<double>();
      EXPECT_TRUE(g1[1].equal(g2[1])) << (g1[1] - g2[1]).abs().max().item<double>();
    } else {
      const double scale = y1.abs().max().item<double>();
      const double diff = (y1.to(at::kFloat) - y2.to(at::kFloat)).abs().max().item<double>();
      EXPECT_LE(diff, scale * std::pow(2.0, -7)) << "fused against reference, largest |y| " << scale;
      EXPECT_FALSE(y1.equal(y2)) << "bf16: the fused norm rounds once, HF's twice: some values differ";
    }
  }
}

TEST(LayerKernels, FusedSwigluAndItsGradientsAreTheReferencesToRounding) {
  at::Generator gen = at::detail::createCPUGenerator(9);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor g0 = (at::randn({4, 7, 96}, gen) * 4).to(dtype), u0 = at::randn({4, 7, 96}, gen).to(dtype);
    const at::Tensor dout = at::randn({4, 7, 96}, gen).to(dtype);
    const at::Tensor g1 = g0.clone().requires_grad_(true), u1 = u0.clone().requires_grad_(true);
    const at::Tensor g2 = g0.clone().requires_grad_(true), u2 = u0.clone().requires_grad_(true);
    const at::Tensor ref = at::silu(g1) * u1, fused = fused_swiglu(g2, u2);
    const auto gr = torch::autograd::grad({ref}, {g1, u1}, {dout});
    const auto gf = torch::autograd::grad({fused}, {g2, u2}, {dout});
    // fp32: a few ulps (sigmoid and exp are computed in another order); bf16: one rounding.
    const double rel = dtype == at::kFloat ? 4 * std::pow(2.0, -23) : std::pow(2.0, -7);
    const std::pair<const char*, std::pair<at::Tensor, at::Tensor>> pairs[] = {
        {"output", {ref, fused}}, {"gate's gradient", {gr[0], gf[0]}}, {"up's gradient", {gr[1], gf[1]}}};
    for (const auto& [what, p] : pairs) {
      const double scale = p.first.abs().max().item<double>();
      const double diff = (p.first.to(at::kFloat) - p.second.to(at::kFloat)).abs().max().item<double>();
      EXPECT_LE(diff, rel * scale) << what << ": largest |value| " << scale;
      EXPECT_EQ(p.second.scalar_type(), dtype) << what;
    }
  }
}

// Hugging Face's apply_rotary_pos_emb on one tensor, op by op.
at::Tensor reference_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1) * sin;
}

TEST(LayerKernels, FusedRotaryAndItsGradientAreTheReferencesToRounding) {
  at::Generator gen = at::detail::createCPUGenerator(11);
  constexpr int64_t B = 2, T = 9, H = 3, Dh = 32;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // Tables whose halves differ (the model's repeat theirs): a kernel that
    // read the wrong half's cos or sin would pass on the model's tables.
    const at::Tensor cos = at::rand({T, Dh}, gen).mul(2).sub(1).to(dtype);
    const at::Tensor sin = at::rand({T, Dh}, gen).mul(2).sub(1).to(dtype);
    // The attention's q: the projection's (B, T, H, Dh) seen as (B, H, T, Dh);
    // and a contiguous (B, H, T, Dh).
    for (bool projection : {true, false}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (projection ? ", projection's view" : ", contiguous"));
      const at::Tensor x0 = (projection ? at::randn({B, T, H, Dh}, gen).transpose(1, 2)
                                        : at::randn({B, H, T, Dh}, gen)) * 3;
      const at::Tensor dout0 = at::randn({B, T, H, Dh}, gen).transpose(1, 2);  // as SDPA's backward lays it out
      const at::Tensor base1 = x0.to(dtype).detach().requires_grad_(true);
      const at::Tensor base2 = x0.to(dtype).detach().requires_grad_(true);
      const at::Tensor x1 = base1 * 1, x2 = base2 * 1;  // non-leaves: their own gradients, not accumulated ones
      const at::Tensor dout = dout0.to(dtype);
      const at::Tensor ref = reference_rotary(x1, cos, sin), fused = fused_rotary(x2, cos, sin);
      const at::Tensor gr = torch::autograd::grad({ref}, {x1}, {dout})[0];
      const at::Tensor gf = torch::autograd::grad({fused}, {x2}, {dout})[0];
      const double rel = dtype == at::kFloat ? 1e-6 : std::pow(2.0, -7);
      const std::pair<const char*, std::pair<at::Tensor, at::Tensor>> pairs[] = {{"output", {ref, fused}},
                                                                                  {"gradient", {gr, gf}}};
      for (const auto& [what, p] : pairs) {
        const double scale = p.first.abs().max().item<double>();
        const double diff = (p.first.to(at::kFloat) - p.second.to(at::kFloat)).abs().max().item<double>();
        EXPECT_LE(diff, rel * scale) << what << ": largest |value| " << scale;
        EXPECT_EQ(p.second.scalar_type(), dtype) << what;
        EXPECT_EQ(p.second.sizes(), p.first.sizes()) << what;
        std::cout << "[kernels] rotary " << c10::toString(dtype) << (projection ? " projection " : " contiguous ")
                  << what << ": largest difference " << diff << " of " << scale << "\n";
      }
      // The layouts: the output as the reference's (what SDPA is given), the
      // gradient as dout (back into the projection's layout without a copy).
      EXPECT_EQ(fused.strides(), ref.strides());
      EXPECT_EQ(gf.strides(), dout.strides());
    }
  }
}

LlamaConfig tiny() { return testing::chain_llama("kernels-llama"); }

// 20 steps of AdamW on the whole (unsharded) model, its parameters in `dtype`
// (bf16: pure bf16 training); the losses. At lr 1e-2 pure bf16's trajectories
// part by up to 7% between any two roundings of the same step, fused or not:
// 3e-3 learns the chain and keeps them comparable.
std::vector<double> train(LayerKernels kernels, at::ScalarType dtype) {
  const LlamaConfig cfg = tiny();
  auto model = std::make_shared<LlamaForCausalLMImpl>(cfg, at::TensorOptions().dtype(dtype), /*seed=*/3);
  // Two norms, the attention and the MLP per layer, the final norm and the loss.
  EXPECT_EQ(set_layer_kernels(*model, kernels), 4 * cfg.num_hidden_layers + 2);
  return testing::train_on_chain(*model, 20, /*order=*/1, /*first_seed=*/100);
}

TEST(LayerKernels, FusedTrainsATinyLlamaAsTheReference) {
  // One thread: a tiny model's kernels gain nothing from more, and OpenMP's
  // spinning on a loaded machine made this test take 5-30 s instead of 1.
  at::set_num_threads(1);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const std::vector<double> ref = train(LayerKernels::kReference, dtype);
    const std::vector<double> fused = train(LayerKernels::kFused, dtype);
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double rel = std::abs(fused[i] - ref[i]) / std::abs(ref[i]);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, tol) << "step " << i << ": fused " << fused[i] << ", reference " << ref[i];
    }
    std::cout << "[kernels] " << c10::toString(dtype) << ": loss " << ref.front() << " -> " << ref.back()
              << ", worst relative difference of fused over 20 steps " << worst << "\n";
    EXPECT_LT(ref.back(), ref.front() * 0.8) << "the reference should learn the chain";
  }
}

TEST(LayerKernels, NamesParseAndOthersAreRefused) {
  EXPECT_EQ(parse_layer_kernels("reference"), LayerKernels::kReference);
  EXPECT_EQ(parse_layer_kernels("fused"), LayerKernels::kFused);
  EXPECT_FALSE(parse_layer_kernels("fast").has_value());
  EXPECT_STREQ(to_string(LayerKernels::kFused), "fused");
}

}  // namespace
}  // namespace fsdp::models

// The row kernels' CPU twins (Note [Row kernels] in src/models/row_kernels.cpp)
// against LibTorch: the e4m3 and bf16 roundings against c10's conversions
// over sweeps of fp32 values, the quantizer against the composite it replaces
// bit for bit, the online-softmax cross-entropy against log-softmax and its
// gradient. The CUDA launch of the same arithmetic awaits a GPU call; CI
// compiles its program for sm_90 (test_kernels_nvrtc.cpp).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fsdp/models/fp8.h"
#include "fsdp/models/row_kernels.h"

namespace fsdp::models {
namespace {

float from_bits(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Every 61st fp32 bit pattern (70 million: every exponent, both signs, NaN
// and infinity among them), and every pattern near e4m3's and bf16's rounding
// boundaries of the values e4m3 represents (all low bits of [2^-10, 512)).
std::vector<uint32_t> sweep() {
  std::vector<uint32_t> out;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 61) out.push_back(static_cast<uint32_t>(u));
  for (uint32_t e = 117; e <= 135; ++e) {
    for (uint32_t m = 0; m < (1u << 23); m += 97) {
      out.push_back((e << 23) | m);
      out.push_back(0x80000000u | (e << 23) | m);
    }
  }
  for (uint32_t m = 0; m < 64; ++m) out.push_back((130u << 23) | (m << 17));  // ties around 8..16 at e4m3's step
  return out;
}

TEST(RowKernels, E4m3RoundingIsC10s) {
  int64_t checked = 0, mismatches = 0;
  for (const uint32_t u : sweep()) {
    const float f = from_bits(u);
    const uint8_t want = c10::Float8_e4m3fn(f).x;
    const uint8_t got = row_kernels_e4m3_bits(f);
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << std::hexfloat << f << ": " << int(got) << " vs c10 " << int(want);
    }
    ++checked;
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_GT(checked, int64_t{70} << 20);
  // Ties to the even mantissa: e4m3's step in [8, 16) is 1, so 8.5 goes to 8 and 9.5 to 10.
  EXPECT_EQ(row_kernels_e4m3_bits(8.5f), c10::Float8_e4m3fn(8.0f).x);
  EXPECT_EQ(row_kernels_e4m3_bits(9.5f), c10::Float8_e4m3fn(10.0f).x);
  EXPECT_EQ(row_kernels_e4m3_bits(448.0f), 0x7E);
  EXPECT_EQ(row_kernels_e4m3_bits(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(RowKernels, Bf16RoundingIsC10s) {
  int64_t mismatches = 0;
  for (const uint32_t u : sweep()) {
    const float f = from_bits(u);
    const uint16_t want = c10::BFloat16(f).x;
    const uint16_t got = row_kernels_bf16_bits(f);
    if (got != want && ++mismatches <= 5) ADD_FAILURE() << std::hexfloat << f << ": " << got << " vs c10 " << want;
  }
  EXPECT_EQ(mismatches, 0);
}

// models::quantize_rowwise's composite, spelled out (fp8.cpp takes the kernel
// for fp32 and bf16 now).
std::pair<at::Tensor, at::Tensor> composite_quantize(const at::Tensor& x) {
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  const at::Tensor amax = x32.abs().amax(1, true).clamp_min(kFp8AmaxEps);
  const at::Tensor scale = at::reciprocal(amax).mul_(kE4m3Max);
  return {(x32 * scale).clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn), at::reciprocal(scale)};
}

// The same bits, except that a NaN may carry another sign (LibTorch's abs
// keeps a NaN's sign bit, the kernel's fabsf clears it): NaN where the other
// is NaN, and every other element's bits equal.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor nan = a.to(at::kFloat).isnan();
  if (!at::equal(nan, b.to(at::kFloat).isnan())) return false;
  const auto bits = [&](const at::Tensor& t) {
    return (t.scalar_type() == at::kFloat ? t.view(at::kInt) : t.view(at::kByte)).masked_fill(nan, 0);
  };
  return at::equal(bits(a), bits(b));
}

TEST(RowKernels, QuantizerIsTheCompositeBitForBit) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (const int64_t K : {1, 7, 256, 1000, 4099}) {
    at::Tensor x = at::randn({6, K}, gen) * at::exp(at::randn({6, 1}, gen) * 4);  // rows of scales e^-12..e^12
    x[1].zero_();                                                               // amax clamped to 1e-12
    x[2] *= 1e-30;                                                              // e4m3's subnormals after scaling
    if (K > 3) x[3][K / 2] = 1e4;                                               // one outlier
    if (K > 4) x[4][K - 1] = std::numeric_limits<float>::quiet_NaN();           // the row is NaN
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string("K ") + std::to_string(K) + (dtype == at::kFloat ? " fp32" : " bf16"));
      const at::Tensor in = x.to(dtype);
      ASSERT_TRUE(row_kernels_take(in));
      const auto [data, inv] = quantize_rows_e4m3(in);
      const auto [want_data, want_inv] = composite_quantize(in);
      EXPECT_TRUE(same_bits(data, want_data));
      EXPECT_TRUE(same_bits(inv, want_inv));
      // And the library's entry point takes the kernel (a transposed view is made contiguous first).
      const Fp8Rows q = quantize_rowwise(in.t().contiguous().t());
      EXPECT_TRUE(same_bits(q.data, want_data));
    }
  }
  // A zero row's scale comes from the floor on amax; a row with a NaN is NaN.
  const auto [data, inv] = quantize_rows_e4m3(at::tensor({0.0f, 0.0f, 1.0f, std::nanf("")}).view({2, 2}));
  const float zero_row_scale = (1.0f / 1e-12f) * 448.0f;
  EXPECT_EQ(inv[0][0].item<float>(), 1.0f / zero_row_scale);
  EXPECT_TRUE(std::isnan(inv[1][0].item<float>()));
  EXPECT_EQ(static_cast<const uint8_t*>(data.const_data_ptr())[0], 0);
}

// -log softmax(x)[t] and (softmax(x) - onehot(t)) x scale in fp64, the reference.
std::pair<at::Tensor, at::Tensor> reference_ce(const at::Tensor& logits, const at::Tensor& target,
                                               const at::Tensor& scale) {
  const at::Tensor x = logits.to(at::kDouble);
  const at::Tensor logp = at::log_softmax(x, 1);
  const at::Tensor nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1);
  at::Tensor grad = logp.exp();
  grad.scatter_add_(1, target.unsqueeze(1), at::full({x.size(0), 1}, -1.0, x.options()));
  return {nll, grad * scale.to(at::kDouble).unsqueeze(1)};
}

TEST(RowKernels, OnlineSoftmaxCrossEntropyIsLogSoftmaxAndItsGradient) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  for (const int64_t V : {1, 7, 1024, 5000}) {
    const int64_t c = 5;
    // Logits of spread 8 around offsets up to +-1e4 (the running maximum is rescaled many times).
    at::Tensor x = at::randn({c, V}, gen) * 8 + (at::randn({c, 1}, gen) * 1e4);
    x[0] = at::arange(V, at::kFloat);  // increasing: every element raises the maximum
    const at::Tensor target = at::randint(V, {c}, gen, at::kLong);
    const at::Tensor scale = at::rand({c}, gen);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(std::string("V ") + std::to_string(V) + (dtype == at::kFloat ? " fp32" : " bf16"));
      at::Tensor logits = x.to(dtype);
      const auto [ref_nll, ref_grad] = reference_ce(logits, target, scale);  // of the rounded logits
      at::Tensor untouched = logits.clone();
      const at::Tensor nll_only = online_softmax_cross_entropy(untouched, target, at::Tensor());
      EXPECT_TRUE(at::equal(untouched, logits)) << "no scale: the logits are left as they are";
      const at::Tensor nll = online_softmax_cross_entropy(logits, target, scale);
      EXPECT_TRUE(at::equal(nll, nll_only));
      const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
      // The loss: relative to its size, or to the logits' (lse of values near 1e4 has fp32's step there).
      const at::Tensor err = (nll.to(at::kDouble) - ref_nll).abs();
      const at::Tensor bound = (ref_nll.abs() + x.abs().amax(1).to(at::kDouble) * 1e-3).mul(tol);
      EXPECT_TRUE((err <= bound).all().item<bool>()) << nll << ref_nll;
      // The gradient, rounded once to the dtype.
      const double grad_err = (logits.to(at::kDouble) - ref_grad).abs().max().item<double>();
      EXPECT_LE(grad_err, tol * std::max(1.0, ref_grad.abs().max().item<double>())) << "V " << V;
    }
  }
}

// The chunked loss's fused path runs this kernel for fp32 and bf16: its
// gradient sums to 0 over a row of scale s where the target is in the row
// (softmax sums to 1), and an ignored row (scale 0) gets zeros.
TEST(RowKernels, GradientRowsSumToZeroAndIgnoredRowsAreZero) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  at::Tensor logits = at::randn({3, 3000}, gen);
  const at::Tensor target = at::tensor({5, 0, 2999}, at::kLong);
  const at::Tensor scale = at::tensor({0.5f, 0.0f, 1.0f});
  online_softmax_cross_entropy(logits, target, scale);
  EXPECT_NEAR(logits[0].sum().item<double>(), 0.0, 1e-5);
  EXPECT_TRUE(at::equal(logits[1], at::zeros({3000})));
  EXPECT_NEAR(logits[2].sum().item<double>(), 0.0, 1e-5);
  EXPECT_LT(logits[2][2999].item<float>(), 0.0f);
}

TEST(RowKernels, TakeOnlyContiguousFp32AndBf16Matrices) {
  EXPECT_TRUE(row_kernels_take(at::zeros({2, 3})));
  EXPECT_TRUE(row_kernels_take(at::zeros({2, 3}, at::kBFloat16)));
  EXPECT_FALSE(row_kernels_take(at::zeros({2, 3}, at::kHalf)));
  EXPECT_FALSE(row_kernels_take(at::zeros({3, 2}).t()));
  EXPECT_FALSE(row_kernels_take(at::zeros({2, 3, 4})));
  EXPECT_FALSE(row_kernels_take(at::Tensor()));
}

}  // namespace
}  // namespace fsdp::models

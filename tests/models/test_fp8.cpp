// FP8 rowwise linears (models/fp8.h, Note [FP8 rowwise linears]) against
// references written out here: LibTorch's float -> e4m3fn cast turns
// magnitudes above 464 into NaN and our cast saturates them at 448; ties round
// to the even neighbour (normal and subnormal); per row, amax, the scale and
// the largest value at +-448, zero and tiny rows finite; the dequantized
// values within half an e4m3 step of the input; the emulated product and the
// linear's gradients as the recipe writes them (grad_weight in high precision,
// exactly dy^T x); set_fp8_linears on the decoder's products only; and a tiny
// Llama trained 50 steps with emulated FP8 products within 2% of bf16 on an
// order-2 Markov chain.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "fsdp/models/fp8.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "models/fp8_shared.h"
#include "chain_training.h"
#include "support/tiny_llama.h"

namespace fsdp::models {
namespace {

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous().view(-1);
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

at::Tensor floats(std::vector<float> v) { return at::tensor(v, at::TensorOptions().dtype(at::kFloat)); }

TEST(Fp8, CastSaturatesWhereLibTorchsCastGivesNan) {
  // LibTorch's own cast: 460 rounds to 448, 464 is a tie that rounds to even
  // 448, anything above 464 is NaN — the reason cast_to_e4m3 clamps first.
  const std::vector<float> raw = values(floats({460.f, 464.f, 470.f, 500.f, -1e30f}).to(at::kFloat8_e4m3fn));
  EXPECT_EQ(raw[0], 448.f);
  EXPECT_EQ(raw[1], 448.f);
  EXPECT_TRUE(std::isnan(raw[2]) && std::isnan(raw[3]) && std::isnan(raw[4]));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> sat =
      values(cast_to_e4m3(floats({448.00003f, 470.f, 500.f, -500.f, 1e30f, -1e30f, inf, -inf})));
  EXPECT_EQ(sat, (std::vector<float>{448.f, 448.f, 448.f, -448.f, 448.f, -448.f, 448.f, -448.f}));
  EXPECT_TRUE(std::isnan(values(cast_to_e4m3(floats({NAN})))[0]));
}

TEST(Fp8, RoundsToNearestEvenOnExactTies) {
  const float sub = std::ldexp(1.f, -9);  // the smallest subnormal, mantissa 001
  // Each tie lies exactly halfway between two e4m3 neighbours; the one with an
  // even mantissa wins. Beside them, values just off the ties go to the nearer.
  const std::vector<std::pair<float, float>> cases = {
      {1.0625f, 1.0f},         // between 1.000 (m=000) and 1.125 (m=001)
      {1.1875f, 1.25f},        // between 1.125 (m=001) and 1.250 (m=010)
      {-1.0625f, -1.0f},       // the sign does not change the choice
      {272.f, 256.f},          // between 256 (m=000) and 288 (m=001), step 32
      {304.f, 320.f},          // between 288 (m=001) and 320 (m=010)
      {1.5f * sub, 2 * sub},   // subnormals: between m=001 and m=010
      {2.5f * sub, 2 * sub},   // between m=010 and m=011
      {0.5f * sub, 0.f},       // between 0 and the smallest subnormal
      {1.07f, 1.125f},         // above the tie: up
      {1.06f, 1.0f},           // below: down
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(values(cast_to_e4m3(floats({in})))[0], want) << "cast of " << in;
  }
}

TEST(Fp8, QuantizesPerRowWithTheLargestValueAt448) {
  const at::Tensor x = floats({1.f, -4.f, 2.f, 0.5f,          // amax 4
                               0.f, 0.f, 0.f, 0.f,            // zeros
                               1e-20f, -3e-20f, 0.f, 2e-20f,  // tiny: amax clamped to 1e-12
                               -896.f, 10.f, 3.f, 1e-3f})     // amax 896, negative
                           .view({4, 4})
                           .to(at::kBFloat16);
  const Fp8Rows q = quantize_rowwise(x);
  ASSERT_EQ(q.data.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(q.inv_scale.scalar_type(), at::kFloat);
  ASSERT_EQ(q.inv_scale.sizes(), (at::IntArrayRef{4, 1}));
  const std::vector<float> amax = {4.f, kFp8AmaxEps, kFp8AmaxEps, 896.f};
  const std::vector<float> inv = values(q.inv_scale);
  for (int i = 0; i < 4; ++i) {
    // scale = 448 / amax in fp32, and its reciprocal: amax / 448 to fp32 rounding.
    EXPECT_NEAR(inv[i], amax[i] / 448.f, 1e-6 * amax[i] / 448.f) << "row " << i;
  }
  const std::vector<float> d = values(q.data);
  EXPECT_EQ(d[1], -448.f);  // row 0's amax
  EXPECT_EQ(d[0], 112.f);   // 1 * 448 / 4
  EXPECT_EQ(d[12], -448.f);
  EXPECT_EQ(d[13], 5.f);  // 10 * 0.5
  for (int j = 4; j < 12; ++j) EXPECT_EQ(d[j], 0.f) << "zero and tiny rows quantize to 0, element " << j;
  for (float v : values(dequantize_rowwise(q))) EXPECT_TRUE(std::isfinite(v));
}

TEST(Fp8, DequantizedValuesAreWithinHalfAnE4m3Step) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Tensor x = at::randn({16, 64}, gen) * at::exp(at::randn({16, 1}, gen) * 4);
  x.select(1, 3).mul_(50);  // an outlier column
  const at::Tensor back = dequantize_rowwise(quantize_rowwise(x));
  const at::Tensor amax = x.abs().amax(1, true);
  // Normal e4m3 values keep 3 mantissa bits: within 2^-4 of |x|; below 2^-6
  // (subnormals, scaled by amax / 448) the step is 2^-9: half of it absolute.
  // 1e-6 of |x| on top: the fp32 roundings of x * scale and of the dequantization.
  const at::Tensor bound = x.abs() * (std::pow(2.f, -4) + 1e-6) + amax / 448 * std::pow(2.f, -10);
  const at::Tensor err = (back - x).abs();
  EXPECT_TRUE((err <= bound).all().item<bool>())
      << "worst error over bound " << (err / bound).max().item<double>();
  EXPECT_GT(err.max().item<double>(), 0) << "fp8 is lossy: a zero error means nothing was quantized";
}

TEST(Fp8, LinearIsTheRecipesArithmetic) {
  at::Generator gen = at::detail::createCPUGenerator(8);
  const at::Tensor x = at::randn({6, 32}, gen).requires_grad_(true);
  const at::Tensor w = (at::randn({48, 32}, gen) * 0.1).requires_grad_(true);
  const at::Tensor dy = at::randn({6, 48}, gen);
  const at::Tensor y = fp8_linear(x, w);
  const auto g = torch::autograd::grad({y}, {x, w}, {dy});
  at::NoGradGuard no_grad;
  const auto emulated = [](const at::Tensor& a, const at::Tensor& b) {
    return at::mm(dequantize_rowwise(quantize_rowwise(a)), dequantize_rowwise(quantize_rowwise(b)).t())
        .to(at::kBFloat16)
        .to(at::kFloat);
  };
  EXPECT_TRUE(y.equal(emulated(x, w)));
  EXPECT_TRUE(g[0].equal(emulated(dy, w.t().contiguous()))) << "grad_input: dy per row, W per column";
  EXPECT_TRUE(g[1].equal(at::mm(dy.t(), x))) << "grad_weight in high precision";
  const double rel = ((y - at::mm(x, w.t())).norm() / at::mm(x, w.t()).norm()).item<double>();
  EXPECT_LT(rel, 0.1) << "an FP8 product is the plain one to a few percent";
  EXPECT_GT(rel, 0);
}

// Note [One quantization of a shared input]: inside a scope over x, the FP8
// linears reading x's rows quantize them once, with the same results; an
// in-place change, another tensor or the scope's end quantizes anew.
TEST(Fp8, LinearsSharingAnInputQuantizeItOnce) {
  at::Generator gen = at::detail::createCPUGenerator(9);
  at::Tensor x = at::randn({2, 3, 32}, gen);
  const at::Tensor w1 = at::randn({48, 32}, gen) * 0.1, w2 = at::randn({16, 32}, gen) * 0.1;
  const at::Tensor rows = x.reshape({-1, 32});
  const at::Tensor want1 = fp8_linear(rows, w1), want2 = fp8_linear(rows, w2);
  const int64_t before = SharedFp8Input::reused();
  {
    const SharedFp8Input shared(x);
    EXPECT_TRUE(fp8_linear(x.reshape({-1, 32}), w1).equal(want1));
    EXPECT_TRUE(fp8_linear(x.view({6, 32}), w2).equal(want2));  // another view of the same values
    EXPECT_EQ(SharedFp8Input::reused(), before + 1);
    fp8_linear(at::randn({6, 32}, gen), w1);  // another tensor
    EXPECT_EQ(SharedFp8Input::reused(), before + 1);
    x.mul_(2);  // the values changed: quantized anew, and right
    EXPECT_TRUE(fp8_linear(x.reshape({-1, 32}), w1).equal(fp8_linear(x.reshape({-1, 32}).clone(), w1)));
    EXPECT_EQ(SharedFp8Input::reused(), before + 1);
  }
  fp8_linear(x.reshape({-1, 32}), w2);
  EXPECT_EQ(SharedFp8Input::reused(), before + 1);
  // The fused kernels' Llama: per layer k and v reuse q's quantization, up reuses gate's.
  auto model = std::make_shared<LlamaForCausalLMImpl>(testing::chain_llama("fp8-llama"), at::TensorOptions(), 3);
  set_fp8_linears(*model, Fp8Linear::kRowwise);
  set_layer_kernels(*model, LayerKernels::kFused);
  const int64_t start = SharedFp8Input::reused();
  const at::Tensor tokens = at::randint(model->config().vocab_size, {2, 8}, gen, at::kLong);
  model->loss(tokens, tokens);
  EXPECT_EQ(SharedFp8Input::reused() - start, 3 * model->config().num_hidden_layers);
}

LlamaConfig tiny() { return testing::chain_llama("fp8-llama"); }

TEST(Fp8, SetsTheDecoderProductsOnly) {
  const LlamaConfig cfg = tiny();
  auto model = std::make_shared<LlamaForCausalLMImpl>(cfg, at::TensorOptions(), /*seed=*/3);
  EXPECT_EQ(set_fp8_linears(*model, Fp8Linear::kRowwise), 7 * cfg.num_hidden_layers);
  LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.targets = {"q_proj"};
  apply_lora(*model, lc, /*seed=*/1);
  int64_t fp8 = 0, adapters = 0;
  for (const auto& item : model->named_modules()) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    if (item.key().find("lora_") != std::string::npos) {
      ++adapters;
      EXPECT_EQ(linear->fp8(), Fp8Linear::kOff) << item.key();
    }
    fp8 += linear->runs_fp8();
  }
  EXPECT_EQ(adapters, 2 * cfg.num_hidden_layers);
  // apply_lora freezes the base: a frozen weight keeps the plain product.
  EXPECT_EQ(fp8, 0);
}

// 50 steps in pure bf16 on the order-2 chain (t_j = t_{j-1} + 1 + (t_{j-2}
// mod 2) + e_j mod V: the best loss is ln 2); the losses.
std::vector<double> train(Fp8Linear mode) {
  auto model = std::make_shared<LlamaForCausalLMImpl>(tiny(), at::TensorOptions().dtype(at::kBFloat16), /*seed=*/3);
  set_fp8_linears(*model, mode);
  return testing::train_on_chain(*model, 50, /*order=*/2, /*first_seed=*/200);
}

TEST(Fp8, EmulatedFp8TrainsATinyLlamaWithin2PercentOfBf16) {
  at::set_num_threads(1);  // as the kernels' training test: a tiny model gains nothing from more
  const std::vector<double> bf16 = train(Fp8Linear::kOff);
  const std::vector<double> fp8 = train(Fp8Linear::kRowwise);
  const double rel = std::abs(fp8.back() - bf16.back()) / bf16.back();
  std::cout << "[fp8] bf16 loss " << bf16.front() << " -> " << bf16.back() << ", emulated fp8 " << fp8.front()
            << " -> " << fp8.back() << " (relative difference at step 50: " << rel << ")\n";
  EXPECT_LT(bf16.back(), bf16.front() * 0.7) << "bf16 should learn the chain";
  EXPECT_LE(rel, 0.02);
  EXPECT_NE(fp8, bf16) << "the FP8 products ran";
}

TEST(Fp8, NamesParseAndOthersAreRefused) {
  EXPECT_EQ(parse_fp8_linear("off"), Fp8Linear::kOff);
  EXPECT_EQ(parse_fp8_linear("rowwise"), Fp8Linear::kRowwise);
  EXPECT_FALSE(parse_fp8_linear("tensorwise").has_value());
  EXPECT_STREQ(to_string(Fp8Linear::kRowwise), "rowwise");
}

}  // namespace
}  // namespace fsdp::models

// Fused products (models/fused_products.h, Note [Fused products over the flat
// parameter]):
//   - over weights that are views into one flat buffer, as the FSDP engine
//     makes them, the one product and its gradients (x, every weight, every
//     bias) are the separate products' within 1e-6 relative in fp32, and the
//     fused path ran (fused_product_counts);
//   - weights each in storage of their own, with a gap between them, with a
//     LoRA adapter, or some frozen, take the separate products: the same
//     values bit for bit, and the fallback counted;
//   - a tiny Llama under the engine (FULL_SHARD, 2 ranks, AdamW) with
//     --kernels fused trains within 1e-6 relative per step of the reference
//     kernels over 20 steps in fp32, with two fused products per decoder layer
//     in every forward (q|k|v and gate|up) and no fallback.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <iostream>

#include "fsdp/fsdp.h"
#include "fsdp/models/fused_products.h"
#include "fsdp/models/llama.h"
#include "fsdp/optim/adamw.h"
#include "llama_parity.h"
#include "support/multiproc.h"
#include "support/tiny_llama.h"

namespace fsdp {
using testing::borrow;
namespace {

using models::Linear;
using models::LinearImpl;

// Largest |a - b| over the largest |b|.
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / std::max(scale, 1e-30);
}

// Three linears D -> rows[i]; with `gap` elements between consecutive
// weights (and biases) of one flat buffer, or each in storage of its own
// when gap < 0. The flat buffer's parameters are views into it, as the
// engine's (set_data over a leaf that requires grad).
std::vector<Linear> make_linears(const std::vector<int64_t>& rows, int64_t D, bool bias, int64_t gap,
                                 at::Generator& gen) {
  std::vector<Linear> out;
  for (int64_t r : rows) out.emplace_back(D, r, bias, at::TensorOptions());
  at::NoGradGuard no_grad;
  for (auto& l : out) {
    l->weight().copy_(at::randn(l->weight().sizes(), gen) * 0.3);
    if (bias) l->bias().copy_(at::randn(l->bias().sizes(), gen));
  }
  if (gap < 0) return out;
  int64_t total = 0;
  for (int64_t r : rows) total += (r * D + gap) + (bias ? r + gap : 0);
  const at::Tensor flat = at::zeros({total});
  int64_t at_w = 0;
  for (auto& l : out) {
    at::Tensor w = flat.narrow(0, at_w, l->weight().numel()).view(l->weight().sizes());
    w.copy_(l->weight());
    l->weight().set_data(w);
    at_w += l->weight().numel() + gap;
  }
  for (auto& l : out) {  // the biases after the weights, as one unit's flat parameter lays them out
    if (!bias) break;
    at::Tensor b = flat.narrow(0, at_w, l->bias().numel());
    b.copy_(l->bias());
    l->bias().set_data(b);
    at_w += l->bias().numel() + gap;
  }
  return out;
}

struct Outcome {
  std::vector<at::Tensor> y;      // each linear's output
  std::vector<at::Tensor> grads;  // x's, then each weight's and bias's
  models::FusedProductCounts counts;  // fused_linears' calls during the forward
};

// fused_linears over `linears`, and every gradient for output gradients `dy`.
Outcome run_fused(const std::vector<Linear>& linears, const at::Tensor& x0, const std::vector<at::Tensor>& dy) {
  Outcome o;
  const at::Tensor x = x0.clone().requires_grad_(true);
  std::vector<LinearImpl*> ls;
  std::vector<at::Tensor> inputs = {x};
  for (const auto& l : linears) {
    ls.push_back(l.ptr().get());
    for (const auto& p : l->parameters()) {
      if (p.requires_grad()) inputs.push_back(p);
    }
  }
  const models::FusedProductCounts before = models::fused_product_counts();
  o.y = models::fused_linears(x, ls, /*kept=*/false);
  const models::FusedProductCounts after = models::fused_product_counts();
  o.counts = {after.fused - before.fused, after.separate - before.separate};
  o.grads = torch::autograd::grad(o.y, inputs, dy);
  return o;
}

// The separate products at::linear(x, W_i, b_i) on copies of the parameters.
Outcome run_separate(const std::vector<Linear>& linears, const at::Tensor& x0, const std::vector<at::Tensor>& dy) {
  Outcome o;
  const at::Tensor x = x0.clone().requires_grad_(true);
  std::vector<at::Tensor> inputs = {x};
  for (const auto& l : linears) {
    const at::Tensor w = l->weight().detach().clone().requires_grad_(l->weight().requires_grad());
    const at::Tensor b = l->bias().defined() ? l->bias().detach().clone().requires_grad_(true) : at::Tensor();
    o.y.push_back(at::linear(x, w, b));
    if (w.requires_grad()) inputs.push_back(w);
    if (b.defined()) inputs.push_back(b);
  }
  // Weights first, then biases, as run_fused lists them (parameters() order per linear).
  o.grads = torch::autograd::grad(o.y, inputs, dy);
  return o;
}

TEST(FusedProducts, OneProductOverTheFlatBufferIsTheSeparateProducts) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  const int64_t D = 24;
  const std::vector<int64_t> rows = {32, 16, 16};  // q, k, v of 4 heads, 2 kv heads, Dh 8
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    const std::vector<Linear> linears = make_linears(rows, D, bias, /*gap=*/0, gen);
    const at::Tensor x = at::randn({3, 7, D}, gen);
    std::vector<at::Tensor> dy;
    for (int64_t r : rows) dy.push_back(at::randn({3, 7, r}, gen));
    const Outcome fused = run_fused(linears, x, dy);
    const Outcome separate = run_separate(linears, x, dy);
    EXPECT_EQ(fused.counts.fused, 1);
    EXPECT_EQ(fused.counts.separate, 0);
    // The outputs are views of one product's output, side by side.
    EXPECT_EQ(fused.y[1].data_ptr<float>(), fused.y[0].data_ptr<float>() + rows[0]);
    ASSERT_EQ(fused.y.size(), separate.y.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_LE(rel_diff(fused.y[i], separate.y[i]), 1e-6) << "output " << i;
    }
    // run_fused lists each linear's weight and bias together; run_separate the same.
    ASSERT_EQ(fused.grads.size(), separate.grads.size());
    for (size_t i = 0; i < fused.grads.size(); ++i) {
      ASSERT_TRUE(fused.grads[i].defined()) << "gradient " << i;
      EXPECT_EQ(fused.grads[i].sizes(), separate.grads[i].sizes()) << "gradient " << i;
      EXPECT_LE(rel_diff(fused.grads[i], separate.grads[i]), 1e-6) << "gradient " << i << " (0: x's)";
    }
  }
}

TEST(FusedProducts, OtherLayoutsTakeTheSeparateProducts) {
  at::Generator gen = at::detail::createCPUGenerator(6);
  const int64_t D = 16;
  const std::vector<int64_t> rows = {24, 24};  // gate and up
  struct Case {
    const char* name;
    int64_t gap;
    bool lora;
    bool freeze_one;
  };
  const Case cases[] = {{"each weight its own storage", -1, false, false},
                        {"a gap between the weights", 8, false, false},
                        {"a LoRA adapter", 0, true, false},
                        {"one weight frozen", 0, false, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<Linear> linears = make_linears(rows, D, /*bias=*/false, c.gap, gen);
    if (c.lora) {
      linears[0]->add_lora(/*rank=*/2, /*alpha=*/4, /*dropout=*/0, /*mask_key=*/1);
      at::NoGradGuard no_grad;
      for (const auto& p : linears[0]->parameters()) {
        if (p.numel() < linears[0]->weight().numel()) p.copy_(at::randn(p.sizes(), gen) * 0.1);
      }
    }
    if (c.freeze_one) linears[1]->weight().requires_grad_(false);
    std::vector<const LinearImpl*> view;
    for (const auto& l : linears) view.push_back(l.get());
    EXPECT_FALSE(models::products_fusable(view));
    const at::Tensor x = at::randn({5, D}, gen);
    const std::vector<at::Tensor> dy = {at::randn({5, rows[0]}, gen), at::randn({5, rows[1]}, gen)};
    const Outcome fused = run_fused(linears, x, dy);
    EXPECT_EQ(fused.counts.fused, 0);
    EXPECT_EQ(fused.counts.separate, 1);
    // Each linear's own forward: exactly its values.
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_TRUE(fused.y[i].equal(linears[i]->forward(x))) << i;
  }
  // And the layout the engine makes is fusable (the control).
  const std::vector<Linear> adjacent = make_linears(rows, D, /*bias=*/false, /*gap=*/0, gen);
  EXPECT_TRUE(models::products_fusable({adjacent[0].get(), adjacent[1].get()}));
}

constexpr int64_t kBatch = 2, kSeq = 16, kSteps = 20;

// kSteps of AdamW on the tiny Llama, FULL_SHARD over the ranks, fp32; the
// losses, and fused_linears' calls over the whole run.
std::vector<double> train(comm::ProcessGroup& pg, models::LayerKernels kernels, models::FusedProductCounts& calls) {
  models::LlamaConfig cfg = testing::tiny_llama("fused-products");
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions(), /*seed=*/4);
  models::set_layer_kernels(*impl, kernels);
  auto root = std::make_shared<testing::LlamaRoot>(impl);
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type({models::llama_block_type()});
  auto sharded = fully_shard(root, borrow(pg), o);
  optim::AdamW opt({/*lr=*/3e-3});
  opt.add_shards(sharded->shards());
  const models::FusedProductCounts before = models::fused_product_counts();
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const at::Tensor seq = testing::counting_sequences(cfg.vocab_size, kSeq + 1, step, pg.rank() * kBatch, kBatch);
    const at::Tensor loss =
        root->forward(seq.narrow(1, 0, kSeq).contiguous(), seq.narrow(1, 1, kSeq).contiguous());
    loss.backward();
    opt.step();
    sharded->zero_grad();
    losses.push_back(loss.item<double>());
  }
  const models::FusedProductCounts after = models::fused_product_counts();
  calls = {after.fused - before.fused, after.separate - before.separate};
  return losses;
}

TEST(FusedProducts, ATinyLlamaUnderTheEngineTrainsAsTheReference) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    models::FusedProductCounts ref_calls, fused_calls;
    const std::vector<double> ref = train(pg, models::LayerKernels::kReference, ref_calls);
    const std::vector<double> fused = train(pg, models::LayerKernels::kFused, fused_calls);
    const int64_t layers = testing::tiny_llama("").num_hidden_layers;
    EXPECT_EQ(ref_calls.fused + ref_calls.separate, 0) << "the reference kernels call no fused product";
    EXPECT_EQ(fused_calls.fused, 2 * layers * kSteps) << "q|k|v and gate|up, every layer, every forward";
    EXPECT_EQ(fused_calls.separate, 0);
    double worst = 0;
    ASSERT_EQ(fused.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double rel = std::abs(fused[i] - ref[i]) / std::abs(ref[i]);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-6) << "step " << i << ": fused " << fused[i] << ", reference " << ref[i];
    }
    if (pg.rank() == 0) {
      std::cout << "[fused products] loss " << ref.front() << " -> " << ref.back()
                << ", worst relative difference of fused over " << kSteps << " steps " << worst << "\n";
    }
    EXPECT_LT(ref.back(), ref.front()) << "the run should learn";
  });
}

}  // namespace
}  // namespace fsdp

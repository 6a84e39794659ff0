// Activation checkpointing's recompute policies (nn/recompute.h, Note
// [Recompute policy] in src/nn/recompute.cpp) on a tiny Llama with grouped
// query attention, FULL_SHARD over 2 ranks, every decoder layer its own
// checkpointed unit:
//   - full, tail and selective give exactly the gradients of no
//     checkpointing, bit for bit, in fp32 and in bf16 compute, with the
//     reference layer kernels and with the fused ones;
//   - the products a backward runs beyond those of no checkpointing, counted
//     by LibTorch's own record of every aten::mm / aten::addmm call, are 7 per
//     decoder layer for full (q, k, v, o, gate, up, down), 6 for tail (down is
//     not recomputed) and 2 for selective (gate and up); with the fused
//     kernels, whose q|k|v and gate|up are one product each, 4, 3 and 1;
//   - the same with the decoder's products in FP8 (--fp8-linear rowwise,
//     emulated on the CPU): its own autograd node is marked as mm's is; with
//     the fused kernels too, where FP8 linears take their separate products;
//   - what selective keeps between forward and backward is exactly what
//     models::llama_kept_bytes_per_token says (the plan's count), and it is
//     released by backward; full and tail keep nothing.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstring>
#include <iostream>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "llama_parity.h"
#include "support/multiproc.h"
#include "support/tiny_llama.h"

namespace fsdp {
using testing::borrow;
namespace {

constexpr int64_t kBatch = 2, kSeq = 12;

models::LlamaConfig config(const std::string& model_type = "llama") {
  // The tiny Llama's F=48 != H*Dh: the products are told apart by nothing but their count.
  models::LlamaConfig c = testing::tiny_llama("recompute-" + model_type);
  c.model_type = model_type;
  c.num_hidden_layers = 3;
  c.vocab_size = 96;
  if (model_type == "mistral") c.sliding_window = 8;  // < kSeq: every layer's attention is masked
  if (c.per_layer_attention()) c.layer_types.assign(c.num_hidden_layers, "full_attention");
  c.validate();
  return c;
}

// The Llama, and the shapes where a mark falls back to recomputing: a sliding
// window (masked attention: recomputed), q/k/v with a bias (qwen2: those
// products recomputed), per-head norms before rotary (qwen3), and LoRA
// adapters on every projection over a frozen base (each adapter's two
// products recomputed); and the fused layer kernels (--kernels fused: the
// recompute runs the fused norms, rotary and SwiGLU again). `recomputed`:
// products per layer under full, tail and selective.
struct Variant {
  const char* name;
  models::LlamaConfig cfg;
  std::array<int64_t, 3> recomputed;
  bool lora = false;
  models::LayerKernels kernels = models::LayerKernels::kReference;
  models::Fp8Linear fp8 = models::Fp8Linear::kOff;
};

std::vector<Variant> variants() {
  return {{"llama", config(), {7, 6, 2}},
          {"mistral, window 8 < T", config("mistral"), {7, 6, 2}},
          {"qwen2, q/k/v bias", config("qwen2"), {7, 6, 5}},
          {"qwen3, per-head norms", config("qwen3"), {7, 6, 2}},
          {"llama + LoRA on q/k/v/o and the MLP", config(), {7 + 14, 6 + 14, 2 + 14}, true},
          // q|k|v and gate|up are one product each (Note [Fused products over the flat
          // parameter]): 4 products per layer (qkv, o, gate|up, down), 3 without down, 1
          // (gate|up) under selective.
          {"llama, --kernels fused", config(), {4, 3, 1}, false, models::LayerKernels::kFused},
          {"llama, --fp8-linear rowwise", config(), {7, 6, 2}, false, models::LayerKernels::kReference,
           models::Fp8Linear::kRowwise},
          // FP8 linears are not fused (their products are _scaled_mm's, one per weight).
          {"llama, --kernels fused --fp8-linear rowwise", config(), {7, 6, 2}, false, models::LayerKernels::kFused,
           models::Fp8Linear::kRowwise}};
}

// Calls of aten::mm and aten::addmm on any thread while counting is on.
std::atomic<int64_t> g_products{0};
std::atomic<bool> g_counting{false};

class ProductCounter {
 public:
  ProductCounter() {
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          if (g_counting.load() &&
              (std::strcmp(fn.name(), "aten::mm") == 0 || std::strcmp(fn.name(), "aten::addmm") == 0)) {
            g_products.fetch_add(1);
          }
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
  }
  ~ProductCounter() { at::removeCallback(handle_); }
  void start() {
    g_products = 0;
    g_counting = true;
  }
  int64_t stop() {
    g_counting = false;
    return g_products.load();
  }

 private:
  at::CallbackHandle handle_;
};

struct StepResult {
  std::vector<at::Tensor> grads;  // every shard's gradient
  double loss = 0;
  int64_t backward_products = 0;
  int64_t kept_after_forward = 0;
  int64_t kept_after_backward = 0;
};

// One forward and backward; `policy` nullopt: no checkpointing.
StepResult run_step(comm::ProcessGroup& pg, const Variant& v, std::optional<nn::RecomputePolicy> policy,
                    const char* precision) {
  const models::LlamaConfig& cfg = v.cfg;
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions(), /*seed=*/11);
  impl->set_loss_chunk_rows(7);
  models::set_layer_kernels(*impl, v.kernels);
  models::set_fp8_linears(*impl, v.fp8);
  if (v.lora) {
    models::LoraConfig lc;
    lc.rank = 4;
    lc.alpha = 8;
    lc.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    models::apply_lora(*impl, lc, /*seed=*/3);
  }
  auto root = std::make_shared<testing::LlamaRoot>(impl);
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type({models::llama_block_type()});
  o.mixed_precision = MixedPrecision::preset(precision);
  if (policy) {
    o.checkpoint_types = {models::llama_block_type()};
    o.checkpoint_policy = *policy;
  }
  auto sharded = fully_shard(root, borrow(pg), o);
  int64_t fp8_products = 0;
  for (const auto& m : impl->modules()) {
    if (const auto* linear = dynamic_cast<const models::LinearImpl*>(m.get())) fp8_products += linear->runs_fp8();
  }
  EXPECT_EQ(fp8_products, v.fp8 == models::Fp8Linear::kRowwise ? 7 * cfg.num_hidden_layers : 0)
      << "the FP8 products run on the sharded model";
  const at::Tensor seq = testing::counting_sequences(cfg.vocab_size, kSeq + 1, 0, pg.rank() * kBatch, kBatch);
  const at::Tensor tokens = seq.narrow(1, 0, kSeq).contiguous();
  const at::Tensor targets = seq.narrow(1, 1, kSeq).contiguous();
  ProductCounter counter;
  StepResult r;
  at::Tensor loss = root->forward(tokens, targets);
  r.loss = loss.item<double>();
  r.kept_after_forward = sharded->checkpoint_kept_bytes();
  counter.start();
  loss.backward();
  r.backward_products = counter.stop();
  r.kept_after_backward = sharded->checkpoint_kept_bytes();
  for (const auto& s : sharded->shards()) r.grads.push_back(s.grad.defined() ? s.grad.clone() : at::Tensor());
  return r;
}

void check_policies(comm::ProcessGroup& pg, const Variant& v) {
  const models::LlamaConfig& cfg = v.cfg;
  const int64_t L = cfg.num_hidden_layers;
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const StepResult plain = run_step(pg, v, std::nullopt, precision);
    EXPECT_EQ(plain.kept_after_forward, 0);
    const std::pair<nn::RecomputePolicy, int64_t> policies[] = {{nn::RecomputePolicy::kFull, v.recomputed[0]},
                                                                {nn::RecomputePolicy::kTail, v.recomputed[1]},
                                                                {nn::RecomputePolicy::kSelective, v.recomputed[2]}};
    for (const auto& [policy, recomputed] : policies) {
      SCOPED_TRACE(nn::to_string(policy));
      const StepResult r = run_step(pg, v, policy, precision);
      EXPECT_EQ(r.loss, plain.loss);
      ASSERT_EQ(r.grads.size(), plain.grads.size());
      for (size_t u = 0; u < r.grads.size(); ++u) {
        ASSERT_EQ(r.grads[u].defined(), plain.grads[u].defined()) << "unit " << u;
        if (!r.grads[u].defined()) continue;  // a frozen flat parameter
        EXPECT_TRUE(r.grads[u].equal(plain.grads[u]))
            << "unit " << u << ": max difference " << (r.grads[u] - plain.grads[u]).abs().max().item<double>();
      }
      const int64_t extra = r.backward_products - plain.backward_products;
      std::cout << "[recompute] " << v.name << ", " << precision << " " << nn::to_string(policy) << ": "
                << r.backward_products << " products in backward (" << plain.backward_products
                << " without checkpointing), kept " << r.kept_after_forward << " bytes after forward\n";
      EXPECT_EQ(extra, recomputed * L) << "products in backward: " << r.backward_products << " against "
                                       << plain.backward_products << " without checkpointing";
      int64_t kept = 0;
      const at::ScalarType dtype = std::strcmp(precision, "bf16") == 0 ? at::kBFloat16 : at::kFloat;
      for (int64_t layer = 0; layer < L; ++layer) {
        kept += kBatch * kSeq * models::llama_kept_bytes_per_token(cfg, layer, policy, dtype, at::kCPU, kSeq);
      }
      EXPECT_EQ(r.kept_after_forward, kept);
      if (policy == nn::RecomputePolicy::kSelective) EXPECT_GT(kept, 0);
      EXPECT_EQ(r.kept_after_backward, 0);
    }
  }
}

TEST(Recompute, EveryPolicyGivesTheGradientsOfNoCheckpointingBitForBit) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    for (const Variant& v : variants()) {
      SCOPED_TRACE(v.name);
      check_policies(pg, v);
    }
  });
}

}  // namespace
}  // namespace fsdp

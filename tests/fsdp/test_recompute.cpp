// Activation checkpointing's recompute policies (nn/recompute.h, Note
// [Recompute policy] in src/nn/recompute.cpp) on a tiny Llama with grouped
// query attention, FULL_SHARD over 2 ranks, every decoder layer its own
// checkpointed unit:
//   - full and tail give exactly the gradients of no checkpointing, bit for
//     bit, in fp32 and in bf16 compute;
//   - the products a backward runs beyond those of no checkpointing, counted
//     by LibTorch's own record of every aten::mm / aten::addmm call, are 7 per
//     decoder layer for full (q, k, v, o, gate, up, down) and 6 for tail (down
//     is not recomputed).
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <iostream>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "llama_parity.h"
#include "support/multiproc.h"

namespace fsdp {
using testing::borrow;
namespace {

constexpr int64_t kBatch = 2, kSeq = 12;

models::LlamaConfig config() {
  models::LlamaConfig c;
  c.name = "recompute-llama";
  c.hidden_size = 32;
  c.intermediate_size = 48;  // F != H*Dh: the products are told apart by nothing but their count
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 3;
  c.vocab_size = 96;
  c.max_position_embeddings = 64;
  c.validate();
  return c;
}

// Calls of aten::mm and aten::addmm on any thread while counting is on.
std::atomic<int64_t> g_products{0};
std::atomic<bool> g_counting{false};

class ProductCounter {
 public:
  ProductCounter() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(
                                        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                          if (g_counting.load() && (std::strcmp(fn.name(), "aten::mm") == 0 ||
                                                                    std::strcmp(fn.name(), "aten::addmm") == 0)) {
                                            g_products.fetch_add(1);
                                          }
                                          return nullptr;
                                        })
                                        .scopes({at::RecordScope::FUNCTION}));
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
};

// One forward and backward; `policy` nullopt: no checkpointing.
StepResult run_step(comm::ProcessGroup& pg, std::optional<nn::RecomputePolicy> policy, const char* precision) {
  const models::LlamaConfig cfg = config();
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions(), /*seed=*/11);
  impl->set_loss_chunk_rows(7);
  auto root = std::make_shared<testing::LlamaRoot>(impl);
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type({models::llama_block_type()});
  o.mixed_precision = MixedPrecision::preset(precision);
  if (policy) {
    o.checkpoint_types = {models::llama_block_type()};
    o.checkpoint_policy = *policy;
  }
  auto sharded = fully_shard(root, borrow(pg), o);
  const at::Tensor seq = testing::counting_sequences(cfg.vocab_size, kSeq + 1, 0, pg.rank() * kBatch, kBatch);
  const at::Tensor tokens = seq.narrow(1, 0, kSeq).contiguous();
  const at::Tensor targets = seq.narrow(1, 1, kSeq).contiguous();
  ProductCounter counter;
  StepResult r;
  at::Tensor loss = root->forward(tokens, targets);
  r.loss = loss.item<double>();
  counter.start();
  loss.backward();
  r.backward_products = counter.stop();
  for (const auto& s : sharded->shards()) r.grads.push_back(s.grad.clone());
  return r;
}

TEST(Recompute, EveryPolicyGivesTheGradientsOfNoCheckpointingBitForBit) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    const models::LlamaConfig cfg = config();
    const int64_t L = cfg.num_hidden_layers;
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(precision);
      const StepResult plain = run_step(pg, std::nullopt, precision);
      const std::pair<nn::RecomputePolicy, int64_t> policies[] = {{nn::RecomputePolicy::kFull, 7},
                                                                  {nn::RecomputePolicy::kTail, 6}};
      for (const auto& [policy, recomputed] : policies) {
        SCOPED_TRACE(nn::to_string(policy));
        const StepResult r = run_step(pg, policy, precision);
        EXPECT_EQ(r.loss, plain.loss);
        ASSERT_EQ(r.grads.size(), plain.grads.size());
        for (size_t u = 0; u < r.grads.size(); ++u) {
          EXPECT_TRUE(r.grads[u].equal(plain.grads[u]))
              << "unit " << u << ": max difference " << (r.grads[u] - plain.grads[u]).abs().max().item<double>();
        }
        const int64_t extra = r.backward_products - plain.backward_products;
        std::cout << "[recompute] " << precision << " " << nn::to_string(policy) << ": " << r.backward_products
                  << " products in backward (" << plain.backward_products << " without checkpointing)\n";
        EXPECT_EQ(extra, recomputed * L) << "products in backward: " << r.backward_products << " against "
                                         << plain.backward_products << " without checkpointing";
      }
    }
  });
}

}  // namespace
}  // namespace fsdp

// Helpers for checkpoint tests: a small sharded Llama with an optimizer, a few
// deterministic training steps, and the full (unsharded) state by name.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/nn/freeze.h"
#include "fsdp/optim/adamw.h"
#include "support/tiny_llama.h"

namespace fsdp::testing {

// The tests' tiny Llama (two layers, D=32, GQA) with F=72 and V=97: parameter
// counts that do not divide by 3 or 4, so shards have padding at every world
// size the tests use.
inline models::LlamaConfig small_config(bool tied = false) {
  models::LlamaConfig c = tiny_llama("ckpt-test");
  c.intermediate_size = 72;
  c.vocab_size = 97;
  c.tie_word_embeddings = tied;
  return c;
}

struct ShardedLlama {
  models::LlamaConfig cfg;
  std::shared_ptr<models::LlamaForCausalLMImpl> impl;
  std::shared_ptr<nn::UnitImpl<models::LlamaForCausalLMImpl>> root;
  std::shared_ptr<ShardedModel> sharded;
  std::unique_ptr<optim::AdamW> opt;

  // Mean loss of a forward+backward+step on `tokens` (B, T+1) int64.
  double train_step(const at::Tensor& tokens) {
    sharded->zero_grad();
    const auto in = tokens.narrow(1, 0, tokens.size(1) - 1).contiguous();
    const auto tg = tokens.narrow(1, 1, tokens.size(1) - 1).contiguous();
    at::Tensor loss = root->forward(in, tg);
    loss.backward();
    sharded->clip_grad_norm(1.0);
    opt->step();
    return loss.item<double>();
  }
  // Logits (B, T, V) under no-grad (the engine's eval path).
  at::Tensor logits(const at::Tensor& inputs) {
    at::NoGradGuard g;
    return root->forward(inputs);
  }
};

inline ShardedLlama make_sharded_llama(comm::ProcessGroup& pg, const std::string& strategy,
                                       const std::string& wrap = "block", uint64_t seed = 7,
                                       const models::LlamaConfig& cfg = small_config(),
                                       const std::string& precision = "fp32", const std::string& freeze = "") {
  ShardedLlama m;
  m.cfg = cfg;
  m.impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), seed);
  if (!freeze.empty()) nn::freeze_matching(*m.impl, freeze);  // --freeze
  m.root = std::make_shared<nn::UnitImpl<models::LlamaForCausalLMImpl>>(m.impl);
  FsdpOptions fo;
  fo.strategy = parse_sharding_strategy(strategy);
  fo.wrap = wrap == "root" ? WrapPolicy::root_only() : WrapPolicy::by_type({models::llama_block_type()});
  fo.hybrid_shard_size = fo.strategy == ShardingStrategy::kHybridShard ? 2 : pg.size();
  fo.init_rule = models::llama_init_rule(cfg);
  fo.seed = seed;
  fo.mixed_precision = MixedPrecision::preset(precision);
  m.sharded = fully_shard(m.root, comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {}), fo);
  optim::AdamWOptions ao;
  ao.lr = 1e-2;
  if (precision == "bf16-pure") {  // AnyPrecision AdamW: bf16 moments, Kahan compensation
    ao.state_dtype = at::kBFloat16;
    ao.kahan_summation = true;
  }
  m.opt = std::make_unique<optim::AdamW>(ao);
  m.opt->add_shards(m.sharded->shards());
  return m;
}

// Deterministic token batch (B, T+1) in [0, V).
inline at::Tensor token_batch(int64_t b, int64_t t, int64_t vocab, int64_t seed) {
  at::Tensor x = at::empty({b, t + 1}, at::kLong);
  auto* p = x.data_ptr<int64_t>();
  uint64_t s = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < x.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    p[i] = static_cast<int64_t>(s % static_cast<uint64_t>(vocab));
  }
  return x;
}

// The full state by name: "param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>"
// (and "compensation/<name>" with a Kahan-compensated optimizer); frozen
// parameters have no moments (collective over the shard group; every rank
// gets it).
inline std::map<std::string, at::Tensor> full_state(ShardedLlama& m) {
  std::map<std::string, at::Tensor> out;
  const auto& units = m.sharded->units();
  auto& slots = m.opt->slots();  // one per trainable entry, in order
  const bool replicated = units[0].shard_numel == units[0].padded_numel;
  size_t slot = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const at::Tensor full = m.sharded->gather_unit(u);
    std::map<std::string, at::Tensor> moments;
    std::vector<std::pair<std::string, at::Tensor>> kinds;
    if (units[u].trainable) {
      const auto& s = slots.at(slot++);
      kinds = {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}};
      if (s.compensation.defined()) kinds.emplace_back("compensation", s.compensation);
    }
    for (auto [kind, t] : kinds) {
      if (replicated) {
        moments[kind] = t.clone();
      } else {
        at::Tensor g = at::empty({units[u].padded_numel}, t.options());
        m.sharded->shard_group()->all_gather(g, t.contiguous())->wait();
        moments[kind] = g;
      }
    }
    for (const auto& p : units[u].params) {
      out["param/" + p.name] = full.narrow(0, p.flat_offset, p.numel).reshape(p.shape).clone();
      for (const auto& [kind, g] : moments) {
        out[kind + "/" + p.name] = g.narrow(0, p.flat_offset, p.numel).reshape(p.shape).clone();
      }
    }
  }
  return out;
}

inline void expect_same_state(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b,
                              const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [k, t] : a) {
    auto it = b.find(k);
    ASSERT_NE(it, b.end()) << what << ": " << k;
    EXPECT_TRUE(at::equal(t, it->second)) << what << ": " << k << " differs, max |diff| "
                                          << (t - it->second).abs().max().item<double>();
  }
}

}  // namespace fsdp::testing

// The embedding and the output head as units of their own (fsdp-train's
// --wrap block: models::llama_unit_types), tied (the embedding's unit called
// twice: lookup and head) and untied, with the chunked loss in the head's
// unit: every strategy at 2 ranks matches the single-process reference of
// tests/fsdp/parity.h step by step (loss within 1e-5 relative, every local
// shard within 1e-5), and the model learns. Also bf16 compute with fp32
// reduction and masters (FULL_SHARD), and a LoRA adapter on lm_head, whose
// unit then holds a frozen and a trainable flat parameter.
#include <gtest/gtest.h>

#include <string>

#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "llama_parity.h"
#include "support/multiproc.h"
#include "support/tiny_llama.h"

namespace fsdp {
using testing::borrow;
using testing::ParityConfig;
using testing::run_distributed;

namespace {

constexpr int64_t kSeqLen = 8;

models::LlamaConfig config(bool tied) {
  models::LlamaConfig c = testing::tiny_llama(tied ? "parity-llama-tied" : "parity-llama");
  c.vocab_size = 96;
  c.tie_word_embeddings = tied;
  c.validate();
  return c;
}

// `lora_head`: a LoRA adapter (rank 4, no dropout) on lm_head, the rest frozen.
testing::ParityModel model(bool tied, bool lora_head = false) {
  const models::LlamaConfig cfg = config(tied);
  testing::ParityModel m;
  m.name = cfg.name;
  m.build = [cfg, lora_head](bool meta, uint64_t seed) -> std::shared_ptr<nn::UnitBase> {
    auto impl = std::make_shared<models::LlamaForCausalLMImpl>(
        cfg, at::TensorOptions().device(meta ? at::kMeta : at::kCPU), seed);
    impl->set_loss_chunk_rows(5);  // several chunks per micro-batch, a short last one
    if (lora_head) {
      models::LoraConfig lc;
      lc.rank = 4;
      lc.alpha = 8;
      lc.targets = {"lm_head"};
      models::apply_lora(*impl, lc, seed);
    }
    return std::make_shared<testing::LlamaRoot>(impl);
  };
  m.init_rule = models::llama_init_rule(cfg);
  if (lora_head) {
    auto probe = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
    models::LoraConfig lc;
    lc.rank = 4;
    lc.alpha = 8;
    lc.targets = {"lm_head"};
    models::apply_lora(*probe, lc, 0);
    m.init_rule = models::lora_init_rule(*probe, models::llama_init_rule(cfg));
  }
  m.loss = testing::counting_lm_loss(cfg.vocab_size, kSeqLen);
  return m;
}

ParityConfig units_config(ShardingStrategy s, int world) {
  ParityConfig c = testing::llama_parity_config(s, world, /*lr=*/3e-3);
  c.fsdp.wrap = WrapPolicy::by_type(models::llama_unit_types());
  return c;
}

void check(bool tied, ShardingStrategy s) {
  const testing::ParityModel m = model(tied);
  run_distributed(2, [&](comm::ProcessGroup& pg) {
    const ParityConfig c = units_config(s, pg.size());
    const testing::ParityReport r = testing::run_parity(borrow(pg), m, c);
    testing::expect_learned(m, c, r);
  });
}

}  // namespace

TEST(LlamaUnitsParity, UntiedFullShard) { check(false, ShardingStrategy::kFullShard); }
TEST(LlamaUnitsParity, TiedFullShard) { check(true, ShardingStrategy::kFullShard); }
TEST(LlamaUnitsParity, TiedShardGradOp) { check(true, ShardingStrategy::kShardGradOp); }
TEST(LlamaUnitsParity, UntiedNoShard) { check(false, ShardingStrategy::kNoShard); }

TEST(LlamaUnitsParity, TiedFullShardBf16) {
  const testing::ParityModel m = model(true);
  run_distributed(2, [&](comm::ProcessGroup& pg) {
    ParityConfig c = units_config(ShardingStrategy::kFullShard, pg.size());
    c.fsdp.mixed_precision = MixedPrecision::preset("bf16");
    c.loss_rtol = 2e-2;  // as the option matrix's bf16 runs (test_options.cpp)
    c.param_atol = 1e-2;
    testing::run_parity(borrow(pg), m, c);
  });
}

TEST(LlamaUnitsParity, LoraOnTheHeadFullShard) {
  const testing::ParityModel m = model(false, /*lora_head=*/true);
  run_distributed(2, [&](comm::ProcessGroup& pg) {
    testing::run_parity(borrow(pg), m, units_config(ShardingStrategy::kFullShard, pg.size()));
  });
}

// The layout: the embedding and the head are units, the root keeps the final norm only.
TEST(LlamaUnits, TheRootKeepsOnlyTheFinalNorm) {
  for (bool tied : {false, true}) {
    const models::LlamaConfig cfg = config(tied);
    auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
    nn::Unit<models::LlamaForCausalLMImpl> root(impl);
    FsdpOptions o;
    o.wrap = WrapPolicy::by_type(models::llama_unit_types());
    const ShardingPlan plan = plan_sharding(root.ptr(), 2, 0, o);
    ASSERT_EQ(plan.units.size(), tied ? 4u : 5u);
    EXPECT_EQ(plan.units[0].name, "");
    ASSERT_EQ(plan.units[0].params.size(), 1u);
    EXPECT_EQ(plan.units[0].params[0].name, "model.norm.weight");
    EXPECT_EQ(plan.units[1].name, "model.embed_tokens");
    if (!tied) EXPECT_EQ(plan.units.back().name, "lm_head");
  }
}

}  // namespace fsdp

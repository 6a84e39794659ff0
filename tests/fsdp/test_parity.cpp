// Parity with unsharded training (issue: "Done when"): every strategy at world
// sizes 1, 2 and 4 (HYBRID: 4 = 2 shard x 2 replicas; 2 = 1 x 2) trains the
// same seeded model on the same global batch as a single-process reference;
// losses agree within 1e-5 relative every step and every local shard equals
// the matching reference slice within 1e-5.
#include <gtest/gtest.h>

#include "parity.h"
#include "support/multiproc.h"

namespace fsdp {
using testing::borrow;
using testing::ParityConfig;
using testing::run_distributed;

namespace {

int hybrid_shard_size(int world) { return world >= 4 ? 2 : 1; }

void check_strategy(const testing::ParityModel& model, ShardingStrategy s, ParityConfig base = {}) {
  for (int w : {1, 2, 4}) {
    run_distributed(w, [&](comm::ProcessGroup& pg) {
      ParityConfig c = base;
      c.fsdp.strategy = s;
      c.fsdp.hybrid_shard_size = hybrid_shard_size(pg.size());
      testing::run_parity(borrow(pg), model, c);
    });
  }
}

}  // namespace

TEST(Parity, ToyFullShard) { check_strategy(testing::toy_parity_model(false), ShardingStrategy::kFullShard); }
TEST(Parity, ToyShardGradOp) { check_strategy(testing::toy_parity_model(false), ShardingStrategy::kShardGradOp); }
TEST(Parity, ToyNoShard) { check_strategy(testing::toy_parity_model(false), ShardingStrategy::kNoShard); }
TEST(Parity, ToyHybridShard) { check_strategy(testing::toy_parity_model(false), ShardingStrategy::kHybridShard); }

// A parameter that never gets a gradient must not hang backward or disturb
// the others (it still decays under AdamW, like a flat shard must).
TEST(Parity, UnusedParameterFullShard) {
  check_strategy(testing::toy_parity_model(true), ShardingStrategy::kFullShard);
}
TEST(Parity, UnusedParameterHybrid) {
  check_strategy(testing::toy_parity_model(true), ShardingStrategy::kHybridShard);
}

// Same arithmetic order as the reference: bit-identical at world sizes 1 and 2.
TEST(Parity, FullShardIsBitIdenticalToTheSameOrderReference) {
  for (int w : {1, 2}) {
    run_distributed(w, [&](comm::ProcessGroup& pg) {
      ParityConfig c;
      c.expect_bitwise = true;
      testing::run_parity(borrow(pg), testing::toy_parity_model(false), c);
    });
  }
}

// Clipping over the whole sharded model and gradient accumulation without
// communication on intermediate micro-batches, for every strategy.
TEST(Parity, ClipAndGradAccumulationAllStrategies) {
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    run_distributed(4, [&](comm::ProcessGroup& pg) {
      ParityConfig c;
      c.fsdp.strategy = s;
      c.fsdp.hybrid_shard_size = 2;
      c.grad_accum = 2;
      c.clip = 0.5;  // small enough to clip most steps
      testing::run_parity(borrow(pg), testing::toy_parity_model(false), c);
    });
  }
}

// Models built eagerly (not on meta) and broadcast from rank 0.
TEST(Parity, SyncModuleStatesFromRankZero) {
  run_distributed(2, [&](comm::ProcessGroup& pg) {
    ParityConfig c;
    c.build_on_meta = false;
    c.fsdp.sync_module_states = true;
    testing::run_parity(borrow(pg), testing::toy_parity_model(false), c);
  });
}

}  // namespace fsdp

namespace fsdp {
namespace {

// Frozen parameters in every place a unit can hold them: the root's w_in
// (the root then has trainable and frozen parameters), every block's bias
// b1, and all of block 1, whose backward still runs because its input needs
// a gradient (Note [Frozen parameters]). Parameter groups as the trainer's
// default: no decay on b1 (one dimension), and w2 at half the learning rate.
ParityConfig frozen_config() {
  ParityConfig c;
  c.freeze = "^w_in$|b1$|blocks\\.1\\.";
  optim::ParamGroupOptions g;
  g.lr_scales = {{"w2", 0.5}};
  c.param_rule = optim::param_rule(g);
  c.weight_decay = 0.1;
  return c;
}

}  // namespace

TEST(Parity, FrozenAndParamGroupsFullShard) {
  check_strategy(testing::toy_parity_model(false), ShardingStrategy::kFullShard, frozen_config());
}
TEST(Parity, FrozenAndParamGroupsShardGradOp) {
  check_strategy(testing::toy_parity_model(false), ShardingStrategy::kShardGradOp, frozen_config());
}
TEST(Parity, FrozenAndParamGroupsNoShard) {
  check_strategy(testing::toy_parity_model(false), ShardingStrategy::kNoShard, frozen_config());
}
TEST(Parity, FrozenAndParamGroupsHybridShard) {
  check_strategy(testing::toy_parity_model(false), ShardingStrategy::kHybridShard, frozen_config());
}

// Under bf16, frozen shards hold bf16 (Note [Frozen shards in the param
// dtype]); the run must compute what the reference does with fp32 masters
// cast to bf16 every step, and the frozen shards equal those masters rounded.
TEST(Parity, FrozenAndParamGroupsBf16EveryStrategy) {
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                             ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard}) {
    ParityConfig c = frozen_config();
    c.fsdp.mixed_precision = MixedPrecision::preset("bf16");
    c.loss_rtol = 2e-2;  // as the option matrix's bf16 runs (test_options.cpp)
    c.param_atol = 1e-2;
    check_strategy(testing::toy_parity_model(false), s, c);
  }
}

// Same arithmetic order as the reference, frozen parameters and groups
// included: bit-identical at 2 ranks.
TEST(Parity, FrozenAndParamGroupsAreBitIdenticalToTheSameOrderReference) {
  run_distributed(2, [&](comm::ProcessGroup& pg) {
    ParityConfig c = frozen_config();
    c.expect_bitwise = true;
    testing::run_parity(borrow(pg), testing::toy_parity_model(false), c);
  });
}

}  // namespace fsdp

// plan_sharding: the layout fully_shard builds, predicted from the model's
// structure alone.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"
#include "support/errors.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {

TEST(Plan, EqualsWhatFullyShardBuildsOnEveryRank) {
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kHybridShard, ShardingStrategy::kNoShard}) {
      FsdpOptions o;
      o.strategy = s;
      o.hybrid_shard_size = 2;
      o.init_rule = testing::toy_init_rule;
      const ShardingPlan plan = plan_sharding(testing::make_toy(testing::ToyConfig{}, true, 1).ptr(), pg.size(),
                                              pg.rank(), o);
      auto model = testing::make_toy(testing::ToyConfig{}, true, 1);
      auto sharded = fully_shard(model.ptr(), comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {}), o);
      ASSERT_EQ(plan.units.size(), sharded->units().size());
      for (size_t u = 0; u < plan.units.size(); ++u) {
        const UnitInfo& a = plan.units[u];
        const UnitInfo& b = sharded->units()[u];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.padded_numel, b.padded_numel);
        EXPECT_EQ(a.shard_numel, b.shard_numel);
        EXPECT_EQ(a.shard_offset, b.shard_offset) << to_string(s) << " unit " << a.name;
        ASSERT_EQ(a.params.size(), b.params.size());
        for (size_t p = 0; p < a.params.size(); ++p) EXPECT_EQ(a.params[p].flat_offset, b.params[p].flat_offset);
      }
      for (const auto& m : sharded->memory_placement()) {
        if (m.what == "parameter shards") EXPECT_EQ(m.bytes, plan.param_shard_bytes) << to_string(s);
      }
    }
  });
}

// Note [Offload staging] in collectives.cpp: with CPU offload from CUDA and a
// bf16 compute copy, the casts between the fp32 host shards and the device
// go through master-dtype buffers from the pool, so the step's bound (the
// pool's size) grows by them: at least one block's fp32 shard is live at the
// peak (a reduction's), and no more than one per reduction in flight plus the
// gather's. (Without the staging the bound did not change, and the casts'
// temporaries came from the caching allocator, outside it.)
TEST(Plan, CpuOffloadFromCudaCountsItsStagingBuffers) {
  testing::ToyConfig shape;
  shape.d_in = 64;
  shape.d = 128;
  shape.f = 384;
  shape.d_out = 64;
  shape.blocks = 4;
  FsdpOptions o;
  o.device = at::Device(at::kCUDA, 0);  // planned for, not used: no GPU needed
  o.mixed_precision = MixedPrecision::preset("bf16");
  o.init_rule = testing::toy_init_rule;
  const int64_t on_device = plan_sharding(testing::make_toy(shape, true, 1).ptr(), 1, 0, o).step_unsharded_bytes;
  o.cpu_offload = true;
  const int64_t offloaded = plan_sharding(testing::make_toy(shape, true, 1).ptr(), 1, 0, o).step_unsharded_bytes;
  const int64_t block_fp32 = (2 * shape.d * shape.f + shape.f) * 4;
  std::cout << "[plan] bf16 step bound: " << on_device << " bytes on the device, " << offloaded
            << " with CPU offload (a block's fp32 shard: " << block_fp32 << ")\n";
  EXPECT_GE(offloaded - on_device, block_fp32);
  EXPECT_LE(offloaded - on_device, 4 * block_fp32);
  // On the CPU offload moves nothing: no staging.
  o.device = at::kCPU;
  EXPECT_EQ(plan_sharding(testing::make_toy(shape, true, 1).ptr(), 1, 0, o).step_unsharded_bytes,
            [&] {
              FsdpOptions c = o;
              c.cpu_offload = false;
              return plan_sharding(testing::make_toy(shape, true, 1).ptr(), 1, 0, c).step_unsharded_bytes;
            }());
}

TEST(Plan, Llama2_70bOnTheMetaDeviceInMilliseconds) {
  const models::LlamaConfig cfg = models::resolve_model_config("llama2-70b");
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type({models::llama_block_type()});
  o.mixed_precision = MixedPrecision::preset("bf16");
  const ShardingPlan plan = plan_sharding(root.ptr(), 64, 0, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[plan] llama2-70b on 64 ranks, bf16 params, fp32 masters (" << seconds << " s):\n" << plan.describe();
  EXPECT_EQ(plan.parameters, cfg.num_parameters());
  EXPECT_EQ(plan.units.size(), static_cast<size_t>(cfg.num_hidden_layers + 1));
  // fp32 master shards: 4 bytes per parameter over 64 ranks (plus padding).
  EXPECT_NEAR(static_cast<double>(plan.param_shard_bytes), 4.0 * cfg.num_parameters() / 64, 64.0 * 4 * 81);
  EXPECT_EQ(plan.optimizer_bytes, 2 * plan.param_shard_bytes);
  EXPECT_LT(seconds, 5.0);
}

// fsdp-train's --wrap block (models::llama_unit_types): the embedding and the
// output head are units of their own, so the root keeps only the final norm
// and llama3.1-8b on 8 ranks in bf16 plans at most 5 GiB of unsharded
// parameters, gradients and reductions per rank (9.45 GiB with both in the
// root before the head and embedding were units and a post-backward resharded
// before its reduce copy). The plan replays the model's call order
// (nn::CallOrder); test_memory_contract.cpp holds such a plan to the byte.
TEST(Plan, Llama3_8bWithEmbeddingAndHeadUnitsFitsFiveGibPerRank) {
  const models::LlamaConfig cfg = models::resolve_model_config("llama3.1-8b");
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type(models::llama_unit_types());
  o.mixed_precision = MixedPrecision::preset("bf16");
  const ShardingPlan plan = plan_sharding(root.ptr(), 8, 0, o);
  std::cout << "[plan] llama3.1-8b on 8 ranks, bf16, embedding and head as units:\n" << plan.describe();
  EXPECT_EQ(plan.units.size(), static_cast<size_t>(cfg.num_hidden_layers + 3));
  EXPECT_EQ(plan.units[0].params.size(), 1u);  // model.norm.weight
  EXPECT_LE(plan.step_unsharded_bytes, int64_t{5} << 30);
  // The largest unit is the head (or the embedding): V x D bf16, 1 GiB minus padding.
  EXPECT_EQ(plan.largest_unit_bytes, cfg.vocab_size * cfg.hidden_size * 2);
  // Both in the root (wrap by block type only): more.
  FsdpOptions blocks = o;
  blocks.wrap = WrapPolicy::by_type({models::llama_block_type()});
  EXPECT_GT(plan_sharding(root.ptr(), 8, 0, blocks).step_unsharded_bytes, plan.step_unsharded_bytes + (int64_t{2} << 30));
}

}  // namespace fsdp

namespace fsdp {

// Refusals name the engine's own options and arguments (FsdpOptions::..., plan_sharding's
// world_size and rank), never a program's flags: fsdp-train and fsdp-inspect map these names to
// their flags (apps/option_names.h; tests/apps/test_option_table.cpp, test_input_cli.cpp).
TEST(Plan, RefusalsNameTheEngineOptions) {
  auto root = testing::make_toy(testing::ToyConfig{}, true, 1);
  FsdpOptions o;
  std::string msg = testing::usage_error_of([&] { plan_sharding(root.ptr(), 0, 0, o); });
  EXPECT_CONTAINS(msg, "plan_sharding: world_size (the number of processes) must be >= 1, got 0");
  EXPECT_CONTAINS(testing::usage_error_of([&] { plan_sharding(root.ptr(), 4, 4, o); }),
                  "plan_sharding: rank 4 is outside [0, 4)");
  o.strategy = ShardingStrategy::kHybridShard;
  o.hybrid_shard_size = 3;
  msg = testing::usage_error_of([&] { plan_sharding(root.ptr(), 4, 0, o); });
  EXPECT_CONTAINS(msg, "FsdpOptions::hybrid_shard_size 3 must be >= 1 and divide the world size 4");
  o = FsdpOptions{};
  o.limit_all_gathers = 0;
  msg = testing::usage_error_of([&] { check_options(o, 2); });
  EXPECT_CONTAINS(msg, "FsdpOptions::limit_all_gathers must be >= 1");
  EXPECT_EQ(msg.find("--"), std::string::npos) << msg;
}

}  // namespace fsdp

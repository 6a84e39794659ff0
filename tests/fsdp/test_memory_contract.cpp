// The memory contract: the engine's ledger of unsharded buffers (parameters,
// gradients, gradients in flight to a reduction, gradients accumulated without
// synchronization) never exceeds plan_sharding's bound, and the bound is
// exact: every combination of sharding strategy x {fp32, bf16, bf16-pure} x
// prefetch {none, BACKWARD_PRE, BACKWARD_POST, BACKWARD_PRE + forward} x
// activation checkpointing {off, on} peaks at the bound to the byte, at 4
// ranks (HYBRID: 2 x 2), on two shapes of model — a root (the embedding and
// head of a decoder) smaller than one block and one larger than two — and on
// a decoder's layout with the embedding and the head as units of their own,
// untied and tied (the plan replays the model's nn::CallOrder; Note
// [Unsharded memory] in src/fsdp/plan.cpp). NO_SHARD with fp32 or pure bf16
// keeps every unit as its own single copy (the shard is the parameters): the
// bound is 0 and so is the ledger. With frozen parameters the bound holds and
// is within 10%. Gradient accumulation adds ShardingPlan::accumulation_bytes,
// an upper bound (checked: not exceeded).
//
// Every combination runs a second time with the preallocated pool
// (FsdpOptions::unsharded_pool, what CUDA always uses): sized by the plan, it
// must hold every unsharded buffer of the step — no overflow to the device
// allocator, whatever the order in which buffers of different sizes come and
// go — and the ledger stays within the bound there too. Where fragmentation
// makes the pool finish a reduction early (a reclaim), the table says how often.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "fsdp/common/internals.h"
#include "fsdp/fsdp.h"
#include "option_matrix.h"
#include "parity.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using testing::borrow;
namespace {

struct Shape {
  const char* name;
  testing::ToyConfig config;
};

std::vector<Shape> shapes() {
  testing::ToyConfig small_root;  // root 2 x 24 x 32 = 1536 elements, a block 3120
  small_root.d_in = 24;
  small_root.d = 32;
  small_root.f = 48;
  small_root.d_out = 24;
  small_root.blocks = 4;
  testing::ToyConfig large_root = small_root;  // root 2 x 200 x 32 = 12800 elements (> 2 blocks)
  large_root.d_in = 200;
  large_root.d_out = 200;
  return {{"small root", small_root}, {"large root", large_root}};
}

// Every strategy x {fp32, bf16, bf16-pure} x prefetch x checkpointing
// {off, on}, HYBRID as 2 x 2, with a name for messages.
std::vector<testing::NamedOptions> combinations() {
  testing::OptionAxes axes;
  axes.precisions = {"fp32", "bf16", "bf16-pure"};
  return testing::option_matrix(axes);
}

struct Outcome {
  int64_t peak = 0;       // the largest UnshardedMemory::peak over the steps
  int64_t left_over = 0;  // UnshardedMemory::now after the last step
  UnshardedBytes at_peak;
  int64_t shard_bytes = 0;  // this rank's parameter shards, as allocated
  int64_t pool_capacity = 0;   // FsdpOptions::unsharded_pool
  int64_t pool_peak = 0;
  int64_t pool_overflows = 0;
  int64_t pool_reclaims = 0;
};

// The toy model with the parameters whose name `freeze` finds frozen ("": none).
nn::Unit<testing::ToyNetImpl> make_model(const testing::ToyConfig& shape, bool meta, const std::string& freeze) {
  auto model = testing::make_toy(shape, meta, 3);
  if (!freeze.empty()) {
    const std::regex re(freeze);
    for (auto& p : model->named_parameters(true)) {
      if (std::regex_search(p.key(), re)) p.value().set_requires_grad(false);
    }
  }
  return model;
}

// `steps` training steps of `micro_batches` micro-batches each (the last one
// synchronized) of `model` (built on meta), as the trainer runs them; the
// ledger's peak per step.
template <class Root>
Outcome run_model(comm::ProcessGroup& pg, Root model, const testing::ToyConfig& shape, const FsdpOptions& o,
                  int steps, int micro_batches) {
  FsdpOptions fo = o;
  fo.init_rule = testing::toy_init_rule;
  fo.seed = 3;
  auto sharded = fully_shard(model.ptr(), borrow(pg), fo);
  Outcome out;
  for (int step = 0; step < steps; ++step) {
    sharded->zero_grad();
    sharded->reset_unsharded_peak();
    for (int m = 0; m < micro_batches; ++m) {
      sharded->set_requires_gradient_sync(m == micro_batches - 1);
      at::Tensor x = at::randn({4, shape.d_in});
      at::Tensor y = at::randn({4, shape.d_out});
      model->forward(x, y).backward();
    }
    const UnshardedMemory mem = sharded->unsharded_memory();
    if (mem.peak > out.peak) {
      out.peak = mem.peak;
      out.at_peak = mem.at_peak;
    }
    out.left_over = mem.now.total();
    out.pool_capacity = mem.pool_capacity;
    out.pool_peak = std::max(out.pool_peak, mem.pool_peak);
    out.pool_overflows = mem.pool_overflows;
    out.pool_reclaims = mem.pool_reclaims;
  }
  for (const ShardRef& e : sharded->shards()) out.shard_bytes += static_cast<int64_t>(e.param.nbytes());
  return out;
}

Outcome run_steps(comm::ProcessGroup& pg, const testing::ToyConfig& shape, const FsdpOptions& o, int steps,
                  int micro_batches, const std::string& freeze = "") {
  return run_model(pg, make_model(shape, /*meta=*/true, freeze), shape, o, steps, micro_batches);
}

std::string bytes_text(const UnshardedBytes& b) {
  std::ostringstream os;
  os << "params " << b.params << " + grads " << b.grads << " + reductions " << b.reductions << " + accumulated "
     << b.accumulated;
  return os.str();
}

TEST(MemoryContract, EveryCombinationPeaksExactlyAtTheBound) {
  const std::string dir = testing::temp_dir("contract");
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    std::ostringstream table;
    int checked = 0;
    int64_t reclaims = 0;
    for (const Shape& shape : shapes()) {
      for (const auto& [combination, o] : combinations()) {
        const bool pure = o.mixed_precision.master_dtype == at::kBFloat16;
        const ShardingPlan plan = plan_sharding(testing::make_toy(shape.config, true, 3).ptr(), pg.size(), pg.rank(),
                                                o, pure ? at::kBFloat16 : at::kFloat);
        const Outcome got = run_steps(pg, shape.config, o, /*steps=*/3, /*micro_batches=*/1);
        const int64_t bound = plan.unsharded_bound(1);
        const std::string what = std::string(shape.name) + ", " + combination;
        const double ratio = bound > 0 ? static_cast<double>(got.peak) / static_cast<double>(bound) : 1.0;
        table << what << ": measured " << got.peak << " bytes (" << bytes_text(got.at_peak) << "), bound " << bound
              << ", ratio " << ratio << "\n";
        // The replay of the schedule is exact (Note [Unsharded memory]): to the byte.
        EXPECT_EQ(got.peak, bound) << what << ": " << bytes_text(got.at_peak);
        // Nothing stays allocated between steps but NO_SHARD's resident compute copy.
        const int64_t resident = o.strategy == ShardingStrategy::kNoShard && bound > 0 ? got.at_peak.params : 0;
        EXPECT_EQ(got.left_over, resident) << what;
        // The pool: the plan's bound (plus alignment), and nothing outside it.
        FsdpOptions op = o;
        op.unsharded_pool = true;
        const Outcome pooled = run_steps(pg, shape.config, op, /*steps=*/3, /*micro_batches=*/1);
        table << "  with the pool: measured " << pooled.peak << ", pool peak " << pooled.pool_peak << " of "
              << pooled.pool_capacity << ", reclaims " << pooled.pool_reclaims << "\n";
        EXPECT_EQ(pooled.pool_overflows, 0) << what << ": an unsharded buffer did not fit the pool";
        EXPECT_LE(pooled.peak, bound) << what << ", with the pool";
        EXPECT_LE(pooled.pool_peak, pooled.pool_capacity) << what;
        if (bound > 0) {
          EXPECT_GE(pooled.pool_capacity, bound) << what;
          EXPECT_LE(static_cast<double>(pooled.pool_capacity), 1.01 * static_cast<double>(bound) + 8192) << what;
        } else {
          EXPECT_EQ(pooled.pool_capacity, 0) << what << ": nothing unsharded, no pool";
        }
        reclaims += pooled.pool_reclaims;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * 4 * 3 * 4 * 2);
    table << "reclaims with the pool, all combinations: " << reclaims << "\n";
    if (pg.rank() == 0) std::ofstream(dir + "/table.txt") << table.str();
  });
  if (!testing::is_worker()) std::cout << testing::tail_file(dir + "/table.txt", 1000);
}

// Frozen parameters (a LoRA-like layout: every block's w1 and the root's w_in
// frozen, the rest trainable) are gathered with their unit but have no
// gradients: the bound counts them as parameters only, and stays exact.
TEST(MemoryContract, FrozenParametersPeakWithinTheBoundAndAtLeastNinetyPercentOfIt) {
  const std::string freeze = "w_in|w1";
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    int checked = 0;
    testing::OptionAxes axes;  // every strategy, fp32 and bf16
    axes.checkpointing = {false};
    for (const Shape& shape : shapes()) {
      for (const auto& [combination, o] : testing::option_matrix(axes)) {
        const ShardingPlan plan = plan_sharding(make_model(shape.config, true, freeze).ptr(), pg.size(), pg.rank(), o);
        const ShardingPlan unfrozen = plan_sharding(make_model(shape.config, true, "").ptr(), pg.size(), pg.rank(), o);
        const Outcome got = run_steps(pg, shape.config, o, /*steps=*/3, /*micro_batches=*/1, freeze);
        const int64_t bound = plan.unsharded_bound(1);
        const std::string what = std::string(shape.name) + ", " + combination + ", frozen";
        EXPECT_LE(got.peak, bound) << what << ": " << bytes_text(got.at_peak);
        EXPECT_GE(static_cast<double>(got.peak), 0.9 * static_cast<double>(bound))
            << what << ": " << bytes_text(got.at_peak);
        // Freezing saves gradient and optimizer memory, and parameter memory
        // only through the shards' dtype.
        // A block with every parameter frozen, between trainable ones: its
        // backward runs (its input needs a gradient), and it is resharded
        // when that backward ends, not at the end of the whole backward.
        const Outcome whole = run_steps(pg, shape.config, o, /*steps=*/2, /*micro_batches=*/1, "blocks\\.1\\.");
        EXPECT_LE(whole.peak,
                  plan_sharding(make_model(shape.config, true, "blocks\\.1\\.").ptr(), pg.size(), pg.rank(), o)
                      .unsharded_bound(1))
            << what << ", block 1 frozen: " << bytes_text(whole.at_peak);
        EXPECT_LT(plan.grad_shard_bytes, unfrozen.grad_shard_bytes) << what;
        EXPECT_LT(plan.optimizer_bytes, unfrozen.optimizer_bytes) << what;
        EXPECT_EQ(plan.parameters, unfrozen.parameters) << what;
        EXPECT_LT(plan.trainable_parameters, plan.parameters) << what;
        // Frozen shards hold the param dtype (Note [Frozen shards in the
        // param dtype]): smaller under bf16, and the plan counts what is allocated.
        EXPECT_EQ(got.shard_bytes, plan.param_shard_bytes) << what;
        if (o.mixed_precision.param_dtype == at::kBFloat16) {
          EXPECT_LT(plan.param_shard_bytes, unfrozen.param_shard_bytes) << what;
        } else {
          EXPECT_EQ(plan.param_shard_bytes, unfrozen.param_shard_bytes) << what;
        }
        if (bound > 0) EXPECT_LT(bound, unfrozen.unsharded_bound(1)) << what;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * 4 * 2 * 4);
  });
}

// A decoder's layout (ToyConfig::io_units): the input projection (an
// embedding) and the output projection with the loss (a head) are units of
// their own, called first and last, with a root-owned scale (a final norm)
// between the blocks and the head; tied, the input unit is called again as the
// head. plan_sharding replays the model's call order (nn::CallOrder): the
// ledger's peak equals its bound to the byte in every combination.
TEST(MemoryContract, InputAndOutputUnitsPeakExactlyAtTheBound) {
  testing::ToyConfig untied;  // in 24 x 200 = 4800 elements, out 4800, a block 3120
  untied.d_in = 200;
  untied.d = 24;
  untied.f = 64;
  untied.d_out = 200;
  untied.blocks = 3;
  untied.io_units = true;
  testing::ToyConfig tied = untied;
  tied.tied = true;
  const std::pair<const char*, testing::ToyConfig> shapes[] = {{"untied", untied}, {"tied", tied}};
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    int checked = 0;
    for (const auto& [shape_name, shape] : shapes) {
      for (const auto& [combination, o] : combinations()) {
        const bool pure = o.mixed_precision.master_dtype == at::kBFloat16;
        const ShardingPlan plan = plan_sharding(testing::make_toy_io(shape, true, 3).ptr(), pg.size(), pg.rank(), o,
                                                pure ? at::kBFloat16 : at::kFloat);
        const Outcome got =
            run_model(pg, testing::make_toy_io(shape, true, 3), shape, o, /*steps=*/3, /*micro_batches=*/1);
        const std::string what = std::string(shape_name) + ", " + combination;
        EXPECT_EQ(got.peak, plan.unsharded_bound(1)) << what << ": " << bytes_text(got.at_peak);
        // The input and output units are not held by the root.
        EXPECT_EQ(plan.units.size(), size_t(shape.tied ? 1 + 1 + 3 : 1 + 1 + 3 + 1)) << what;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * 4 * 3 * 4 * 2);
  });
}

// FSDP2's per-unit options and FSDP1's HYBRID ZeRO-2 (Note [Per-unit
// options] in src/fsdp/plan.cpp), in the same matrix of precision x prefetch x
// checkpointing on both shapes: reshard_after_forward = 2 for every unit (each
// keeps a post-forward shard over pairs of ranks: hpZ); per unit, one block
// kept after forward, one with hpZ in bf16 (an fp32 model), one offloaded, the
// root resharded after forward; HYBRID 2 x 2 with reshard_after_forward false
// (ZeRO-2 inside each shard group); and parameters left out of sharding
// (ignored_params: the root's output matrix, a block's first matrix). Every one
// peaks at the plan's bound to the byte.
TEST(MemoryContract, PerUnitOptionsAndIgnoredParametersPeakExactlyAtTheBound) {
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    int checked = 0;
    testing::OptionAxes full_shard;  // fp32 and bf16, checkpointing off and on
    full_shard.strategies = {ShardingStrategy::kFullShard};
    for (const Shape& shape : shapes()) {
      for (const char* variant : {"reshard_after_forward 2", "per-unit", "HYBRID ZeRO-2", "ignored parameters"}) {
        for (const auto& [combination, options] : testing::option_matrix(full_shard)) {
          FsdpOptions o = options;
          auto model = make_model(shape.config, /*meta=*/true, "");
          const std::string v = variant;
          if (v == "reshard_after_forward 2") {
            o.reshard_after_forward = ReshardAfterForward::to_group(2);
          } else if (v == "per-unit") {
            UnitOverride keep{{"blocks.0"}, {}, {}};
            keep.options.reshard_after_forward = ReshardAfterForward(false);
            UnitOverride pairs{{"blocks.1"}, {}, {}};
            pairs.options.reshard_after_forward = ReshardAfterForward::to_group(2);
            MixedPrecision bf16 = MixedPrecision::preset("bf16");
            bf16.master_dtype = o.mixed_precision.master_dtype;
            bf16.buffer_dtype = o.mixed_precision.buffer_dtype;
            pairs.options.mixed_precision = bf16;
            UnitOverride offload{{"blocks.2"}, {}, {}};
            offload.options.cpu_offload = true;
            UnitOverride root{{""}, {}, {}};
            root.options.reshard_after_forward = ReshardAfterForward(true);
            o.unit_overrides = {keep, pairs, offload, root};
          } else if (v == "HYBRID ZeRO-2") {
            o.strategy = ShardingStrategy::kHybridShard;
            o.hybrid_shard_size = 2;
            o.reshard_after_forward = ReshardAfterForward(false);
          } else {
            // Left to the caller: materialized (FSDP never initializes them),
            // in the compute dtype (FSDP neither casts them).
            for (auto& p : model->named_parameters(true)) {
              // Not w_in: the root's remaining parameters must still be used
              // first, as the plan assumes of a model without nn::CallOrder.
              if (p.key() != "w_out" && p.key() != "blocks.1.w1") continue;
              internals::rebind_data(p.value(), (at::randn(p.value().sizes()) * 0.1).to(o.mixed_precision.param_dtype));
              o.ignored_params.push_back(p.value());
            }
          }
          const ShardingPlan plan = plan_sharding(model.ptr(), pg.size(), pg.rank(), o);
          const Outcome got = run_model(pg, model, shape.config, o, /*steps=*/3, /*micro_batches=*/1);
          const std::string what = std::string(shape.name) + ", " + variant + ", " + combination;
          EXPECT_EQ(got.peak, plan.unsharded_bound(1)) << what << ": " << bytes_text(got.at_peak);
          EXPECT_EQ(got.left_over, 0) << what;
          if (v == "ignored parameters") {
            EXPECT_LT(plan.parameters, plan_sharding(make_model(shape.config, true, "").ptr(), pg.size(),
                                                     pg.rank(), FsdpOptions{}).parameters)
                << what;
          }
          ++checked;
        }
      }
    }
    EXPECT_EQ(checked, 2 * 4 * 2 * 4 * 2);
  });
}

// Micro-batches without synchronization keep every unit's gradients: the plan
// adds accumulation_bytes for them, and the step stays within it.
TEST(MemoryContract, GradientAccumulationStaysWithinTheBoundWithAccumulation) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    const testing::ToyConfig shape = shapes()[0].config;
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                               ShardingStrategy::kNoShard}) {
      for (const char* precision : {"fp32", "bf16", "bf16-pure"}) {
        FsdpOptions o;
        o.strategy = s;
        o.mixed_precision = MixedPrecision::preset(precision);
        const bool pure = o.mixed_precision.master_dtype == at::kBFloat16;
        const ShardingPlan plan = plan_sharding(testing::make_toy(shape, true, 3).ptr(), pg.size(), pg.rank(), o,
                                                pure ? at::kBFloat16 : at::kFloat);
        const Outcome got = run_steps(pg, shape, o, /*steps=*/2, /*micro_batches=*/3);
        const std::string what = std::string(to_string(s)) + ", " + precision;
        EXPECT_LE(got.peak, plan.unsharded_bound(3)) << what << ": " << bytes_text(got.at_peak);
        if (plan.step_unsharded_bytes > 0) {
          EXPECT_GT(got.peak, plan.step_unsharded_bytes) << what << ": accumulation holds more than one step";
        }
        EXPECT_EQ(got.left_over, s == ShardingStrategy::kNoShard ? got.at_peak.params : 0) << what;
      }
    }
  });
}

// Note [One-rank reductions]: over a shard group of one rank (world size 1,
// or HYBRID with shards of 1) a reduction runs no collective and holds no
// output buffer: with bf16 reductions (the compute copy's own dtype) nothing
// beyond the gradients themselves, with fp32 ones only their fp32 copy; the
// plan counts the same, and the peak is its bound to the byte.
TEST(MemoryContract, OneRankShardGroupsReduceWithoutAnOutputBuffer) {
  const testing::ToyConfig shape = shapes()[0].config;
  for (const int world : {1, 2}) {
    testing::run_distributed(world, [&](comm::ProcessGroup& pg) {
      for (const at::ScalarType reduce : {at::kBFloat16, at::kFloat}) {
        FsdpOptions o;
        o.strategy = world == 1 ? ShardingStrategy::kFullShard : ShardingStrategy::kHybridShard;
        o.hybrid_shard_size = 1;
        o.mixed_precision = MixedPrecision::preset("bf16");
        o.mixed_precision.reduce_dtype = reduce;
        const ShardingPlan plan = plan_sharding(testing::make_toy(shape, true, 3).ptr(), pg.size(), pg.rank(), o,
                                                at::kFloat);
        const Outcome got = run_steps(pg, shape, o, /*steps=*/3, /*micro_batches=*/1);
        const std::string what = std::string("world ") + std::to_string(world) + ", reduce " + c10::toString(reduce);
        EXPECT_EQ(got.peak, plan.unsharded_bound(1)) << what << ": " << bytes_text(got.at_peak);
        EXPECT_GT(got.peak, 0) << what;
        if (reduce == at::kBFloat16) EXPECT_EQ(got.at_peak.reductions, 0) << what << ": " << bytes_text(got.at_peak);
      }
    });
  }
}

// A compressed reduce-scatter (FsdpOptions::compression, bf16 or int8 on the
// wire) sums the decoded contributions in fp32 whatever the reduce dtype: its
// output is the gradient shard itself when that is fp32 and nothing else holds
// a sum, else an fp32 buffer (pure bf16: the shard is bf16). Its wire buffers
// are communication scratch, outside the ledger. The plan counts the same
// output, so the peak is the bound to the byte, with the compressed all-gather
// as well.
TEST(MemoryContract, CompressedReductionsPeakExactlyAtTheBound) {
  const testing::ToyConfig shape = shapes()[1].config;
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    int checked = 0;
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                               ShardingStrategy::kHybridShard}) {
      for (const char* precision : {"fp32", "bf16", "bf16-pure"}) {
        for (WireFormat wire : {WireFormat::kBf16, WireFormat::kInt8}) {
          FsdpOptions o;
          o.strategy = s;
          o.hybrid_shard_size = 2;
          o.mixed_precision = MixedPrecision::preset(precision);
          o.compression.reduce_scatter = wire;
          o.compression.all_gather = wire;
          const bool pure = o.mixed_precision.master_dtype == at::kBFloat16;
          const ShardingPlan plan = plan_sharding(testing::make_toy(shape, true, 3).ptr(), pg.size(), pg.rank(), o,
                                                  pure ? at::kBFloat16 : at::kFloat);
          const Outcome got = run_steps(pg, shape, o, /*steps=*/3, /*micro_batches=*/1);
          const std::string what = std::string(to_string(s)) + ", " + precision + ", " + to_string(wire) + " wire";
          EXPECT_EQ(got.peak, plan.unsharded_bound(1)) << what << ": " << bytes_text(got.at_peak);
          EXPECT_EQ(got.left_over, 0) << what;
          ++checked;
        }
      }
    }
    EXPECT_EQ(checked, 3 * 3 * 2);
  });
}

}  // namespace
}  // namespace fsdp

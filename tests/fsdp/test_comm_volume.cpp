// Communication volume per step equals the theoretical one, exactly:
//  FULL_SHARD / HYBRID : every non-root unit all-gathered twice (forward and
//                        backward), the root once (it stays unsharded from its
//                        forward to the end of backward, as in PyTorch FSDP),
//                        one reduce-scatter of every unit's padded flat
//                        gradient; HYBRID adds an all-reduce of each gradient
//                        shard across the replicas.
//  SHARD_GRAD_OP       : one all-gather and one reduce-scatter per unit.
//  NO_SHARD            : one all-reduce of every unit's flat gradient.
// Bytes are counted by the process groups on the full logical buffer (the
// all-gather output, the reduce-scatter input), fp32 here.
#include <gtest/gtest.h>

#include <regex>

#include "parity.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using testing::borrow;

namespace {

}  // namespace

// Frozen parameters: "" none; else the root's w_in, every block's b1, and all of
// block 1 (whose backward still runs: its input needs a gradient). They are
// gathered like the others but never reduced.
static void check_volume(const std::string& freeze) {
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    for (int w : {2, 4}) {
      testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
        testing::ToyConfig cfg;  // odd sizes: every flat parameter needs padding at 4
        auto model = testing::make_toy(cfg, false, 3);
        int64_t frozen_params = 0;
        if (!freeze.empty()) {
          const std::regex re(freeze);
          for (auto& p : model->named_parameters(true)) {
            if (!std::regex_search(p.key(), re)) continue;
            p.value().set_requires_grad(false);
            ++frozen_params;
          }
          ASSERT_EQ(frozen_params, 1 + 3 + 2);  // w_in, three b1, block 1's w1 and w2
        }
        FsdpOptions o;
        o.strategy = s;
        o.hybrid_shard_size = 2;
        auto sharded = fully_shard(model.ptr(), borrow(pg), o);
        auto x = torch::randn({2, cfg.d_in});
        auto y = torch::randn({2, cfg.d_out});
        for (int step = 0; step < 2; ++step) {
          sharded->take_step_counters();  // start from zero
          model->forward(x, y).backward();
          const StepCounters got = sharded->take_step_counters();

          int64_t ag = 0, rs = 0, ar = 0;
          const int64_t f32 = 4;
          int64_t frozen_entries = 0;
          for (const auto& u : sharded->units()) {
            const bool root = u.name.empty();
            if (!u.trainable) {
              // Gathered as its unit's other parameters, never reduced.
              ++frozen_entries;
              if (s == ShardingStrategy::kNoShard) continue;
              ag += (root || s == ShardingStrategy::kShardGradOp ? 1 : 2) * u.padded_numel * f32;
              continue;
            }
            switch (s) {
              case ShardingStrategy::kFullShard:
                ag += (root ? 1 : 2) * u.padded_numel * f32;
                rs += u.padded_numel * f32;
                break;
              case ShardingStrategy::kHybridShard:
                ag += (root ? 1 : 2) * u.padded_numel * f32;
                rs += u.padded_numel * f32;
                if (pg.size() / 2 > 1) ar += u.shard_numel * f32;
                break;
              case ShardingStrategy::kShardGradOp:
                ag += u.padded_numel * f32;
                rs += u.padded_numel * f32;
                break;
              case ShardingStrategy::kNoShard:
                EXPECT_EQ(u.padded_numel, u.numel);  // nothing to pad when replicated
                ar += u.numel * f32;
                break;
            }
          }
          EXPECT_EQ(got.allgather_bytes, ag) << to_string(s) << " W=" << pg.size() << " step " << step;
          EXPECT_EQ(got.reduce_scatter_bytes, rs) << to_string(s) << " W=" << pg.size() << " step " << step;
          EXPECT_EQ(got.allreduce_bytes, ar) << to_string(s) << " W=" << pg.size() << " step " << step;
          EXPECT_EQ(frozen_entries, freeze.empty() ? 0 : 4);  // the root and every block
        }
      });
    }
  }
}

TEST(CommVolume, EqualsTheTheoreticalVolumeForEveryStrategy) { check_volume(""); }

TEST(CommVolume, FrozenParametersAreGatheredButNeverReduced) { check_volume("^w_in$|b1$|blocks\\.1\\."); }

}  // namespace fsdp

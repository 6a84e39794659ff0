// Cross-rank agreement (checkpoint/agreement.h) on three real processes: every
// rank sees every report and reaches the same decision — usage error before
// damage before failure, the lowest rank first — and raises the same error.
#include <gtest/gtest.h>

#include <string>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

using checkpoint::Agreement;
using checkpoint::RankStatus;

// What `fn` throws, as "usage: ..." / "failure: ..." ("none" when nothing).
std::string thrown(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return std::string("usage: ") + checkpoint::strip_rank_tag(e.what());
  } catch (const Failure& e) {
    return std::string("failure: ") + checkpoint::strip_rank_tag(e.what());
  }
  return "none";
}

TEST(Agreement, EveryRankDecidesTheSameWay) {
  testing::run_distributed(3, [&](comm::ProcessGroup& pg) {
    const int r = pg.rank();
    // All succeed: every payload reaches every rank; nothing is raised.
    {
      const Agreement a = checkpoint::agree(pg, RankStatus::success("data of " + std::to_string(r)));
      EXPECT_TRUE(a.ok());
      ASSERT_EQ(a.ranks().size(), 3u);
      for (int k = 0; k < 3; ++k) EXPECT_EQ(a.ranks()[static_cast<size_t>(k)].payload, "data of " + std::to_string(k));
      EXPECT_EQ(thrown([&] { a.raise_if_failed("x failed"); }), "none");
    }
    // Failures on ranks 0 and 2: one Failure listing both, on every rank (rank 1 included).
    {
      const RankStatus mine = r == 1 ? RankStatus::success() : RankStatus::failure("disk full on " + std::to_string(r));
      const Agreement a = checkpoint::agree(pg, mine);
      EXPECT_EQ(a.deciding_rank(), 0);
      EXPECT_EQ(thrown([&] { a.raise_if_failed("saving x failed"); }),
                "failure: saving x failed: rank 0: disk full on 0; rank 2: disk full on 2");
    }
    // A damaged file on rank 2 outranks a failure on rank 0; a usage error on
    // rank 1 outranks both, and is raised as a UsageError with its own text.
    {
      RankStatus mine = RankStatus::success();
      if (r == 0) mine = RankStatus::failure("timeout");
      if (r == 2) {
        mine = RankStatus::capture([] { throw checkpoint::DamagedCheckpoint("step_00000002", "shard-0.bin", "truncated"); });
      }
      const Agreement damaged = checkpoint::agree(pg, mine);
      EXPECT_EQ(damaged.deciding_rank(), 2);
      EXPECT_EQ(damaged.decision().kind, RankStatus::Kind::kDamaged);
      EXPECT_EQ(damaged.decision().file, "shard-0.bin");
      if (r == 1) mine = RankStatus::capture([] { FSDP_CHECK(false, "another model: hidden size 32 vs 64"); });
      const Agreement usage = checkpoint::agree(pg, mine);
      EXPECT_EQ(usage.deciding_rank(), 1);
      EXPECT_EQ(thrown([&] { usage.raise_if_failed("loading failed"); }), "usage: another model: hidden size 32 vs 64");
    }
  });
}

}  // namespace
}  // namespace fsdp

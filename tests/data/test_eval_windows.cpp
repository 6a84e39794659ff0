// EvalWindows: every target exactly once across ranks, equal batch counts, padding.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/sampler.h"

#include <map>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

std::shared_ptr<const TokenDataset> numbered(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(i % 30000);
  return make_token_dataset(std::move(v), "numbered");
}

}  // namespace

TEST(EvalWindows, CoverEveryTargetExactlyOnceAcrossRanks) {
  // Token value == position, so a target's value says which position it predicts.
  for (int64_t n : {2, 9, 10, 11, 100, 101, 257}) {
    for (int64_t t : {1, 4, 10}) {
      for (int64_t w : {1, 2, 3, 4}) {
        for (int64_t bsz : {1, 3}) {
          const auto data = numbered(n);
          std::map<int64_t, int> seen;  // target position -> times
          int64_t total_targets = 0;
          std::vector<int64_t> nb;
          for (int64_t r = 0; r < w; ++r) {
            EvalWindows ev(data, t, w, r);
            nb.push_back(ev.num_batches(bsz));
            int64_t rank_targets = 0;
            for (int64_t i = 0; i < ev.num_batches(bsz); ++i) {
              const Batch b = ev.batch(i, bsz);
              ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{bsz, t}));
              for (int64_t row = 0; row < bsz; ++row) {
                for (int64_t c = 0; c < t; ++c) {
                  const int64_t y = b.targets[row][c].item<int64_t>();
                  if (y == kIgnoreIndex) continue;
                  // The input before a target is the token before it.
                  ASSERT_EQ(b.inputs[row][c].item<int64_t>(), y - 1);
                  seen[y]++;
                  ++rank_targets;
                }
              }
            }
            EXPECT_EQ(rank_targets, ev.local_targets()) << "n " << n << " T " << t << " W " << w << " r " << r;
            EXPECT_EQ(ev.total_targets(), n - 1);
            total_targets += ev.local_targets();
          }
          EXPECT_EQ(total_targets, n - 1);
          ASSERT_EQ(static_cast<int64_t>(seen.size()), n - 1) << "n " << n << " T " << t << " W " << w;
          for (const auto& [pos, times] : seen) {
            ASSERT_EQ(times, 1) << "position " << pos;
            ASSERT_GE(pos, 1);
            ASSERT_LT(pos, n);
          }
          for (int64_t x : nb) EXPECT_EQ(x, nb[0]) << "ranks must run the same number of batches";
        }
      }
    }
  }
}

TEST(EvalWindows, RoundRobinAssignmentAndCounts) {
  // N = 23, T = 5: windows start at 0, 5, 10, 15, 20 (the last has 2 targets).
  EvalWindows ev(numbered(23), 5, 2, 1);
  EXPECT_EQ(ev.total_windows(), 5);
  EXPECT_EQ(ev.windows_for_rank(0), 3);
  EXPECT_EQ(ev.windows_for_rank(1), 2);
  EXPECT_EQ(ev.global_window(0), 1);
  EXPECT_EQ(ev.global_window(1), 3);
  EXPECT_EQ(ev.targets_for_rank(0), 5 + 5 + 2);
  EXPECT_EQ(ev.targets_for_rank(1), 10);
  EXPECT_EQ(ev.num_batches(2), 2);
  const Batch b = ev.batch(0, 2);
  EXPECT_EQ(b.inputs[0][0].item<int64_t>(), 5);
  EXPECT_EQ(b.inputs[1][0].item<int64_t>(), 15);
  const Batch pad = ev.batch(1, 2);  // rank 1 has no third window: all padding
  EXPECT_TRUE(pad.targets.eq(kIgnoreIndex).all().item<bool>());
  EvalWindows r0(numbered(23), 5, 2, 0);
  const Batch last = r0.batch(1, 2);  // window 4: tokens 20, 21 -> targets 21, 22
  EXPECT_EQ(last.targets[0][0].item<int64_t>(), 21);
  EXPECT_EQ(last.targets[0][1].item<int64_t>(), 22);
  EXPECT_EQ(last.targets[0][2].item<int64_t>(), kIgnoreIndex);
  EXPECT_EQ(last.inputs[0][2].item<int64_t>(), 0);
}

TEST(EvalWindows, MaxWindowsAndErrors) {
  EvalWindows ev(numbered(1000), 10, 1, 0, /*max_windows=*/7);
  EXPECT_EQ(ev.total_windows(), 7);
  EXPECT_EQ(ev.total_targets(), 70);
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([] { EvalWindows(numbered(1), 4); }), "has 1 tokens");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { ev.batch(1, 7); }), "eval batch 1 is outside [0, num_batches 1)");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([] { EvalWindows(numbered(100), 4, 2, 2); }), "rank 2 is outside");
}

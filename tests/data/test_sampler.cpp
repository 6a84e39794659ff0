// The global-batch rule, the shuffle and the window contents.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

using Sample = BatchSampler::Sample;

// Tokens t[i] = (i * 7919) mod 50021: distinct enough to identify a window.
std::shared_ptr<const TokenDataset> numbered(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7919) % 50021);
  return make_token_dataset(std::move(v), "numbered");
}

SamplerOptions opts(int64_t t, int64_t b, int64_t w, int64_t r, int64_t a, uint64_t seed = 5, bool shuffle = true) {
  SamplerOptions o;
  o.seq_len = t;
  o.batch_size = b;
  o.world_size = w;
  o.rank = r;
  o.grad_accum = a;
  o.seed = seed;
  o.shuffle = shuffle;
  return o;
}

// WindowPermutation(10, seed 0, epoch 0), recorded once: see the golden test.
std::vector<int64_t> perm_golden_10() { return {1, 0, 8, 4, 6, 9, 5, 3, 7, 2}; }

}  // namespace

TEST(WindowPermutation, IsABijectionForManySizes) {
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 13, 64, 100, 257, 1000, 4099}) {
    for (int64_t epoch : {0, 1, 9}) {
      WindowPermutation p(n, 42, epoch);
      std::vector<char> seen(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t y = p(i);
        ASSERT_GE(y, 0);
        ASSERT_LT(y, n);
        ASSERT_FALSE(seen[y]) << "n " << n << " epoch " << epoch << " value " << y << " twice";
        seen[y] = 1;
      }
    }
  }
}

TEST(WindowPermutation, DeterministicAndKeyedBySeedAndEpoch) {
  const int64_t n = 1000;
  auto perm = [&](uint64_t seed, int64_t epoch) {
    std::vector<int64_t> v;
    WindowPermutation p(n, seed, epoch);
    for (int64_t i = 0; i < n; ++i) v.push_back(p(i));
    return v;
  };
  EXPECT_EQ(perm(1, 0), perm(1, 0));
  EXPECT_NE(perm(1, 0), perm(1, 1));
  EXPECT_NE(perm(1, 0), perm(2, 0));
  // Shuffled: few fixed points, and not close to the identity.
  const auto v = perm(1, 0);
  int fixed = 0;
  for (int64_t i = 0; i < n; ++i) fixed += v[i] == i;
  EXPECT_LT(fixed, 10);
  // Golden values: the order must not change across platforms or releases (a
  // change breaks exact resume of runs in flight).
  WindowPermutation p(10, 0, 0);
  std::vector<int64_t> first;
  for (int64_t i = 0; i < 10; ++i) first.push_back(p(i));
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(first, perm_golden_10());
}

TEST(BatchSampler, GlobalBatchIsTheSameSetForEveryLayout) {
  // N = 200, T = 15 -> K = 13 windows; G = 8, so steps wrap epochs mid-step.
  const auto data = numbered(200);
  struct Layout {
    int64_t w, a, b;
  };
  const Layout layouts[] = {{1, 1, 8}, {2, 1, 4}, {4, 1, 2}, {1, 2, 4}, {2, 2, 2}, {4, 2, 1}};
  for (bool shuffle : {true, false}) {
    for (int64_t step = 0; step < 12; ++step) {
      std::multiset<Sample> reference;
      for (const auto& l : layouts) {
        std::multiset<Sample> all;
        std::set<Sample> unique;
        for (int64_t r = 0; r < l.w; ++r) {
          BatchSampler s(data, opts(15, l.b, l.w, r, l.a, 5, shuffle));
          ASSERT_EQ(s.global_batch_size(), 8);
          ASSERT_EQ(s.samples_per_epoch(), 13);
          for (int64_t a = 0; a < l.a; ++a) {
            for (const auto& x : s.samples(step, a)) {
              all.insert(x);
              unique.insert(x);
            }
          }
        }
        // Disjoint shares: no (epoch, window) is taken twice across ranks and micro-steps.
        EXPECT_EQ(unique.size(), all.size()) << "step " << step << " W " << l.w << " A " << l.a;
        if (reference.empty()) reference = all;
        EXPECT_EQ(all, reference) << "step " << step << " W " << l.w << " A " << l.a;
      }
    }
  }
}

TEST(BatchSampler, RowsAreTheirWindows) {
  const auto data = numbered(1000);
  std::vector<int32_t> t(1000);
  data->read(0, 1000, t.data());
  BatchSampler s(data, opts(16, 3, 2, 1, 2));
  for (int64_t step : {0, 5, 100}) {
    for (int64_t a = 0; a < 2; ++a) {
      const auto batch = s.get(step, a);
      EXPECT_EQ(batch.step, step);
      EXPECT_EQ(batch.micro_step, a);
      ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 16}));
      ASSERT_EQ(batch.inputs.scalar_type(), at::kLong);
      ASSERT_TRUE(batch.targets.is_contiguous());
      const auto rows = s.samples(step, a);
      for (int64_t b = 0; b < 3; ++b) {
        const int64_t start = rows[b].window * 16;
        for (int64_t i = 0; i < 16; ++i) {
          ASSERT_EQ(batch.inputs[b][i].item<int64_t>(), t[start + i]);
          ASSERT_EQ(batch.targets[b][i].item<int64_t>(), t[start + i + 1]);
        }
      }
    }
  }
}

TEST(BatchSampler, EachEpochVisitsEveryWindowOnceThenReshuffles) {
  // K = (101 - 1) / 10 = 10 windows, G = 4: epochs wrap inside steps 2, 4, 7, ...
  const auto data = numbered(101);
  BatchSampler s(data, opts(10, 2, 2, 0, 1, 9));
  BatchSampler s1(data, opts(10, 2, 2, 1, 1, 9));
  ASSERT_EQ(s.samples_per_epoch(), 10);
  std::vector<std::vector<int64_t>> by_epoch(4);
  for (int64_t step = 0; step < 10; ++step) {
    for (const auto* sampler : {&s, &s1}) {
      for (const auto& x : sampler->samples(step, 0)) by_epoch[x.epoch].push_back(x.window);
    }
  }
  for (int e = 0; e < 4; ++e) {
    auto v = by_epoch[e];
    std::sort(v.begin(), v.end());
    EXPECT_EQ(v, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "epoch " << e;
  }
  // The order differs between epochs; g -> (epoch, window) is the documented rule.
  std::vector<int64_t> o0, o1;
  for (int64_t i = 0; i < 10; ++i) {
    o0.push_back(s.sample(i).window);
    o1.push_back(s.sample(10 + i).window);
    EXPECT_EQ(s.sample(10 + i).epoch, 1);
    EXPECT_EQ(s.sample(i).window, WindowPermutation(10, 9, 0)(i));
  }
  EXPECT_NE(o0, o1);
  EXPECT_DOUBLE_EQ(s.epochs_after(5), 2.0);
  // No shuffle: windows in order, every epoch.
  BatchSampler plain(data, opts(10, 2, 1, 0, 1, 9, false));
  for (int64_t g = 0; g < 30; ++g) EXPECT_EQ(plain.sample(g).window, g % 10);
}

TEST(BatchSampler, DeterministicAcrossInstances) {
  const auto data = numbered(5000);
  BatchSampler a(data, opts(32, 4, 1, 0, 1, 77));
  BatchSampler b(data, opts(32, 4, 1, 0, 1, 77));
  BatchSampler c(data, opts(32, 4, 1, 0, 1, 78));
  EXPECT_TRUE(a.get(3, 0).inputs.equal(b.get(3, 0).inputs));
  EXPECT_FALSE(a.get(3, 0).inputs.equal(c.get(3, 0).inputs));
}

TEST(BatchSampler, RejectsBadArguments) {
  const auto data = numbered(100);
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { BatchSampler(data, opts(10, 1, 2, 2, 1)); }),
                  "rank 2 is outside [0, world_size 2)");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { BatchSampler(data, opts(0, 1, 1, 0, 1)); }), "seq_len must be >= 1");
  BatchSampler s(data, opts(10, 1, 1, 0, 2));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { s.get(0, 2); }), "micro_step 2 is outside [0, grad_accum 2)");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { s.get(-1, 0); }), "step must be >= 0");
}

#include <gtest/gtest.h>

#include <c10/core/CPUAllocator.h>

#include <chrono>
#include <iostream>

#include "fsdp/nn/init.h"
#include "support/counting_allocator.h"

using fsdp::nn::InitRule;
using fsdp::nn::init_slice;

TEST(Init, AnySliceEqualsTheSameSliceOfTheWhole) {
  const int64_t n = 1000;
  auto whole = at::empty({n});
  init_slice(whole, InitRule::normal(0.02), 7, "layers.0.w", 0);
  for (int64_t first : {0, 1, 333, 999}) {
    for (int64_t len : {1, 17, 1}) {
      if (first + len > n) continue;
      auto part = at::empty({len});
      init_slice(part, InitRule::normal(0.02), 7, "layers.0.w", first);
      EXPECT_TRUE(part.equal(whole.narrow(0, first, len))) << "first=" << first << " len=" << len;
    }
  }
}

TEST(Init, NormalHasTheRequestedMomentsAndNamesDiffer) {
  auto a = at::empty({200000});
  auto b = at::empty({200000});
  init_slice(a, InitRule::normal(0.5), 1, "a", 0);
  init_slice(b, InitRule::normal(0.5), 1, "b", 0);
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(a.std().item<double>(), 0.5, 0.01);
  EXPECT_FALSE(a.equal(b));
  auto u = at::empty({200000});
  init_slice(u, InitRule::uniform(2.0), 1, "u", 0);
  EXPECT_LE(u.abs().max().item<double>(), 2.0);
  EXPECT_NEAR(u.std().item<double>(), 2.0 / std::sqrt(3.0), 0.02);
}

// An embedding's padding row: zero in the whole and in every slice that
// overlaps it, the other elements unchanged — so a rank materializing a shard
// that cuts through the row gets exactly the unsharded values.
TEST(Init, ZeroRangeHoldsInEverySlice) {
  const int64_t n = 1000;
  const InitRule plain = InitRule::normal(0.02);
  const InitRule padded = plain.with_zeros(320, 352);  // row 10 of a (V, 32) embedding
  auto reference = at::empty({n});
  init_slice(reference, plain, 7, "embed_tokens.weight", 0);
  auto whole = at::empty({n});
  init_slice(whole, padded, 7, "embed_tokens.weight", 0);
  EXPECT_TRUE(whole.narrow(0, 320, 32).eq(0).all().item<bool>());
  EXPECT_TRUE(whole.narrow(0, 0, 320).equal(reference.narrow(0, 0, 320)));
  EXPECT_TRUE(whole.narrow(0, 352, n - 352).equal(reference.narrow(0, 352, n - 352)));
  for (int64_t first : {0, 300, 330, 351, 352, 600}) {
    for (int64_t len : {1, 10, 40, 400}) {
      if (first + len > n) continue;
      auto part = at::empty({len});
      init_slice(part, padded, 7, "embed_tokens.weight", first);
      EXPECT_TRUE(part.equal(whole.narrow(0, first, len))) << "first=" << first << " len=" << len;
    }
  }
}

// Note [Initialization in large blocks]: slices across the 2^20-element blocks
// equal the whole's; each dtype holds the double values rounded as copy_
// rounds them; a CPU destination is written in place (no buffer of the
// slice's size), and the values do not depend on the number of threads.
TEST(Init, LargeBlocksRoundAsCopyDoesAndNeedNoBufferOnTheCpu) {
  const int64_t n = 3 * (int64_t{1} << 20) + 77;
  auto exact = at::empty({n}, at::kDouble);
  init_slice(exact, InitRule::normal(0.02), 3, "embed.weight", 5);
  for (const at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    auto t = at::empty({n}, at::TensorOptions().dtype(dt));
    init_slice(t, InitRule::normal(0.02), 3, "embed.weight", 5);
    EXPECT_TRUE(t.equal(exact.to(dt))) << dt;
  }
  auto whole = at::empty({n});
  c10::Allocator* original = c10::GetCPUAllocator();
  static fsdp::testing::CountingAllocator& counting = *new fsdp::testing::CountingAllocator(original);
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  counting.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  init_slice(whole, InitRule::normal(0.02), 3, "embed.weight", 5);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t largest = counting.largest();
  c10::SetCPUAllocator(original, /*priority=*/101);
  std::cout << "[init] " << n << " fp32 elements in " << secs << " s on " << at::get_num_threads()
            << " threads; largest allocation " << largest << " bytes\n";
  EXPECT_LT(largest, int64_t{1} << 16);
  for (const int64_t first : {(int64_t{1} << 20) - 3, int64_t{2} << 20, n - 9}) {
    auto part = at::empty({9});
    init_slice(part, InitRule::normal(0.02), 3, "embed.weight", 5 + first);
    EXPECT_TRUE(part.equal(whole.narrow(0, first, 9))) << "first=" << first;
  }
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto one = at::empty({n});
  init_slice(one, InitRule::normal(0.02), 3, "embed.weight", 5);
  at::set_num_threads(threads);
  EXPECT_TRUE(one.equal(whole));
}

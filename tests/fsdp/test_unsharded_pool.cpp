// UnshardedPool (Note [Preallocated pool] in src/fsdp/unsharded_pool.cpp) on the
// CPU: the allocator logic is the device's too.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "fsdp/common/internals.h"
#include "fsdp/unsharded_pool.h"

namespace fsdp::detail {
namespace {

constexpr int64_t kA = UnshardedPool::kAlignment;

TEST(UnshardedPool, BlocksAreAlignedDisjointAndComeBackWhenFreed) {
  UnshardedPool pool(at::kCPU, 10 * kA);
  EXPECT_EQ(pool.stats().capacity, 10 * kA);
  at::Tensor a = pool.empty(kA / 4, at::kFloat);      // one block
  at::Tensor b = pool.empty(kA / 4 + 1, at::kFloat);  // rounded up: two blocks
  at::Tensor c = pool.empty(3, at::kBFloat16);        // one block
  for (const at::Tensor* t : {&a, &b, &c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data_ptr()) % kA, 0u);
  }
  a.fill_(1);
  b.fill_(2);
  c.fill_(3);
  EXPECT_EQ(a.sum().item<double>(), kA / 4);  // b and c did not write into a
  EXPECT_EQ(pool.stats().in_use, 4 * kA);
  EXPECT_EQ(pool.stats().peak, 4 * kA);
  b = at::Tensor();  // the middle range returns
  EXPECT_EQ(pool.stats().in_use, 2 * kA);
  at::Tensor d = pool.empty(2 * kA / 4, at::kFloat);  // fits the freed middle: first fit
  EXPECT_EQ(static_cast<char*>(d.data_ptr()) - static_cast<char*>(a.data_ptr()), kA);
  EXPECT_EQ(pool.stats().overflows, 0);
  EXPECT_EQ(pool.stats().peak, 4 * kA);
}

// Buffers in flight to a reduction come from the high end, so their
// first-in-first-out releases do not split the low end's free space.
TEST(UnshardedPool, ReductionBuffersComeFromTheHighEnd) {
  UnshardedPool pool(at::kCPU, 8 * kA);
  at::Tensor low = pool.empty(kA, at::kByte);
  at::Tensor r1 = pool.empty(2 * kA, at::kByte, UnshardedPool::End::kHigh);
  at::Tensor r2 = pool.empty(2 * kA, at::kByte, UnshardedPool::End::kHigh);
  auto at_ = [&](const at::Tensor& t) { return static_cast<char*>(t.data_ptr()) - static_cast<char*>(low.data_ptr()); };
  EXPECT_EQ(at_(r1), 6 * kA);
  EXPECT_EQ(at_(r2), 4 * kA);
  r1 = at::Tensor();  // the first reduction finishes
  at::Tensor big = pool.empty(3 * kA, at::kByte);  // the low end stays whole: [1, 4)
  EXPECT_EQ(at_(big), kA);
  EXPECT_EQ(pool.stats().overflows, 0);
}

TEST(UnshardedPool, FreedNeighboursMergeSoALargeBlockFitsAgain) {
  UnshardedPool pool(at::kCPU, 4 * kA);
  std::vector<at::Tensor> four;
  for (int i = 0; i < 4; ++i) four.push_back(pool.empty(kA, at::kByte));
  // Free in an order that needs merging on both sides.
  for (int i : {1, 3, 2, 0}) four[static_cast<size_t>(i)] = at::Tensor();
  EXPECT_EQ(pool.stats().in_use, 0);
  at::Tensor whole = pool.empty(4 * kA, at::kByte);
  EXPECT_EQ(pool.stats().overflows, 0) << "freed ranges were not merged";
}

TEST(UnshardedPool, WhatDoesNotFitComesFromTheDeviceAllocatorAndIsCounted) {
  UnshardedPool pool(at::kCPU, 2 * kA);
  at::Tensor a = pool.empty(kA, at::kByte);
  at::Tensor big = pool.empty(2 * kA, at::kByte);  // 1 block free, 2 asked
  big.fill_(7);                                    // usable memory all the same
  EXPECT_EQ(big.sum().item<int64_t>(), 7 * 2 * kA);
  const UnshardedPool::Stats s = pool.stats();
  EXPECT_EQ(s.overflows, 1);
  EXPECT_EQ(s.overflow_bytes, 2 * kA);
  EXPECT_EQ(s.in_use, kA);
}

// The engine frees and refills a flat buffer through its storage (the FSDP1
// trick): the refill comes from the pool again, views stay valid.
TEST(UnshardedPool, StorageFreedAndRefilledGoesThroughThePool) {
  UnshardedPool pool(at::kCPU, 4 * kA);
  at::Tensor full = pool.empty(kA, at::kFloat);  // 4 blocks: the whole pool
  at::Tensor view = full.narrow(0, 8, 16);
  EXPECT_EQ(pool.stats().in_use, 4 * kA);
  internals::free_storage(full);
  EXPECT_EQ(pool.stats().in_use, 0);
  internals::alloc_storage(full, static_cast<size_t>(kA) * sizeof(float));
  EXPECT_EQ(pool.stats().in_use, 4 * kA);
  EXPECT_EQ(pool.stats().overflows, 0);
  full.fill_(5);
  EXPECT_EQ(view.sum().item<float>(), 5 * 16);
}

TEST(UnshardedPool, BlocksMayBeReleasedOnOtherThreads) {
  UnshardedPool pool(at::kCPU, 64 * kA);
  for (int round = 0; round < 20; ++round) {
    std::vector<at::Tensor> ts;
    for (int i = 0; i < 32; ++i) ts.push_back(pool.empty(kA, at::kByte));
    std::thread t1([&] { for (int i = 0; i < 16; ++i) ts[static_cast<size_t>(i)] = at::Tensor(); });
    std::thread t2([&] { for (int i = 16; i < 32; ++i) ts[static_cast<size_t>(i)] = at::Tensor(); });
    t1.join();
    t2.join();
    ASSERT_EQ(pool.stats().in_use, 0);
  }
  EXPECT_EQ(pool.empty(64 * kA, at::kByte).numel(), 64 * kA);
  EXPECT_EQ(pool.stats().overflows, 0);
}

}  // namespace
}  // namespace fsdp::detail

// UnshardedPool: the device memory of a model's unsharded buffers, allocated
// once when the model is sharded. See Note [Preallocated pool] in
// unsharded_pool.cpp.
//
// Tensors made here (empty) are 1-D, of the pool's device, and their storage
// allocates from the pool again after internals::free_storage /
// alloc_storage, so a flat parameter's buffer is freed and refilled without
// going through the caching allocator. Thread-safe: a block may be released on
// any thread.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace fsdp::detail {

class UnshardedPool {
 public:
  // Blocks start at multiples of this (CUDA kernels read vectors of up to
  // 16 bytes; NCCL prefers 256-byte alignment); every size is rounded up to it.
  static constexpr int64_t kAlignment = 256;

  // One allocation of `capacity_bytes` (rounded up to kAlignment) on `device`,
  // from the device's own allocator (CUDA: the caching allocator, once).
  UnshardedPool(at::Device device, int64_t capacity_bytes);
  ~UnshardedPool();
  UnshardedPool(const UnshardedPool&) = delete;
  UnshardedPool& operator=(const UnshardedPool&) = delete;

  // Which end of the pool a buffer is placed from (Note [Preallocated pool]):
  // kLow for buffers used and released by a unit (parameters, gradients),
  // kHigh for buffers in flight to a reduction (released first in, first out).
  enum class End { kLow, kHigh };

  // An empty 1-D tensor of `numel` elements of `dtype` from the pool, placed
  // from `end`. When no free range is large enough (the plan was exceeded,
  // or its free ranges are fragmented) the bytes come from the device's
  // allocator instead, and stats().overflows counts it: correct, but outside
  // the planned memory.
  at::Tensor empty(int64_t numel, at::ScalarType dtype, End end = End::kLow);

  struct Stats {
    int64_t capacity = 0;   // bytes of the one allocation
    int64_t in_use = 0;     // bytes of blocks handed out now (rounded sizes)
    int64_t peak = 0;       // the largest in_use since construction or reset_peak
    int64_t reclaims = 0;   // times the reclaim callback freed something for a request
    int64_t overflows = 0;  // requests served by the device allocator instead
    int64_t overflow_bytes = 0;
  };
  Stats stats() const;
  void reset_peak();

  // Called when no free range fits a request: it may release blocks (the
  // engine finishes its oldest reduction in flight) and returns whether it
  // did, and the request is tried again; false: the request overflows. Runs
  // on the allocating thread, outside the pool's lock. Empty: none.
  void set_reclaim(std::function<bool()> reclaim);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace fsdp::detail

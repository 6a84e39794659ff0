#include "fsdp/unsharded_pool.h"

#include <c10/core/Allocator.h>

#include <map>
#include <mutex>

#include "fsdp/common/error.h"

namespace fsdp::detail {

// Note [Preallocated pool]
// On CUDA the engine's unsharded buffers — gathered parameters, unsharded
// gradients, reduce-dtype copies and reduction scratch — come from one
// allocation sized by plan_sharding's step bound (Note [Unsharded memory] in
// plan.cpp), made when the model is sharded: peak device memory is what the
// plan says, to the byte, and nothing unsharded goes through the caching
// allocator during a step (docs/design.md, "GPU specifics").
//
// Why no recordStream and no event per block: a block is reused only after
// the host released it, and the host releases a block only once every device
// use of it is ordered before anything issued later on the compute stream:
//  - compute kernels read or write it on the compute stream;
//  - a collective that writes it (all-gather) or reads it (reduce-scatter,
//    all-reduce) runs on its lane's stream, and the host releases the block
//    only after Work::wait(), which makes the compute stream wait on the
//    collective's event (Note [NCCL lanes] in comm/nccl_group.cpp);
//  - the next user is a kernel on the compute stream (ordered after), or a
//    collective, whose lane first waits on an event recorded on the compute
//    stream when it is issued (ordered after as well).
// So every device access to a block's previous owner precedes every access
// by its next one, without a host synchronization. The caching allocator would
// need recordStream for the same guarantee, and would hold freed blocks
// until the lanes' events complete (memory the plan cannot see).
//
// Allocation is first fit over free ranges sorted by offset, coalescing
// neighbours on release. The schedule allocates in a fixed order every step,
// so the ranges it gets are the same every step once the first has run.
struct UnshardedPool::State final : c10::Allocator {
  State(at::Device d, int64_t capacity) : device(d) {
    // One alignment more, so that the first block starts aligned whatever
    // the device allocator's own alignment (the CPU's is 64 bytes).
    base = at::empty({capacity + kAlignment}, at::TensorOptions().dtype(at::kByte).device(device));
    const auto addr = reinterpret_cast<uintptr_t>(base.data_ptr());
    start = static_cast<uint8_t*>(base.data_ptr()) + (kAlignment - addr % kAlignment) % kAlignment;
    stats.capacity = capacity;
    free_ranges[0] = capacity;
  }

  struct Block {
    int64_t offset;
    int64_t bytes;
    std::shared_ptr<State> pool;
  };

  static void release(void* ctx) {
    std::unique_ptr<Block> b(static_cast<Block*>(ctx));
    State& s = *b->pool;
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.in_use -= b->bytes;
    auto next = s.free_ranges.lower_bound(b->offset);
    int64_t begin = b->offset, size = b->bytes;
    if (next != s.free_ranges.end() && next->first == begin + size) {  // merge with the following range
      size += next->second;
      next = s.free_ranges.erase(next);
    }
    if (next != s.free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == begin) {  // merge into the preceding range
        prev->second += size;
        return;
      }
    }
    s.free_ranges[begin] = size;
  }

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, device);
    const int64_t bytes = (static_cast<int64_t>(n) + kAlignment - 1) / kAlignment * kAlignment;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
        if (it->second < bytes) continue;
        const int64_t offset = it->first;
        const int64_t rest = it->second - bytes;
        free_ranges.erase(it);
        if (rest > 0) free_ranges[offset + bytes] = rest;
        stats.in_use += bytes;
        stats.peak = std::max(stats.peak, stats.in_use);
        void* p = start + offset;
        return c10::DataPtr(p, new Block{offset, bytes, self.lock()}, &State::release, device);
      }
      ++stats.overflows;
      stats.overflow_bytes += bytes;
    }
    return c10::GetAllocator(device.type())->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    c10::GetAllocator(device.type())->copy_data(dest, src, count);
  }

  const at::Device device;
  at::Tensor base;         // (capacity + kAlignment) bytes: every block lies in it
  uint8_t* start = nullptr;  // base's first kAlignment-aligned byte: block offsets count from here
  std::weak_ptr<State> self;
  mutable std::mutex mu;               // guards the members below
  std::map<int64_t, int64_t> free_ranges;  // offset -> bytes, disjoint, never adjacent
  Stats stats;
};

UnshardedPool::UnshardedPool(at::Device device, int64_t capacity_bytes) {
  FSDP_ASSERT(capacity_bytes >= 0, "pool capacity ", capacity_bytes);
  const int64_t capacity = (capacity_bytes + kAlignment - 1) / kAlignment * kAlignment;
  state_ = std::make_shared<State>(device, capacity);
  state_->self = state_;
}

UnshardedPool::~UnshardedPool() = default;

at::Tensor UnshardedPool::empty(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, state_.get(), /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(state_->device)).set_(storage, 0, {numel}, {1});
}

UnshardedPool::Stats UnshardedPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

void UnshardedPool::reset_peak() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stats.peak = state_->stats.in_use;
}

}  // namespace fsdp::detail

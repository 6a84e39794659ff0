#include "fsdp/unsharded_pool.h"

#include <c10/core/Allocator.h>

#include <algorithm>
#include <functional>
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
// Placement: two ends. Buffers that live from a unit's use to its release
// (parameters, gradients) are placed from the low end, first fit; buffers
// in flight to a reduction, released first in first out (up to
// kMaxInflightReduces at a time), from the high end, highest fit. Mixed in
// one first-fit order, the reductions' queue splits the free space: the
// memory-contract test found the root's last reduce-dtype copy without a
// contiguous range while the total free sufficed (a root larger than two
// blocks, bf16, NO_SHARD and HYBRID). Freed neighbours merge. The schedule
// allocates in a fixed order every step, so the ranges are the same every
// step once the first has run.
//
// What placement cannot prevent: at a moment where the plan's bound is
// exact, reductions released first in first out leave a hole among the
// live ones (three slots of a ring, two in use), and a larger buffer (the
// root's last reduce-dtype copy) finds no contiguous range. Then the pool
// asks the engine to reclaim (set_reclaim): the engine finishes its oldest
// reduction in flight — a stream wait, no host sync — and the request is
// tried again, so memory stays within the plan at the cost of one
// reduction's overlap. Only when nothing is left to reclaim does a request
// overflow to the device allocator.
struct UnshardedPool::State {
  State(at::Device d, int64_t capacity) : device(d) {
    // One alignment more, so that the first block starts aligned whatever
    // the device allocator's own alignment (the CPU's is 64 bytes).
    base = at::empty({capacity + kAlignment}, at::TensorOptions().dtype(at::kByte).device(device));
    const auto addr = reinterpret_cast<uintptr_t>(base.data_ptr());
    start = static_cast<uint8_t*>(base.data_ptr()) + (kAlignment - addr % kAlignment) % kAlignment;
    stats.capacity = capacity;
    free_ranges[0] = capacity;
  }

  // What a storage allocates from (its refills too): one per end.
  struct End final : c10::Allocator {
    End(State* s, bool h) : state(s), high(h) {}
    c10::DataPtr allocate(size_t n) override { return state->allocate(n, high); }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
      c10::GetAllocator(state->device.type())->copy_data(dest, src, count);
    }
    State* state;
    bool high;
  };

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

  c10::DataPtr allocate(size_t n, bool high) {
    if (n == 0) return c10::DataPtr(nullptr, device);
    const int64_t bytes = (static_cast<int64_t>(n) + kAlignment - 1) / kAlignment * kAlignment;
    while (true) {
      std::unique_lock<std::mutex> lock(mu);
      auto fits = [&](const std::pair<const int64_t, int64_t>& r) { return r.second >= bytes; };
      auto it = free_ranges.end();
      if (high) {
        auto r = std::find_if(free_ranges.rbegin(), free_ranges.rend(), fits);
        if (r != free_ranges.rend()) it = std::prev(r.base());
      } else {
        it = std::find_if(free_ranges.begin(), free_ranges.end(), fits);
      }
      if (it != free_ranges.end()) {
        const int64_t range = it->first, size = it->second;
        free_ranges.erase(it);
        // Low: the range's start; high: its end.
        const int64_t offset = high ? range + size - bytes : range;
        if (size > bytes) free_ranges[high ? range : range + bytes] = size - bytes;
        stats.in_use += bytes;
        stats.peak = std::max(stats.peak, stats.in_use);
        void* p = start + offset;
        return c10::DataPtr(p, new Block{offset, bytes, self.lock()}, &State::release, device);
      }
      // Outside the lock: reclaiming releases blocks.
      const std::function<bool()> again = reclaim;
      lock.unlock();
      if (again && again()) {
        std::lock_guard<std::mutex> relock(mu);
        ++stats.reclaims;
        continue;
      }
      lock.lock();
      ++stats.overflows;
      stats.overflow_bytes += bytes;
      break;
    }
    return c10::GetAllocator(device.type())->allocate(n);
  }

  const at::Device device;
  End low{this, false};
  End high{this, true};
  at::Tensor base;         // (capacity + kAlignment) bytes: every block lies in it
  uint8_t* start = nullptr;  // base's first kAlignment-aligned byte: block offsets count from here
  std::weak_ptr<State> self;
  mutable std::mutex mu;               // guards the members below
  std::map<int64_t, int64_t> free_ranges;  // offset -> bytes, disjoint, never adjacent
  Stats stats;
  std::function<bool()> reclaim;  // may be empty
};

UnshardedPool::UnshardedPool(at::Device device, int64_t capacity_bytes) {
  FSDP_ASSERT(capacity_bytes >= 0, "pool capacity ", capacity_bytes);
  const int64_t capacity = (capacity_bytes + kAlignment - 1) / kAlignment * kAlignment;
  state_ = std::make_shared<State>(device, capacity);
  state_->self = state_;
}

UnshardedPool::~UnshardedPool() = default;

at::Tensor UnshardedPool::empty(int64_t numel, at::ScalarType dtype, End end) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Allocator* from = end == End::kHigh ? static_cast<c10::Allocator*>(&state_->high) : &state_->low;
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, from, /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(state_->device)).set_(storage, 0, {numel}, {1});
}

UnshardedPool::Stats UnshardedPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

void UnshardedPool::set_reclaim(std::function<bool()> reclaim) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->reclaim = std::move(reclaim);
}

void UnshardedPool::reset_peak() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stats.peak = state_->stats.in_use;
}

}  // namespace fsdp::detail

#include "fsdp/collectives.h"

#include "fsdp/compressed_collectives.h"

#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"

namespace fsdp::detail {

namespace {
int64_t nbytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }
}  // namespace

// Note [Offload staging]
// A copy between the host and the device that also changes the dtype makes
// LibTorch allocate a temporary of the whole shard on the device (copy_ casts
// on the device for a non-blocking copy): until 9fc8542 every offloaded
// gather and reduction took a shard-sized fp32 buffer from the caching
// allocator, outside the pool and the plan's bound. The engine now makes that
// buffer itself, from the pool, and does the two steps apart: a same-dtype
// non-blocking copy between pinned host memory and the staging buffer, and
// the cast on the device. plan.cpp's replay counts it (Note [Unsharded
// memory]). The gather's staging goes back to the pool at once: its next user
// is ordered after the cast by the compute stream (Note [Preallocated pool]).
AllGather all_gather_copy_in(comm::ProcessGroup& group, const at::Tensor& shard, const at::Tensor& full,
                             const at::Tensor& chunk, UnshardedPool* pool, MemoryLedger& ledger,
                             const Wire* wire) {
  if (wire != nullptr && wire->gather != WireFormat::kNative) return all_gather_encoded(group, shard, full, *wire);
  {
    RawWriteGuard g;
    // Casts to the param dtype. From a pinned host shard (CPU offload) the
    // copy is asynchronous on the compute stream; the host writes the shard
    // again only in the optimizer step, after the end of backward's
    // synchronization.
    if (shard.device() != chunk.device() && shard.scalar_type() != chunk.scalar_type()) {
      const at::Tensor staging = new_unsharded(pool, shard.numel(), shard.scalar_type(), chunk);
      ledger.add(BufferKind::kParams, nbytes_of(staging));
      staging.copy_(shard, /*non_blocking=*/true);
      chunk.copy_(staging);
      ledger.release(BufferKind::kParams, nbytes_of(staging));
      if (pool != nullptr) internals::free_storage(staging);
    } else {
      chunk.copy_(shard, /*non_blocking=*/true);
    }
  }
  return AllGather{group.all_gather(full, chunk)};
}

void wait_all_gather(AllGather& g, const std::string& label) {
  FSDP_ASSERT(g.in_flight(), "no all-gather in flight for ", label);
  trace::Span span("all_gather wait", "comm", -1, label);
  g.work->wait();  // CPU: blocks; NCCL: orders the compute stream after the gather
  g.work.reset();
  if (g.arrive) {
    g.arrive();
    g.arrive = nullptr;  // drops the wire buffer
  }
}

void Reduction::hold(const at::Tensor& t, MemoryLedger& ledger) {
  ledger.add(BufferKind::kReductions, nbytes_of(t));
  held_bytes += nbytes_of(t);
  held.push_back(t);
}

at::Tensor new_unsharded(UnshardedPool* pool, int64_t numel, at::ScalarType dtype, const at::Tensor& like) {
  if (pool != nullptr) return pool->empty(numel, dtype, UnshardedPool::End::kHigh);
  return at::empty({numel}, like.options().dtype(dtype));
}

at::Tensor reduce_copy_in(const at::Tensor& grads, at::ScalarType reduce_dtype, Reduction& r, MemoryLedger& ledger,
                          UnshardedPool* pool) {
  if (grads.scalar_type() == reduce_dtype) return grads;
  at::Tensor copy = new_unsharded(pool, grads.numel(), reduce_dtype, grads);
  {
    at::NoGradGuard no_grad;
    copy.copy_(grads);
  }
  r.hold(copy, ledger);
  return copy;
}

void issue_reduction(Reduction& r, const at::Tensor& input, comm::ProcessGroup& group, bool replicated,
                     const at::Tensor& grad_shard, bool may_land_in_shard, MemoryLedger& ledger,
                     UnshardedPool* pool, const std::string& label, const Wire* wire) {
  FSDP_ASSERT(!r.in_flight(), "a reduction of ", label, " is already in flight");
  if (!replicated && wire != nullptr && wire->reduce != WireFormat::kNative) {
    issue_encoded_reduction(r, input, group, grad_shard, may_land_in_shard, ledger, pool, *wire);
    return;
  }
  r.input = input;
  r.into_grad_shard = false;
  if (replicated) {
    r.output = input;
    r.work = group.all_reduce(input, comm::ReduceOp::kAvg);
    return;
  }
  const int64_t n = grad_shard.numel();
  if (may_land_in_shard && input.scalar_type() == grad_shard.scalar_type() && grad_shard.device() == input.device()) {
    r.output = grad_shard;  // lands directly: nothing to fold later
    r.into_grad_shard = true;
  } else {
    r.output = new_unsharded(pool, n, input.scalar_type(), input);
    r.hold(r.output, ledger);
    if (grad_shard.device() != input.device() && grad_shard.scalar_type() != input.scalar_type()) {
      r.staging = new_unsharded(pool, n, grad_shard.scalar_type(), input);  // Note [Offload staging]
      r.hold(r.staging, ledger);
    }
  }
  r.work = group.reduce_scatter(r.output, input, comm::ReduceOp::kAvg);
}

void finish_reduction(Reduction& r, comm::ProcessGroup* replicate_group, bool replicated, at::Tensor& grad_shard,
                      Fold fold, MemoryLedger& ledger, const std::string& label) {
  FSDP_ASSERT(r.in_flight(), "no reduction in flight for ", label);
  {
    trace::Span span(replicated ? "all_reduce wait" : "reduce_scatter wait", "comm", -1, label);
    r.work->wait();
  }
  r.work.reset();
  if (r.arrive) {
    r.arrive();
    r.arrive = nullptr;  // drops the wire buffers
  }
  if (replicate_group != nullptr) {
    // HYBRID: the shard group's mean, averaged over the replicas.
    trace::Span span("all_reduce (replicas)", "comm", -1, label);
    replicate_group->all_reduce(r.output, comm::ReduceOp::kAvg)->wait();
  }
  {
    at::NoGradGuard no_grad;
    if (r.into_grad_shard) {
      // already in place
    } else if (fold == Fold::kReplace) {
      // Non-blocking: a host shard is read only after the end of backward's
      // synchronization (CPU offload).
      if (!r.output.is_same(grad_shard)) grad_shard.copy_(r.output, /*non_blocking=*/true);
    } else if (fold == Fold::kAdd) {
      grad_shard.add_(r.output.to(grad_shard.device(), grad_shard.scalar_type()));
    } else if (r.staging.defined()) {  // Note [Offload staging]: the cast on the device, then the plain copy
      r.staging.copy_(r.output);
      grad_shard.copy_(r.staging, /*non_blocking=*/true);
    } else {
      grad_shard.copy_(r.output, /*non_blocking=*/true);
    }
  }
  // The held buffers' bytes go back now (to the pool, in the order the host
  // releases them: Note [Preallocated pool]); the collective's handle may
  // still reference the tensors.
  for (const at::Tensor& t : r.held) internals::free_storage(t);
  r.held.clear();
  r.input = at::Tensor();
  r.output = at::Tensor();
  r.staging = at::Tensor();
  ledger.release(BufferKind::kReductions, r.held_bytes);
  r.held_bytes = 0;
}

}  // namespace fsdp::detail

#include "fsdp/collectives.h"

#include <cmath>

#include "fsdp/compressed_collectives.h"

#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"

namespace fsdp::detail {

namespace {
int64_t nbytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

// The held buffers' bytes go back now (to the pool, in the order the host
// releases them: Note [Preallocated pool]); the collective's handle may
// still reference the tensors.
void release_held(Reduction& r, MemoryLedger& ledger) {
  for (const at::Tensor& t : r.held) internals::free_storage(t);
  r.held.clear();
  r.input = at::Tensor();
  r.output = at::Tensor();
  r.staging = at::Tensor();
  ledger.release(BufferKind::kReductions, r.held_bytes);
  r.held_bytes = 0;
}
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
void copy_shard_in(const at::Tensor& shard, const at::Tensor& chunk, UnshardedPool* pool, MemoryLedger& ledger) {
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

AllGather all_gather_copy_in(comm::ProcessGroup& group, const at::Tensor& shard, const at::Tensor& full,
                             const at::Tensor& chunk, UnshardedPool* pool, MemoryLedger& ledger,
                             const Wire* wire) {
  if (wire != nullptr && wire->gather != WireFormat::kNative) return all_gather_encoded(group, shard, full, *wire);
  copy_shard_in(shard, chunk, pool, ledger);
  return AllGather{group.all_gather(full, chunk), true};
}

void wait_all_gather(AllGather& g, const std::string& label) {
  FSDP_ASSERT(g.in_flight(), "no all-gather in flight for ", label);
  trace::Span span("all_gather wait", "comm", -1, label);
  if (g.work) g.work->wait();  // CPU: blocks; NCCL: orders the compute stream after the gather
  g.work.reset();
  if (g.arrive) {
    g.arrive();
    g.arrive = nullptr;  // drops the wire buffer
  }
  g.issued = false;
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

// Note [Reduction arithmetic]
// FSDP2's rule (_fsdp_collectives.py: _get_gradient_divide_factors): with
// fp32 or bf16 and no force-sum, a mean is the wire's own average, and a
// divide factor multiplies the input by 1/factor before a sum (NCCL's
// PreMulSum; the average when the factor is the shard group's size), the
// replicas then summed. With force-sum (or fp16, which could overflow) only
// sums go on the wire: the input is divided before (fp16: by a power of two
// near the square root of the factor) and the output after, by the rest.
ReduceSpec reduce_spec(int shard_size, int replicas, at::ScalarType reduce_dtype, double divide_factor,
                       bool force_sum) {
  ReduceSpec s;
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  const double ranks = static_cast<double>(shard_size) * static_cast<double>(replicas);
  if (!overflow_risk && !force_sum) {
    if (divide_factor <= 0) return s;  // the averages
    s.shard_op = comm::ReduceOp::kSum;
    s.replica_op = comm::ReduceOp::kSum;
    if (divide_factor == static_cast<double>(shard_size)) {
      s.shard_op = comm::ReduceOp::kAvg;
    } else {
      s.premul = 1.0 / divide_factor;
    }
    return s;
  }
  const double factor = divide_factor > 0 ? divide_factor : ranks;
  s.shard_op = comm::ReduceOp::kSum;
  s.replica_op = comm::ReduceOp::kSum;
  if (overflow_risk) {
    double pre = 1;
    while (std::fmod(factor, pre) == 0 && factor / pre > pre) pre *= 2;
    s.pre_divide = pre;
    s.post_divide = factor / pre;
  } else {
    s.post_divide = factor;
  }
  return s;
}

// Note [One-rank reductions]
// A reduce-scatter over a shard group of one rank gives its input back (the
// sum of one, the mean of one). The collective would only copy it — into
// the gradient shard, or into a scratch of the reduce dtype that the fold then
// casts into the shard — so it is skipped: the fold reads the input itself,
// after the same pre- and post-division, partial sums, replica all-reduce and
// hook, with the same values bit for bit. Where the shard lives on another
// device (CPU offload) the reduction keeps its path (the staging of Note
// [Offload staging]). plan.cpp counts no output buffer for it; a custom
// reduce-scatter and a compressed wire are still called.
bool one_rank_reduction(int group_size, const at::Tensor& input, const at::Tensor& grad_shard) {
  return group_size == 1 && input.numel() == grad_shard.numel() && input.device() == grad_shard.device();
}

void issue_reduction(Reduction& r, const at::Tensor& input, comm::ProcessGroup& group, bool replicated,
                     const at::Tensor& grad_shard, bool may_land_in_shard, MemoryLedger& ledger,
                     UnshardedPool* pool, const std::string& label, const ReduceSpec& spec, const Wire* wire) {
  FSDP_ASSERT(!r.in_flight(), "a reduction of ", label, " is already in flight");
  if (!replicated && wire != nullptr && wire->reduce != WireFormat::kNative) {
    FSDP_CHECK(spec.pre_divide == 1 && spec.premul == 1 && spec.post_divide == 1 && !spec.comm && !spec.hook &&
                   spec.shard_op == comm::ReduceOp::kAvg && spec.replica_op == comm::ReduceOp::kAvg,
               label, ": a compressed reduce-scatter (FsdpOptions::compression) computes the mean itself; it cannot "
               "be combined with a gradient divide factor, force-sum, an fp16 reduce dtype (which divides before and "
               "after the sum), a custom reduce-scatter or an all-reduce hook — reduce in fp32 or bf16, or set "
               "compression.reduce_scatter to native for this model");
    issue_encoded_reduction(r, input, group, grad_shard, may_land_in_shard, ledger, pool, *wire);
    return;
  }
  r.input = input;
  r.into_grad_shard = false;
  r.issued = true;
  if (spec.pre_divide != 1 || spec.premul != 1) {
    at::NoGradGuard no_grad;
    if (spec.pre_divide != 1) input.div_(spec.pre_divide);
    if (spec.premul != 1) input.mul_(spec.premul);
  }
  if (replicated) {
    r.output = input;
    r.work = group.all_reduce(input, spec.shard_op);
    return;
  }
  const int64_t n = grad_shard.numel();
  if (spec.comm) {
    r.output = spec.comm->allocate(n, input.scalar_type(), input.device());
    FSDP_CHECK(r.output.numel() == n && r.output.scalar_type() == input.scalar_type() && r.output.is_contiguous(),
               label, ": the custom reduce-scatter's allocate returned ", r.output.sizes(), " ", r.output.scalar_type(),
               " for ", n, " contiguous elements of ", input.scalar_type());
    r.hold(r.output, ledger);
    r.work = (*spec.comm)(r.output, input, group, spec.shard_op);
    return;
  }
  if (one_rank_reduction(group.size(), input, grad_shard)) {
    r.output = input;  // Note [One-rank reductions]: no collective; finish_reduction folds the input itself
    return;
  }
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
  r.work = group.reduce_scatter(r.output, input, spec.shard_op);
}

void finish_reduction(Reduction& r, comm::ProcessGroup* replicate_group, bool replicated, at::Tensor& grad_shard,
                      Fold fold, MemoryLedger& ledger, const std::string& label, const ReduceSpec& spec) {
  FSDP_ASSERT(r.in_flight(), "no reduction in flight for ", label);
  {
    trace::Span span(replicated ? "all_reduce wait" : "reduce_scatter wait", "comm", -1, label);
    if (r.work) r.work->wait();
  }
  r.work.reset();
  r.issued = false;
  if (r.arrive) {
    r.arrive();
    r.arrive = nullptr;  // drops the wire buffers
  }
  if (spec.partial.defined()) {
    at::NoGradGuard no_grad;
    r.output.add_(spec.partial.to(r.output.scalar_type()));
  }
  if (replicate_group != nullptr) {
    // HYBRID: the shard group's mean, averaged over the replicas.
    trace::Span span("all_reduce (replicas)", "comm", -1, label);
    replicate_group->all_reduce(r.output, spec.replica_op)->wait();
  }
  if (spec.hook) spec.hook(r.output);
  if (spec.post_divide != 1) {
    at::NoGradGuard no_grad;
    r.output.div_(spec.post_divide);
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
  release_held(r, ledger);
}

void finish_reduction_partial(Reduction& r, at::Tensor& partial, MemoryLedger& ledger, const std::string& label) {
  FSDP_ASSERT(r.in_flight() && !r.into_grad_shard, "no reduction into a scratch in flight for ", label);
  {
    trace::Span span("reduce_scatter wait", "comm", -1, label);
    if (r.work) r.work->wait();
  }
  r.work.reset();
  r.issued = false;
  {
    at::NoGradGuard no_grad;
    if (partial.defined()) {
      partial.add_(r.output);
    } else {
      partial = r.output.clone();
      ledger.add(BufferKind::kAccumulated, nbytes_of(partial));
    }
  }
  release_held(r, ledger);
}

}  // namespace fsdp::detail

// The engine's collectives, as free functions over flat buffers: they know
// nothing about modules, units or strategies (the caller decides what to
// gather and reduce, and where it lands), as in FSDP2's collectives layer.
// Each returns an in-flight handle; the buffers the collective reads or
// writes live in the handle until it is finished, so the caller cannot drop
// them early. CPU (tcp group): wait() blocks until done. NCCL: wait() orders
// the caller's stream after the collective (sync by event, not by host).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <memory>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/flat_param.h"

namespace fsdp::detail {

// Writes into buffers that parameters view, without bumping the version
// counters autograd checks (docs/design.md: a plain copy_ under NoGradGuard makes
// backward fail with "modified by an inplace operation").
struct RawWriteGuard {
  at::NoGradGuard no_grad;
  at::AutoDispatchBelowADInplaceOrView below_ad;
};

// What a unit's collectives send (compressed_collectives.h); null: the native wire.
struct Wire;

// An all-gather in flight into an unsharded buffer.
struct AllGather {
  comm::WorkPtr work;            // null: none in flight (or a custom all-gather that finished at once)
  bool issued = false;           // between the issue and the wait
  std::function<void()> arrive;  // a compressed wire: decodes into the buffer after the wait (holds the wire)
  bool in_flight() const { return issued; }
};

// Copies `shard` into `chunk` (this rank's slice of the unsharded buffer),
// casting to the chunk's dtype. A host shard of another dtype (CPU offload)
// goes through a staging buffer of its own dtype on the device, from `pool`
// (when not null) and counted in `ledger` while it lives (Note [Offload
// staging]). Every gather's copy-in, the custom all-gather's included.
void copy_shard_in(const at::Tensor& shard, const at::Tensor& chunk, UnshardedPool* pool, MemoryLedger& ledger);

// Copy-in and issue: `shard` (master dtype), cast to `full`'s dtype, is
// written into `chunk` (this rank's chunk of `full`), then every rank's chunk
// is gathered into `full` in place. There is no copy-out: the parameters are
// views of `full` (FlatParam::bind), so the gathered bytes are the parameters.
// The shard goes in by copy_shard_in.
// Requires: `full` allocated; nothing reads `full` until wait_all_gather.
// `label` (below) names the unit in traces and messages.
// With a compressed `wire`, see all_gather_encoded.
AllGather all_gather_copy_in(comm::ProcessGroup& group, const at::Tensor& shard, const at::Tensor& full,
                             const at::Tensor& chunk, UnshardedPool* pool, MemoryLedger& ledger,
                             const Wire* wire = nullptr);
// Afterwards `full` holds every rank's values and `g` is empty.
void wait_all_gather(AllGather& g, const std::string& label);

// A gradient reduction in flight: the mean over the group's ranks of each
// rank's unsharded gradients, scattered (each rank gets its shard's part) or,
// for replicated layouts, all-reduced whole.
struct Reduction {
  comm::WorkPtr work;            // null: none in flight (or a custom reduce-scatter that finished at once)
  bool issued = false;           // between issue_reduction and finish_reduction
  at::Tensor input;              // what `work` reads (reduce dtype), kept alive until it completes
  at::Tensor output;             // where `work` writes: the gradient shard itself, or a scratch
  at::Tensor staging;            // a host gradient shard of another dtype: the cast lands here first, or undefined
  bool into_grad_shard = false;  // output is the gradient shard: nothing to fold
  int64_t held_bytes = 0;        // input/output bytes beyond the unsharded gradient buffer (the ledger's kReductions)
  std::vector<at::Tensor> held;  // those buffers: their bytes are released in finish_reduction
  std::function<void()> arrive;  // a compressed wire: decodes and sums into `output` after the wait
  bool in_flight() const { return issued; }

  // `t` belongs to this reduction until finish_reduction, which releases its
  // bytes; the ledger counts them until then.
  void hold(const at::Tensor& t, MemoryLedger& ledger);
};

// A new buffer for a reduction in flight (1-D, `numel` of `dtype`,
// uninitialized): from `pool`'s high end when there is one (Note
// [Preallocated pool]), else from the allocator of `like`'s device.
at::Tensor new_unsharded(UnshardedPool* pool, int64_t numel, at::ScalarType dtype, const at::Tensor& like);

// FSDP2's reduction arithmetic for a unit (_get_gradient_divide_factors):
// which ops run on the wire and what is divided locally before and after.
struct ReduceSpec {
  double pre_divide = 1;   // the input is divided by this before the reduction (fp16 under force-sum)
  double premul = 1;       // the input is multiplied by this before a sum (a divide factor, not force-sum)
  double post_divide = 1;  // the output is divided by this after (force-sum)
  comm::ReduceOp shard_op = comm::ReduceOp::kAvg;    // over the shard group (replicated: the all-reduce)
  comm::ReduceOp replica_op = comm::ReduceOp::kAvg;  // across replicas (HYBRID)
  std::shared_ptr<ReduceScatterComm> comm;           // a custom reduce-scatter (null: the group's)
  std::function<void(at::Tensor&)> hook;             // the all-reduce hook (empty: none)
  at::Tensor partial;  // HYBRID without all-reduce before: shard-group results added before the all-reduce
};
// The spec for `shard_size` ranks times `replicas`, the reduce dtype, FSDP2's
// gradient divide factor (<= 0: none) and force-sum.
ReduceSpec reduce_spec(int shard_size, int replicas, at::ScalarType reduce_dtype, double divide_factor,
                       bool force_sum);

// Copy-in: `grads` in `reduce_dtype` — `grads` itself when already of it, else
// a cast copy (from `pool` when not null) that `r` holds (the caller may then
// release `grads`).
at::Tensor reduce_copy_in(const at::Tensor& grads, at::ScalarType reduce_dtype, Reduction& r, MemoryLedger& ledger,
                          UnshardedPool* pool);

// Whether a reduction of `input` into `grad_shard` over a group of
// `group_size` ranks runs no collective (Note [One-rank reductions]): one
// rank, and the shard on the input's device.
bool one_rank_reduction(int group_size, const at::Tensor& input, const at::Tensor& grad_shard);

// Issues the reduction of `input` (from reduce_copy_in) over `group`:
// replicated, an all-reduce in place; one_rank_reduction, none (the input
// is the output, folded by finish_reduction); else a reduce-scatter into
// `grad_shard` when `may_land_in_shard` and the dtype and device match, else
// into a shard-sized scratch (from `pool` when not null) that `r` holds, and,
// for a gradient shard of another dtype on another device (CPU offload), a
// staging buffer of the shard's dtype beside it (Note [Offload staging]).
// `spec`: the divisions and ops (default: a mean), a custom reduce-scatter
// (its allocate gives the output scratch: never the gradient shard).
// With a compressed `wire` (not replicated; only with the default `spec`),
// see issue_encoded_reduction.
void issue_reduction(Reduction& r, const at::Tensor& input, comm::ProcessGroup& group, bool replicated,
                     const at::Tensor& grad_shard, bool may_land_in_shard, MemoryLedger& ledger,
                     UnshardedPool* pool, const std::string& label, const ReduceSpec& spec = {},
                     const Wire* wire = nullptr);

// How a finished reduction lands in the gradient shard.
enum class Fold {
  kCopy,     // the shard held nothing: it becomes the reduced gradients
  kAdd,      // the shard holds earlier reduced gradients (no zero_grad since): add
  kReplace,  // single-copy layout: the input was made from the shard itself (its old sum included)
};

// Waits for `r`; with a replicate group (HYBRID), averages the shard group's
// mean over the replicas (an all-reduce, waited for); folds the result into
// `grad_shard`; releases what `r` held. Afterwards `r` is empty.
// A gradient shard in host memory while the reduction ran on a device (CPU
// offload) receives a non-blocking copy for kCopy and kReplace: the host may
// read it only after synchronizing with the device (the engine does at the
// end of backward); kAdd copies to the host and waits.
// `spec` (as issued): `partial` is added before the all-reduce across
// replicas, then the hook, then the final division.
void finish_reduction(Reduction& r, comm::ProcessGroup* replicate_group, bool replicated, at::Tensor& grad_shard,
                      Fold fold, MemoryLedger& ledger, const std::string& label, const ReduceSpec& spec = {});
// HYBRID without the all-reduce across replicas (set_requires_all_reduce):
// waits for `r` and adds its output into `partial` (allocated on first use,
// reduce dtype, counted as accumulated gradients); the gradient shard is not
// touched. Afterwards `r` is empty.
void finish_reduction_partial(Reduction& r, at::Tensor& partial, MemoryLedger& ledger, const std::string& label);

}  // namespace fsdp::detail

// ShardedUnit: the per-unit state machine. See Note [Unit lifecycle] in state.h.
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "fsdp/autograd_fns.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"
#include "fsdp/state.h"

namespace fsdp::detail {

namespace {
// Writes into buffers that parameters view, without bumping version counters
// autograd checks (DESIGN.md: a plain copy_ under NoGradGuard makes backward
// fail with "modified by an inplace operation").
struct RawWriteGuard {
  at::NoGradGuard no_grad;
  at::AutoDispatchBelowADInplaceOrView below_ad;
};

int64_t nbytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }
}  // namespace

ShardedUnit::ShardedUnit(ShardedModelImpl* root, size_t index, std::string name, std::string type_name,
                         bool is_root, bool checkpoint, std::unique_ptr<FlatParam> flat)
    : root_(root),
      index_(index),
      name_(std::move(name)),
      type_name_(std::move(type_name)),
      is_root_(is_root),
      checkpoint_(checkpoint),
      flat_(std::move(flat)) {}

void ShardedUnit::register_grad_hooks() {
  accumulators_.clear();
  for (const auto& p : flat_->params()) {
    auto acc = internals::grad_accumulator(p);
    FSDP_ASSERT(acc != nullptr, "no AccumulateGrad for a parameter of unit '", name_, "'");
    internals::add_post_hook(*acc, [this] { on_grad_ready(); });
    accumulators_.push_back(std::move(acc));
  }
}

void ShardedUnit::begin_iteration() {
  ran_forward_ = false;
  grad_state_ = GradState::kIdle;
  pending_grads_ = static_cast<int>(flat_->params().size());
}

void ShardedUnit::check_state_for(const char* what, ShardState expected) const {
  FSDP_ASSERT(state_ == expected, what, " of unit '", name_, "' in state ", static_cast<int>(state_));
}

// ---- sharding ---------------------------------------------------------------

void ShardedUnit::unshard() {
  if (state_ != ShardState::kSharded) return;
  if (root_->replicated()) {
    // Replicated: the "gather" is a cast of the master copy (none when it is
    // the single fp32 copy).
    if (!flat_->single_copy()) {
      RawWriteGuard g;
      flat_->full().copy_(flat_->shard());
    }
    state_ = ShardState::kUnsharded;
    return;
  }
  trace::Span span("all_gather issue", "comm",
                   flat_->layout().padded_numel * static_cast<int64_t>(c10::elementSize(flat_->param_dtype())), name_);
  flat_->alloc_full();
  at::Tensor chunk = flat_->own_chunk();
  {
    RawWriteGuard g;
    chunk.copy_(flat_->shard());  // casts to the param dtype
  }
  gather_ = root_->shard_group()->all_gather(flat_->full(), chunk);
  state_ = ShardState::kUnsharding;
}

void ShardedUnit::wait_for_unshard() {
  if (state_ == ShardState::kUnsharding) {
    trace::Span span("all_gather wait", "comm", -1, name_);
    gather_->wait();  // CPU: blocks; NCCL: orders the compute stream after the gather
    gather_.reset();
    state_ = ShardState::kUnsharded;
  }
  check_state_for("wait_for_unshard", ShardState::kUnsharded);
}

void ShardedUnit::reshard() {
  if (state_ == ShardState::kSharded) return;
  // Never free bytes a collective is still writing.
  if (state_ == ShardState::kUnsharding) wait_for_unshard();
  if (!root_->replicated()) flat_->free_full();
  state_ = ShardState::kSharded;
}

// ---- forward ----------------------------------------------------------------

std::vector<at::Tensor> ShardedUnit::cast_inputs(const std::vector<at::Tensor>& inputs) const {
  const at::ScalarType dt = flat_->param_dtype();
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (const auto& x : inputs) {
    if (x.defined() && x.is_floating_point() && x.scalar_type() != dt) {
      out.push_back(x.to(dt));
    } else {
      out.push_back(x);
    }
  }
  return out;
}

std::vector<at::Tensor> ShardedUnit::run_eval(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) {
  root_->on_eval_forward(*this);
  unshard();
  wait_for_unshard();
  std::vector<at::Tensor> outs = fn(cast_inputs(inputs));
  // No backward follows: free everything a sharded strategy would not keep.
  reshard();
  return outs;
}

std::vector<at::Tensor> ShardedUnit::run(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return run_eval(fn, inputs);

  root_->on_pre_forward(*this);  // iteration start (root), order, forward prefetch
  wait_for_unshard();
  ran_forward_ = true;

  const std::vector<at::Tensor> ins = cast_inputs(inputs);
  std::vector<at::Tensor> outs;
  {
    trace::Span span("forward", "compute", -1, name_);
    outs = checkpoint_ ? checkpointed_call(fn, ins, flat_->params(), root_->options().offload_checkpoint_inputs)
                       : fn(ins);
  }

  if (root_->reshards_after_forward(*this)) reshard();
  root_->on_post_forward(*this);

  std::vector<at::Tensor> tracked;
  std::vector<size_t> where;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].defined() && outs[i].requires_grad()) {
      tracked.push_back(outs[i]);
      where.push_back(i);
    }
  }
  if (!tracked.empty()) {
    std::vector<at::Tensor> hooked = attach_pre_backward(*this, tracked);
    for (size_t k = 0; k < where.size(); ++k) outs[where[k]] = hooked[k];
  }
  return outs;
}

// ---- backward ---------------------------------------------------------------

void ShardedUnit::pre_backward() {
  if (grad_state_ != GradState::kIdle) return;  // once per iteration
  root_->on_pre_backward(*this);                // queues the end-of-backward callback, prefetches
  wait_for_unshard();
  flat_->prepare_full_grad(keep_full_grad());
  pending_grads_ = static_cast<int>(flat_->params().size());
  grad_state_ = GradState::kCollecting;
  backward_begin_us_ = trace::enabled() ? trace::now_us() : -1;
}

void ShardedUnit::on_grad_ready() {
  if (grad_state_ != GradState::kCollecting) {
    // A gradient reached one of this unit's parameters although its forward
    // outputs saw no backward: the parameter was used outside the unit.
    FSDP_CHECK(grad_state_ != GradState::kIdle, "a gradient reached a parameter of unit '", name_,
               "' before the unit's backward started; a parameter must only be used inside the forward of "
               "the unit that owns it (wrap the code that uses it in that unit)");
    return;
  }
  if (--pending_grads_ == 0) post_backward(/*flush=*/false);
}

void ShardedUnit::post_backward(bool flush) {
  if (grad_state_ == GradState::kReduceIssued || grad_state_ == GradState::kDone) return;
  if (!flat_->has_full_grad() || grad_state_ == GradState::kIdle) {
    // Ran forward (or holds no_sync gradients) but no gradient flowed this
    // time: contribute zeros, so every rank issues the same collectives.
    FSDP_ASSERT(flush);
    flat_->prepare_full_grad(keep_full_grad());
  }
  // The unit's backward: from its pre-backward hook to its last gradient
  // (nested units' spans lie inside the root's).
  trace::record("backward", "compute", backward_begin_us_, trace::now_us(), -1, name_);
  backward_begin_us_ = -1;
  const FsdpOptions& o = root_->options();
  const at::ScalarType reduce_dtype = o.mixed_precision.reduce_dtype;
  // See Note [Accumulating without synchronization].
  const bool accumulate_wider = c10::elementSize(reduce_dtype) > flat_->full_grad().element_size();

  MemoryLedger& ledger = root_->ledger();
  if (!root_->sync_grads()) {
    holds_unsharded_grads_ = true;  // until a synced backward
    if (accumulate_wider) {
      at::NoGradGuard no_grad;
      if (accumulated_.defined()) {
        accumulated_.add_(flat_->full_grad());  // computed in the wider dtype
      } else {
        accumulated_ = flat_->full_grad().to(reduce_dtype);
        ledger.add(BufferKind::kAccumulated, nbytes_of(accumulated_));
      }
      flat_->release_full_grad();
    }
    grad_state_ = GradState::kDone;
  } else {
    trace::Span span(root_->replicated() ? "all_reduce issue" : "reduce_scatter issue", "comm",
                     nbytes_of(flat_->full_grad()), name_);
    at::Tensor in = flat_->full_grad();
    FSDP_ASSERT(reduce_held_bytes_ == 0);
    // A buffer the reduction holds beyond full_grad, released by finish_reduce.
    const auto held_by_reduction = [&](const at::Tensor& t) {
      ledger.add(BufferKind::kReductions, nbytes_of(t));
      reduce_held_bytes_ += nbytes_of(t);
    };
    if (accumulated_.defined()) {
      at::NoGradGuard no_grad;
      in = accumulated_.add_(in);
      accumulated_ = at::Tensor();  // reduce_in_ keeps it until the reduction is done
      ledger.release(BufferKind::kAccumulated, nbytes_of(in));
      held_by_reduction(in);
    } else if (in.scalar_type() != reduce_dtype) {
      in = in.to(reduce_dtype);
      held_by_reduction(in);
    }
    // A copy in the reduce dtype holds the gradients now: the param-dtype
    // buffer goes before the reduction runs, not after (Note [Unsharded memory]).
    if (!in.is_same(flat_->full_grad())) flat_->release_full_grad();
    reduce_in_ = in;
    reduce_into_grad_shard_ = false;
    if (root_->replicated()) {
      reduce_out_ = in;
      reduce_ = root_->shard_group()->all_reduce(in, comm::ReduceOp::kAvg);
    } else {
      const int64_t n = flat_->layout().shard_numel;
      const at::Tensor& gs = flat_->grad_shard();
      if (!grad_valid_ && in.scalar_type() == gs.scalar_type() && gs.device() == in.device()) {
        reduce_out_ = flat_->grad_shard();  // lands directly: nothing to fold later
        reduce_into_grad_shard_ = true;
      } else {
        reduce_out_ = at::empty({n}, in.options());
        held_by_reduction(reduce_out_);
      }
      reduce_ = root_->shard_group()->reduce_scatter(reduce_out_, in, comm::ReduceOp::kAvg);
    }
    grad_state_ = GradState::kReduceIssued;
  }

  if (root_->reshards_after_backward()) reshard();
  root_->after_post_backward(*this);  // queue/drain reductions, BACKWARD_POST prefetch
}

void ShardedUnit::finish_reduce() {
  if (grad_state_ != GradState::kReduceIssued) return;
  {
    trace::Span span(root_->replicated() ? "all_reduce wait" : "reduce_scatter wait", "comm", -1, name_);
    reduce_->wait();
  }
  reduce_.reset();
  if (root_->replicate_group()) {
    // HYBRID: the shard group's mean, averaged over the replicas.
    trace::Span span("all_reduce (replicas)", "comm", -1, name_);
    replicate_ = root_->replicate_group()->all_reduce(reduce_out_, comm::ReduceOp::kAvg);
    replicate_->wait();
    replicate_.reset();
  }
  at::Tensor& g = flat_->grad_shard();
  {
    at::NoGradGuard no_grad;
    if (reduce_into_grad_shard_) {
      // already in place
    } else if (flat_->single_copy()) {
      // The reduced tensor was made from g itself (old sum included): replace.
      if (!reduce_out_.is_same(g)) g.copy_(reduce_out_);
    } else if (grad_valid_) {
      g.add_(reduce_out_.to(g.device(), g.scalar_type()));
    } else {
      g.copy_(reduce_out_);
    }
  }
  grad_valid_ = true;
  holds_unsharded_grads_ = false;
  reduce_in_ = at::Tensor();
  reduce_out_ = at::Tensor();
  root_->ledger().release(BufferKind::kReductions, reduce_held_bytes_);
  reduce_held_bytes_ = 0;
  flat_->release_full_grad();
  grad_state_ = GradState::kDone;
}

// Note [Accumulating without synchronization]
// Backward passes without gradient synchronization (gradient accumulation)
// keep the unit's gradients unsharded until the synchronized one. When the
// reduction dtype is wider than the parameters' (bf16 compute, fp32 reduction)
// each pass's gradient is added into a buffer of the reduction dtype and its
// own buffer freed, so the micro-batches are summed in fp32 rather than
// rounded to bf16 after each one — what PyTorch FSDP2 does. Otherwise they
// accumulate in place in full_grad (AccumulateGrad adds into the .grad views).
bool ShardedUnit::keep_full_grad() const {
  // full_grad still holds unsynchronized gradients, or is the single fp32 copy
  // that holds gradients no zero_grad cleared.
  return (holds_unsharded_grads_ && !accumulated_.defined()) || (flat_->single_copy() && grad_valid_);
}

void ShardedUnit::ensure_grad_valid() {
  if (grad_valid_ || holds_unsharded_grads_) return;
  flat_->grad_shard().zero_();
  grad_valid_ = true;
}

}  // namespace fsdp::detail

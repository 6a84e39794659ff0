// ShardedUnit: the per-unit state machine. See Note [Unit lifecycle] in state.h.
#include <ATen/core/grad_mode.h>

#include "fsdp/autograd_fns.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"
#include "fsdp/compressed_collectives.h"
#include "fsdp/state.h"

namespace fsdp::detail {

namespace {
int64_t nbytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }
}  // namespace

// ---- states -------------------------------------------------------------------

const char* to_string(ShardState s) {
  switch (s) {
    case ShardState::kSharded: return "kSharded";
    case ShardState::kUnsharding: return "kUnsharding";
    case ShardState::kUnsharded: return "kUnsharded";
  }
  return "?";
}

const char* to_string(GradState s) {
  switch (s) {
    case GradState::kIdle: return "kIdle";
    case GradState::kCollecting: return "kCollecting";
    case GradState::kReduceIssued: return "kReduceIssued";
    case GradState::kDone: return "kDone";
  }
  return "?";
}

const char* to_string(GradHold s) {
  switch (s) {
    case GradHold::kNone: return "kNone";
    case GradHold::kSharded: return "kSharded";
    case GradHold::kUnsharded: return "kUnsharded";
    case GradHold::kBoth: return "kBoth";
  }
  return "?";
}

const char* to_string(TrainingState s) {
  switch (s) {
    case TrainingState::kIdle: return "kIdle";
    case TrainingState::kForward: return "kForward";
    case TrainingState::kAwaitingBackward: return "kAwaitingBackward";
    case TrainingState::kBackward: return "kBackward";
  }
  return "?";
}

bool legal(ShardState from, ShardState to) {
  switch (to) {
    case ShardState::kUnsharding: return from == ShardState::kSharded;
    case ShardState::kUnsharded: return from != ShardState::kUnsharded;  // gathered, or replicated (no gather)
    case ShardState::kSharded: return from != ShardState::kSharded;
  }
  return false;
}

bool legal(GradState from, GradState to) {
  switch (to) {
    case GradState::kIdle: return true;  // a new iteration
    case GradState::kCollecting: return from == GradState::kIdle;
    case GradState::kReduceIssued: return from == GradState::kIdle || from == GradState::kCollecting;
    case GradState::kDone:
      return from == GradState::kIdle || from == GradState::kCollecting || from == GradState::kReduceIssued;
  }
  return false;
}

bool legal(GradHold from, GradHold to) {
  switch (to) {
    case GradHold::kNone: return from == GradHold::kNone || from == GradHold::kSharded;  // zero_grad
    case GradHold::kSharded: return true;  // a synchronized reduction folded everything in
    case GradHold::kUnsharded: return from == GradHold::kNone || from == GradHold::kUnsharded;
    case GradHold::kBoth: return from == GradHold::kSharded || from == GradHold::kBoth;
  }
  return false;
}

bool legal(TrainingState from, TrainingState to) {
  switch (to) {
    case TrainingState::kForward: return from == TrainingState::kIdle;
    case TrainingState::kAwaitingBackward: return from == TrainingState::kForward;
    case TrainingState::kBackward: return from == TrainingState::kAwaitingBackward;
    case TrainingState::kIdle: return from != TrainingState::kIdle;  // done, dropped, failed or nothing to do
  }
  return false;
}

ShardedUnit::ShardedUnit(ShardedModelImpl* root, size_t index, std::string name, std::string type_name,
                         bool is_root, bool checkpoint, std::unique_ptr<FlatParam> flat,
                         std::unique_ptr<FlatParam> frozen, bool contains_units)
    : root_(root),
      index_(index),
      name_(std::move(name)),
      type_name_(std::move(type_name)),
      is_root_(is_root),
      checkpoint_(checkpoint),
      flat_(std::move(flat)),
      frozen_(std::move(frozen)),
      backward_end_(frozen_ == nullptr                 ? BackwardEnd::kGrads
                    : is_root_ || contains_units ? BackwardEnd::kEndOfBackward
                                                 : BackwardEnd::kGradsAndInputs),
      label_(is_root_ ? "the root unit" : "unit '" + name_ + "'") {}

void ShardedUnit::register_grad_hooks() {
  accumulators_.clear();
  // The hooks live in the parameters' AccumulateGrad nodes, which a graph can
  // keep beyond the model: they hold the unit weakly.
  std::weak_ptr<ShardedUnit> self = weak_from_this();
  for (const auto& p : flat_->params()) {
    auto acc = internals::grad_accumulator(p);
    FSDP_ASSERT(acc != nullptr, "no AccumulateGrad for a parameter of unit '", name_, "'");
    internals::add_post_hook(*acc, [self] {
      if (auto unit = self.lock()) unit->on_grad_ready();
    });
    accumulators_.push_back(std::move(acc));
  }
}

void ShardedUnit::begin_iteration() {
  ran_forward_ = false;
  transition_to(grad_state_, GradState::kIdle, "begin_iteration", label());
  pending_grads_ = static_cast<int>(flat_->params().size());
  inputs_hooked_ = false;
}

// Note [Frozen parameters]
// Parameters with requires_grad false when fully_shard runs are laid out in a
// second flat parameter of their unit (frozen_), sharded like the first: it is
// gathered and freed with it (a second all-gather, issued back to back), but
// has no gradient buffers, no hooks, no reduction and no optimizer state, so a
// frozen base model costs its shards and its unsharded parameters only. Which
// parameters are frozen is fixed at fully_shard: changing requires_grad later
// is not seen (the layout is built once).
// When is such a unit's backward over? The last trainable gradient is not
// enough: backward nodes that read frozen parameters and lead only to the
// unit's inputs (a LoRA block's input norm, after its q/k/v adapters'
// gradients arrived) still run, and resharding before them would free what
// they read. A unit without nested units therefore also waits for a node on
// its inputs (attach_post_backward) when some input requires grad: every node
// of its backward leads to a trainable parameter's gradient or to an input's,
// so after both it reads nothing of the unit. A unit with nested units (the
// root) has backward nodes that lead into other units instead, which neither
// signal covers: with frozen parameters it reduces and reshards at the end of
// backward, where the root's post-backward comes in any case.

// ---- sharding ---------------------------------------------------------------

void ShardedUnit::unshard() {
  if (state_ != ShardState::kSharded) return;
  if (root_->replicated()) {
    // Replicated: the "gather" is a cast of the master copy (none when it is
    // the single fp32 copy).
    for (FlatParam* f : {flat_.get(), frozen_.get()}) {
      if (f == nullptr || f->single_copy()) continue;
      RawWriteGuard g;
      f->full().copy_(f->shard());
    }
    transition_to(state_, ShardState::kUnsharded, "unshard", label());
    return;
  }
  const int64_t elem = static_cast<int64_t>(c10::elementSize(flat_->param_dtype()));
  trace::Span span("all_gather issue", "comm",
                   (flat_->layout().padded_numel + (frozen_ ? frozen_->layout().padded_numel : 0)) * elem, name_);
  flat_->alloc_full();
  const Wire wire = wire_for(root_->options(), root_->iteration(), name_, root_->shard_group()->rank());
  gather_ = all_gather_copy_in(*root_->shard_group(), flat_->shard(), flat_->full(), flat_->own_chunk(),
                               root_->pool(), root_->ledger(), &wire);
  if (frozen_) {
    frozen_->alloc_full();
    gather_frozen_ = all_gather_copy_in(*root_->shard_group(), frozen_->shard(), frozen_->full(),
                                        frozen_->own_chunk(), root_->pool(), root_->ledger(), &wire);
  }
  transition_to(state_, ShardState::kUnsharding, "unshard", label());
}

void ShardedUnit::wait_for_unshard() {
  if (state_ == ShardState::kUnsharding) {
    wait_all_gather(gather_, name_);
    if (frozen_) wait_all_gather(gather_frozen_, name_);
    transition_to(state_, ShardState::kUnsharded, "wait_for_unshard", label());
  }
  FSDP_ASSERT(state_ == ShardState::kUnsharded, label(), ": wait_for_unshard in state ", to_string(state_));
}

void ShardedUnit::reshard() {
  if (state_ == ShardState::kSharded) return;
  // Never free bytes a collective is still writing.
  if (state_ == ShardState::kUnsharding) wait_for_unshard();
  if (!root_->replicated()) {
    flat_->free_full();
    if (frozen_) frozen_->free_full();
  }
  transition_to(state_, ShardState::kSharded, "reshard", label());
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
  std::vector<at::Tensor> outs;
  try {
    wait_for_unshard();
    ran_forward_ = true;
    std::vector<at::Tensor> ins = cast_inputs(inputs);
    if (backward_end_ == BackwardEnd::kGradsAndInputs) {
      // Note [Frozen parameters]
      ins = attach_post_backward(*this, ins);
      for (const auto& x : inputs) inputs_hooked_ = inputs_hooked_ || (x.defined() && x.requires_grad());
    }
    {
      trace::Span span("forward", "compute", -1, name_);
      outs = checkpoint_ ? checkpointed_call(fn, ins, flat_->params(), root_->options().offload_checkpoint_inputs)
                         : fn(ins);
    }
  } catch (...) {
    // Nested units rethrow to the root, which releases the whole iteration.
    if (is_root_) root_->on_forward_failed();
    throw;
  }

  if (root_->reshards_after_forward(*this)) reshard();

  outs = attach_pre_backward(*this, outs);
  root_->on_post_forward(*this);  // after the graph nodes exist (Note [Graph lifetime])
  return outs;
}

// ---- backward ---------------------------------------------------------------

void ShardedUnit::pre_backward(int64_t iteration) {
  root_->check_backward(iteration);
  if (grad_state_ != GradState::kIdle) return;  // once per iteration
  root_->on_pre_backward(*this);                // queues the end-of-backward callback, prefetches
  wait_for_unshard();
  if (trains()) flat_->prepare_full_grad(keep_full_grad());
  pending_grads_ = static_cast<int>(flat_->params().size()) + (inputs_hooked_ ? 1 : 0);
  transition_to(grad_state_, GradState::kCollecting, "pre_backward", label());
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
  count_down();
}

void ShardedUnit::count_down() {
  FSDP_ASSERT(pending_grads_ > 0, label(), ": more gradients arrived than expected");
  if (--pending_grads_ == 0 && backward_end_ != BackwardEnd::kEndOfBackward) post_backward(/*flush=*/false);
}

void ShardedUnit::post_backward(bool flush) {
  // Once per iteration: on_grad_ready calls it from kCollecting, end_of_backward
  // only for units still kIdle or kCollecting.
  FSDP_ASSERT(grad_state_ == GradState::kIdle || grad_state_ == GradState::kCollecting, label(),
              ": post_backward in gradient state ", to_string(grad_state_));
  if (!trains()) {
    // Nothing to reduce (Note [Frozen parameters]); every rank has the same
    // layout, so every rank skips the same collectives.
    trace::record("backward", "compute", backward_begin_us_, trace::now_us(), -1, name_);
    backward_begin_us_ = -1;
    transition_to(grad_state_, GradState::kDone, "post_backward (no trainable parameters)", label());
    if (root_->reshards_after_backward()) reshard();
    root_->after_post_backward(*this);
    return;
  }
  if (grad_state_ == GradState::kIdle) {
    // Ran forward (or holds no_sync gradients) but no gradient flowed this
    // time: contribute zeros, so every rank issues the same collectives.
    FSDP_ASSERT(flush, label(), ": post_backward before pre_backward");
    flat_->prepare_full_grad(keep_full_grad());
  }
  // The unit's backward: from its pre-backward hook to its last gradient
  // (nested units' spans lie inside the root's).
  trace::record("backward", "compute", backward_begin_us_, trace::now_us(), -1, name_);
  backward_begin_us_ = -1;
  // Every gradient has arrived: nothing reads the parameters any more, so they
  // go before the reduce-dtype copy is made, not after (Note [Unsharded memory]:
  // the copy, the gradients and the parameters were the peak of a large unit's
  // post-backward).
  if (root_->reshards_after_backward()) reshard();
  const at::ScalarType reduce_dtype = root_->options().mixed_precision.reduce_dtype;

  MemoryLedger& ledger = root_->ledger();
  if (!root_->sync_grads()) {
    // See Note [Accumulating without synchronization].
    if (accumulates_wider()) {
      at::NoGradGuard no_grad;
      if (holds_unsharded_grads()) {
        accumulated_.add_(flat_->full_grad());  // computed in the wider dtype
      } else {
        accumulated_ = flat_->full_grad().to(reduce_dtype);
        ledger.add(BufferKind::kAccumulated, nbytes_of(accumulated_));
      }
      flat_->release_full_grad();
    }
    transition_to(grad_hold_, grad_shard_holds_sum() ? GradHold::kBoth : GradHold::kUnsharded, "post_backward (no_sync)",
               label());
    transition_to(grad_state_, GradState::kDone, "post_backward (no_sync)", label());
  } else {
    trace::Span span(root_->replicated() ? "all_reduce issue" : "reduce_scatter issue", "comm",
                     nbytes_of(flat_->full_grad()), name_);
    at::Tensor in;
    if (holds_unsharded_grads() && accumulates_wider()) {
      at::NoGradGuard no_grad;
      in = accumulated_.add_(flat_->full_grad());
      accumulated_ = at::Tensor();  // the reduction keeps it until it is done
      ledger.release(BufferKind::kAccumulated, nbytes_of(in));
      reduction_.hold(in, ledger);
    } else {
      in = reduce_copy_in(flat_->full_grad(), reduce_dtype, reduction_, ledger, root_->pool());
    }
    // A copy in the reduce dtype holds the gradients now: the param-dtype
    // buffer goes before the reduction runs, not after (Note [Unsharded memory]).
    if (!in.is_same(flat_->full_grad())) flat_->release_full_grad();
    const Wire wire = wire_for(root_->options(), root_->iteration(), name_, root_->shard_group()->rank());
    issue_reduction(reduction_, in, *root_->shard_group(), root_->replicated(), flat_->grad_shard(),
                    /*may_land_in_shard=*/!grad_shard_holds_sum(), ledger, root_->pool(), name_, &wire);
    transition_to(grad_state_, GradState::kReduceIssued, "post_backward", label());
  }
  root_->after_post_backward(*this);  // queue/drain reductions, BACKWARD_POST prefetch
}

void ShardedUnit::on_inputs_grad_ready(int64_t iteration) {
  if (iteration != root_->iteration() || grad_state_ != GradState::kCollecting) return;
  count_down();
}

void ShardedUnit::finish_reduce() {
  // Only units with a reduction in flight are queued (after_post_backward).
  FSDP_ASSERT(grad_state_ == GradState::kReduceIssued, label(), ": finish_reduce in gradient state ",
              to_string(grad_state_));
  const Fold fold = flat_->single_copy() ? Fold::kReplace : grad_shard_holds_sum() ? Fold::kAdd : Fold::kCopy;
  finish_reduction(reduction_, root_->replicate_group().get(), root_->replicated(), flat_->grad_shard(), fold,
                   root_->ledger(), name_);
  transition_to(grad_hold_, GradHold::kSharded, "finish_reduce", label());
  flat_->release_full_grad();
  transition_to(grad_state_, GradState::kDone, "finish_reduce", label());
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
  return (holds_unsharded_grads() && !accumulates_wider()) || (flat_->single_copy() && grad_shard_holds_sum());
}

bool ShardedUnit::accumulates_wider() const {
  return c10::elementSize(root_->options().mixed_precision.reduce_dtype) > c10::elementSize(flat_->param_dtype());
}

void ShardedUnit::ensure_grad_valid() {
  if (grad_hold_ != GradHold::kNone) return;
  flat_->grad_shard().zero_();
  transition_to(grad_hold_, GradHold::kSharded, "ensure_grad_valid", label());
}

}  // namespace fsdp::detail

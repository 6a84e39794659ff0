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
    case ShardState::kShardedPostForward: return "kShardedPostForward";
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
    case ShardState::kUnsharding: return from == ShardState::kSharded || from == ShardState::kShardedPostForward;
    case ShardState::kUnsharded:  // gathered, or replicated (no gather)
      return from == ShardState::kUnsharding || from == ShardState::kSharded;
    case ShardState::kShardedPostForward: return from == ShardState::kUnsharded;
    case ShardState::kSharded: return from != ShardState::kSharded && from != ShardState::kUnsharding;
  }
  return false;
}

bool legal(GradState from, GradState to) {
  switch (to) {
    case GradState::kIdle: return true;  // a new iteration
    case GradState::kCollecting: return from == GradState::kIdle;
    case GradState::kReduceIssued: return from == GradState::kCollecting;
    case GradState::kDone: return from == GradState::kCollecting || from == GradState::kReduceIssued;
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
                         std::unique_ptr<FlatParam> frozen, bool contains_units, bool replicated,
                         const MixedPrecision& mixed_precision)
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
      replicated_(replicated),
      mp_(mixed_precision),
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

// ---- sharding (the schedule's primitives) -------------------------------------

void ShardedUnit::unshard(const comm::ProcessGroupPtr& from) {
  FSDP_ASSERT(state_ == ShardState::kSharded || state_ == ShardState::kShardedPostForward, label(),
              ": unshard in state ", to_string(state_));
  if (replicated_) {
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
  const bool post_forward = state_ == ShardState::kShardedPostForward;
  const Wire wire = wire_for(root_->options(), root_->iteration(), name_, root_->shard_group()->rank());
  const auto gather = [&](FlatParam& f, AllGather& into) {
    if (post_forward) {
      // Note [Post-forward shards]: from the smaller group's shards.
      const at::Tensor chunk = f.refill_from_post_forward_shard();
      into = comms_.all_gather ? AllGather{(*comms_.all_gather)(f.full(), chunk, *from), true}
                               : AllGather{from->all_gather(f.full(), chunk), true};
    } else if (comms_.all_gather) {
      // FSDP2's custom AllGather: its allocate gives the unsharded buffer.
      f.alloc_full_from(comms_.all_gather->allocate(f.layout().padded_numel, f.param_dtype(), f.options().device));
      const at::Tensor chunk = f.own_chunk();
      copy_shard_in(f.shard(), chunk, root_->pool(), root_->ledger());  // Note [Offload staging]
      into = AllGather{(*comms_.all_gather)(f.full(), chunk, *root_->shard_group()), true};
    } else {
      f.alloc_full();
      into = all_gather_copy_in(*root_->shard_group(), f.shard(), f.full(), f.own_chunk(), root_->pool(),
                                root_->ledger(), &wire);
    }
  };
  gather(*flat_, gather_);
  if (frozen_) gather(*frozen_, gather_frozen_);
  transition_to(state_, ShardState::kUnsharding, "unshard", label());
}

void ShardedUnit::wait_for_unshard() {
  FSDP_ASSERT(state_ == ShardState::kUnsharding, label(), ": wait_for_unshard in state ", to_string(state_));
  wait_all_gather(gather_, name_);
  if (frozen_) wait_all_gather(gather_frozen_, name_);
  for (FlatParam* f : {flat_.get(), frozen_.get()}) {
    if (f != nullptr) f->drop_post_forward_shard();
  }
  transition_to(state_, ShardState::kUnsharded, "wait_for_unshard", label());
}

void ShardedUnit::reshard(int group, int rank_in_group) {
  // Never free bytes a collective is still writing: the schedule waits first.
  FSDP_ASSERT(state_ == ShardState::kUnsharded || (state_ == ShardState::kShardedPostForward && group == 0), label(),
              ": reshard in state ", to_string(state_));
  if (state_ == ShardState::kShardedPostForward) {
    for (FlatParam* f : {flat_.get(), frozen_.get()}) {
      if (f != nullptr) f->drop_post_forward_shard();
    }
    transition_to(state_, ShardState::kSharded, "reshard", label());
    return;
  }
  if (!replicated_) {
    for (FlatParam* f : {flat_.get(), frozen_.get()}) {
      if (f == nullptr) continue;
      if (group > 0) {
        f->keep_post_forward_shard(group, rank_in_group);
      } else {
        f->free_full();
      }
    }
  }
  transition_to(state_, group > 0 && !replicated_ ? ShardState::kShardedPostForward : ShardState::kSharded, "reshard",
                label());
}

// ---- forward ----------------------------------------------------------------

std::vector<at::Tensor> ShardedUnit::cast_inputs(const std::vector<at::Tensor>& inputs) const {
  if (!mp_.cast_forward_inputs) return inputs;
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

namespace {
// MixedPrecision::output_dtype: the unit's floating-point outputs cast to it.
std::vector<at::Tensor> cast_outputs(std::vector<at::Tensor> outs, const MixedPrecision& mp) {
  if (!mp.output_dtype) return outs;
  for (auto& x : outs) {
    if (x.defined() && x.is_floating_point() && x.scalar_type() != *mp.output_dtype) x = x.to(*mp.output_dtype);
  }
  return outs;
}
}  // namespace

std::vector<at::Tensor> ShardedUnit::run_eval(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) {
  root_->on_eval_pre_forward(*this);
  std::vector<at::Tensor> outs;
  root_->note(EventKind::kForward, *this);
  outs = fn(cast_inputs(inputs));
  root_->note(EventKind::kPostForward, *this);
  // No backward follows: free everything a sharded strategy would not keep.
  root_->on_eval_post_forward(*this);
  return cast_outputs(std::move(outs), mp_);
}

std::vector<at::Tensor> ShardedUnit::run(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return run_eval(fn, inputs);

  root_->on_pre_forward(*this);  // iteration start (root), order, gather, prefetch, wait
  std::vector<at::Tensor> outs;
  try {
    ran_forward_ = true;
    std::vector<at::Tensor> ins = cast_inputs(inputs);
    if (backward_end_ == BackwardEnd::kGradsAndInputs) {
      // See Note [Frozen parameters].
      ins = attach_post_backward(*this, ins);
      for (const auto& x : inputs) inputs_hooked_ = inputs_hooked_ || (x.defined() && x.requires_grad());
    }
    root_->note(EventKind::kForward, *this);
    {
      trace::Span span("forward", "compute", -1, name_);
      if (checkpoint_) {
        std::weak_ptr<ShardedUnit> self = weak_from_this();
        const FsdpOptions& o = root_->options();
        outs = checkpointed_call(
            fn, ins, flat_->params(), o.checkpoint_policy, o.offload_checkpoint_inputs,
            [self] {
              if (auto u = self.lock()) u->root().note(EventKind::kRecompute, *u);
            },
            root_->kept_bytes());
      } else {
        outs = fn(ins);
      }
    }
    root_->note(EventKind::kPostForward, *this);
  } catch (...) {
    // Nested units rethrow to the root, which releases the whole iteration.
    if (is_root_) root_->on_forward_failed();
    throw;
  }

  root_->on_post_forward(*this);  // the unit's policy: reshard
  outs = attach_pre_backward(*this, cast_outputs(std::move(outs), mp_));
  root_->on_forward_done(*this);  // after the graph nodes exist (Note [Graph lifetime])
  return outs;
}

// ---- backward ---------------------------------------------------------------

void ShardedUnit::pre_backward(int64_t iteration) {
  root_->check_backward(iteration);
  if (grad_state_ != GradState::kIdle) return;  // once per iteration
  root_->on_pre_backward(*this);                // the schedule: gather, prefetch, wait, begin_backward
}

void ShardedUnit::begin_backward() {
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
  if (--pending_grads_ == 0 && backward_end_ != BackwardEnd::kEndOfBackward) root_->on_post_backward(*this);
}

void ShardedUnit::end_backward() {
  FSDP_ASSERT(grad_state_ == GradState::kCollecting, label(), ": post_backward in gradient state ",
              to_string(grad_state_));
  // The unit's backward: from its pre-backward hook to its last gradient
  // (nested units' spans lie inside the root's).
  trace::record("backward", "compute", backward_begin_us_, trace::now_us(), -1, name_);
  backward_begin_us_ = -1;
  if (!trains()) {
    // Nothing to reduce (Note [Frozen parameters]); every rank has the same
    // layout, so every rank skips the same collectives.
    transition_to(grad_state_, GradState::kDone, "post_backward (no trainable parameters)", label());
  }
}

void ShardedUnit::keep_grads() {
  // See Note [Accumulating without synchronization].
  FSDP_ASSERT(trains() && grad_state_ == GradState::kCollecting, label(), ": keep_grads in gradient state ",
              to_string(grad_state_));
  if (accumulates_wider()) {
    at::NoGradGuard no_grad;
    if (holds_unsharded_grads()) {
      accumulated_.add_(flat_->full_grad());  // computed in the wider dtype
    } else {
      accumulated_ = flat_->full_grad().to(mp_.reduce_dtype);
      root_->ledger().add(BufferKind::kAccumulated, nbytes_of(accumulated_));
    }
    flat_->release_full_grad();
  }
  transition_to(grad_hold_, grad_shard_holds_sum() ? GradHold::kBoth : GradHold::kUnsharded, "post_backward (no_sync)",
                label());
  transition_to(grad_state_, GradState::kDone, "post_backward (no_sync)", label());
}

void ShardedUnit::reduce(bool all_reduce) {
  FSDP_ASSERT(trains() && grad_state_ == GradState::kCollecting, label(), ": reduce in gradient state ",
              to_string(grad_state_));
  MemoryLedger& ledger = root_->ledger();
  const comm::ProcessGroupPtr& replicas = root_->replicate_group();
  spec_ = reduce_spec(root_->shard_group()->size(), replicas ? replicas->size() : 1, mp_.reduce_dtype,
                      comms_.divide_factor, comms_.force_sum);
  spec_.comm = replicated_ ? nullptr : comms_.reduce_scatter;
  spec_.hook = comms_.all_reduce_hook;
  // Summed aside without the all-reduce: never into the gradient shard.
  const bool aside = replicas != nullptr && !all_reduce;
  trace::Span span(replicated_ ? "all_reduce issue" : "reduce_scatter issue", "comm", nbytes_of(flat_->full_grad()),
                   name_);
  at::Tensor in;
  if (holds_unsharded_grads() && accumulates_wider()) {
    at::NoGradGuard no_grad;
    in = accumulated_.add_(flat_->full_grad());
    accumulated_ = at::Tensor();  // the reduction keeps it until it is done
    ledger.release(BufferKind::kAccumulated, nbytes_of(in));
    reduction_.hold(in, ledger);
  } else if (spec_.comm) {
    // FSDP2's custom ReduceScatter: its allocate gives the input too.
    in = spec_.comm->allocate(flat_->full_grad().numel(), mp_.reduce_dtype, flat_->full_grad().device());
    FSDP_CHECK(in.numel() == flat_->full_grad().numel() && in.scalar_type() == mp_.reduce_dtype && in.is_contiguous(),
               label(), ": the custom reduce-scatter's allocate returned ", in.sizes(), " ", in.scalar_type(), " for ",
               flat_->full_grad().numel(), " contiguous elements of ", mp_.reduce_dtype);
    {
      at::NoGradGuard no_grad;
      in.copy_(flat_->full_grad());
    }
    reduction_.hold(in, ledger);
  } else {
    in = reduce_copy_in(flat_->full_grad(), mp_.reduce_dtype, reduction_, ledger, root_->pool());
  }
  // A copy in the reduce dtype holds the gradients now: the param-dtype
  // buffer goes before the reduction runs, not after (Note [Unsharded memory]).
  if (!in.is_same(flat_->full_grad())) flat_->release_full_grad();
  FSDP_CHECK(!aside || !replicated_, label(), ": set_requires_all_reduce(false) needs a shard group of more than "
             "one rank (this unit's parameters are their own single copy)");
  const Wire wire = wire_for(root_->options(), root_->iteration(), name_, root_->shard_group()->rank());
  issue_reduction(reduction_, in, *root_->shard_group(), replicated_, flat_->grad_shard(),
                  /*may_land_in_shard=*/!grad_shard_holds_sum() && !aside, ledger, root_->pool(), name_, spec_, &wire);
  transition_to(grad_state_, GradState::kReduceIssued, "post_backward", label());
}

void ShardedUnit::on_inputs_grad_ready(int64_t iteration) {
  if (iteration != root_->iteration() || grad_state_ != GradState::kCollecting) return;
  count_down();
}

void ShardedUnit::finish_reduce(bool replicas) {
  FSDP_ASSERT(grad_state_ == GradState::kReduceIssued, label(), ": finish_reduce in gradient state ",
              to_string(grad_state_));
  if (!replicas && root_->replicate_group() != nullptr) {
    // HYBRID without the all-reduce (set_requires_all_reduce): summed aside
    // until a reduction with it; the gradient shard is not touched.
    finish_reduction_partial(reduction_, partial_, root_->ledger(), name_);
    flat_->release_full_grad();
    transition_to(grad_state_, GradState::kDone, "finish_reduce (without the all-reduce)", label());
    return;
  }
  const Fold fold = flat_->single_copy() ? Fold::kReplace : grad_shard_holds_sum() ? Fold::kAdd : Fold::kCopy;
  spec_.partial = partial_;
  finish_reduction(reduction_, replicas ? root_->replicate_group().get() : nullptr, replicated_, flat_->grad_shard(),
                   fold, root_->ledger(), name_, spec_);
  if (partial_.defined()) {
    root_->ledger().release(BufferKind::kAccumulated, nbytes_of(partial_));
    partial_ = at::Tensor();
  }
  spec_ = ReduceSpec{};
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
  return c10::elementSize(mp_.reduce_dtype) > c10::elementSize(flat_->param_dtype());
}

void ShardedUnit::ensure_grad_valid() {
  if (grad_hold_ != GradHold::kNone) return;
  flat_->grad_shard().zero_();
  transition_to(grad_hold_, GradHold::kSharded, "ensure_grad_valid", label());
}

}  // namespace fsdp::detail

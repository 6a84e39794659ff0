// ShardedModelImpl: the root state — unit construction and the scheduling of
// an iteration: its training state, prefetching, the reduction queue, the
// end-of-backward callback. Options are in options.cpp, planning in plan.cpp,
// the public API in api.cpp.
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>

#include "fsdp/common/device.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/state.h"

namespace fsdp::detail {

ShardedModelImpl::ShardedModelImpl(const std::shared_ptr<nn::UnitBase>& root, const comm::ProcessGroupPtr& world,
                                   const FsdpOptions& options)
    : options_(options), root_module_(root), world_(world) {
  FSDP_CHECK(root != nullptr, "fully_shard: the root module is null");
  FSDP_CHECK(world != nullptr, "fully_shard: the process group is null; create one with comm::init_process_group");
  FSDP_CHECK(root->hooks() == nullptr,
             "this model is already sharded (its root unit has hooks); call fully_shard once per model");
  check_options(options_, world->size());

  if (options_.strategy == ShardingStrategy::kHybridShard) {
    comm::HybridGroups g = comm::make_hybrid_groups(*world, options_.hybrid_shard_size);
    shard_group_ = g.shard;
    replicate_group_ = g.replicate->size() > 1 ? g.replicate : nullptr;
  } else {
    shard_group_ = world;
  }
  build_units();
  counters_base_shard_ = shard_group_->counters();
  if (replicate_group_) counters_base_replicate_ = replicate_group_->counters();
}

ShardedModelImpl::~ShardedModelImpl() {
  if (pool_) pool_->set_reclaim(nullptr);  // its blocks may outlive the engine
  for (auto& m : unit_modules_) m->set_hooks(nullptr);
}

void ShardedModelImpl::build_units() {
  std::vector<PlannedUnit> plan = plan_units(root_module_, options_);

  // --- flat parameters, shards, hooks
  FlatParamOptions fpo;
  fpo.param_dtype = options_.mixed_precision.param_dtype;
  fpo.shard_dtype = fpo.master_dtype = options_.mixed_precision.master_dtype;
  fpo.device = options_.device;
  fpo.shard_device = options_.cpu_offload ? at::Device(at::kCPU) : options_.device;
  fpo.pin_shards = options_.cpu_offload && options_.device.is_cuda();
  // Note [One-rank shard groups]
  // A shard group of one rank holds every parameter in its shard. When that
  // shard can be the parameters themselves (same dtype, same device), sharding
  // would only copy it into a buffer and free the buffer again, twice a step:
  // the unit is laid out as NO_SHARD's single copy instead — nothing gathered,
  // freed or copied, no extra memory — as PyTorch FSDP does at world size 1.
  // Gradients are still averaged over the replicas (HYBRID). With a bf16 compute
  // copy or CPU offload the strategy stands: keeping the compute copy resident
  // would cost memory the user asked not to spend.
  replicated_ = options_.strategy == ShardingStrategy::kNoShard || keeps_single_copy(options_, shard_group_->size());
  fpo.shard_rank = replicated_ ? 0 : shard_group_->rank();
  fpo.shard_size = replicated_ ? 1 : shard_group_->size();
  fpo.replicated = replicated_;
  fpo.ledger = ledger_;
  if (options_.device.is_cuda() || options_.unsharded_pool) {
    // Note [Preallocated pool]: the plan's bound for one step, plus the
    // alignment of the blocks live at once (a few dozen at most).
    const ShardingPlan sp = plan_sharding(root_module_, world_->size(), world_->rank(), options_);
    if (sp.step_unsharded_bytes > 0) {
      pool_ = std::make_shared<UnshardedPool>(options_.device,
                                              sp.step_unsharded_bytes + kPoolAlignmentBlocks * UnshardedPool::kAlignment);
      // A fragmented pool first gets back the oldest reduction's buffers.
      pool_->set_reclaim([this] {
        if (pending_reduces_.empty()) return false;
        pending_reduces_.front()->finish_reduce();
        pending_reduces_.pop_front();
        return true;
      });
      fpo.pool = pool_;
    }
  } else if (options_.device.is_cpu()) {
    // Cache up to two blocks of the largest repeated unit: what the next unit
    // takes while the previous one is being released (Note [Host buffers from
    // mmap]). Repeated: a size several units share (the decoder layers); a
    // language model's embedding and head, gathered twice a step each, are
    // larger and are not kept between uses (they would stay resident). With no
    // repeated size, the largest non-root unit.
    const auto padded = [&](const std::vector<FlatParam::Source>& sources) {
      int64_t numel = 0;
      for (const auto& s : sources) numel += s.param.numel();
      return (numel + fpo.shard_size - 1) / fpo.shard_size * fpo.shard_size;
    };
    std::map<int64_t, int> sizes;  // padded elements of a non-root unit -> how many units have it
    for (size_t k = 1; k < plan.size(); ++k) ++sizes[padded(plan[k].sources) + padded(plan[k].frozen)];
    int64_t largest = sizes.empty() ? 0 : sizes.rbegin()->first;
    for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
      if (it->second >= 2) {
        largest = it->first;
        break;
      }
    }
    host_pool_ = std::make_shared<internals::HostBufferPool>(
        static_cast<size_t>(2 * largest) * c10::elementSize(fpo.param_dtype));
    fpo.host_pool = host_pool_;
  }
  // Note [Frozen shards in the param dtype]
  // A master copy exists for the optimizer to update. Frozen parameters are
  // never updated, so under a mixed-precision policy their shard holds the
  // param dtype: every gather would round the master to it anyway, so compute
  // sees the same values to the bit, and the shard takes half the bytes with
  // bf16 (what LoRA keeps most of: the frozen base). No cast at each gather
  // either; under NO_SHARD the shard is the compute copy itself (single copy,
  // FlatParam), so frozen parameters take no unsharded memory there. What
  // changes: a checkpoint or export of frozen weights holds the rounded values
  // the run computed with (plan_sharding counts the bytes alike).
  const auto make_flat = [&](std::vector<FlatParam::Source> sources, bool trainable) {
    FlatParamOptions o = fpo;
    o.trainable = trainable;
    if (!trainable) o.shard_dtype = fpo.param_dtype;
    auto flat = std::make_unique<FlatParam>(std::move(sources), o);
    at::Tensor source;
    if (options_.sync_module_states && world_->size() > 1) {
      // Rank 0's values, one flat parameter at a time (on the group's device:
      // NCCL broadcasts device memory). Other ranks may hold meta parameters.
      source = world_->rank() == 0
                   ? flat->gather_source_values().to(options_.device)
                   : at::empty({flat->layout().numel}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
      world_->broadcast(source, 0)->wait();
    }
    flat->init_shard(source, options_.init_rule, options_.seed);
    flat->bind(/*keep_allocated=*/replicated_);
    return flat;
  };
  for (auto& u : nn::find_units(root_module_)) u.second->set_hooks(nullptr);  // folded units: plain call
  for (size_t k = 0; k < plan.size(); ++k) {
    PlannedUnit& pu = plan[k];
    const bool lists_trainable = pu.lists_trainable(), lists_frozen = pu.lists_frozen();
    std::unique_ptr<FlatParam> flat = make_flat(std::move(pu.sources), /*trainable=*/true);
    std::unique_ptr<FlatParam> frozen = lists_frozen ? make_flat(std::move(pu.frozen), /*trainable=*/false) : nullptr;
    const std::string type_name = pu.module->inner_type_name();
    bool contains_units = false;
    for (size_t j = 0; j < plan.size(); ++j) {
      contains_units = contains_units || (j != k && (pu.name.empty() || plan[j].name.rfind(pu.name + ".", 0) == 0));
    }
    auto unit = std::make_shared<ShardedUnit>(this, k, pu.name, type_name, k == 0, pu.checkpoint, std::move(flat),
                                              std::move(frozen), contains_units);
    if (lists_trainable) {
      infos_.push_back(unit_info(pu, unit->flat().layout(), unit->flat().shard_offset(), /*trainable=*/true));
      entries_.push_back({unit.get(), &unit->flat()});
    }
    if (lists_frozen) {
      infos_.push_back(unit_info(pu, unit->frozen()->layout(), unit->frozen()->shard_offset(), /*trainable=*/false));
      entries_.push_back({unit.get(), unit->frozen()});
    }
    unit->register_grad_hooks();
    unit->begin_iteration();
    pu.module->set_hooks(unit);
    unit_modules_.push_back(pu.module);
    units_.push_back(std::move(unit));
  }
  // Buffers are replicated, not sharded: cast (and with sync_module_states,
  // broadcast) them in place.
  for (auto& b : root_module_->named_buffers(/*recurse=*/true)) {
    at::Tensor t = b.value();
    FSDP_CHECK(!t.is_meta(), "buffer '", b.key(), "' is on the meta device; buffers are not sharded, so the model "
               "must create them materialized (or compute them in forward)");
    at::Tensor moved = t.to(options_.device, t.is_floating_point() ? options_.mixed_precision.buffer_dtype
                                                                   : t.scalar_type()).contiguous();
    if (options_.sync_module_states && world_->size() > 1) world_->broadcast(moved, 0)->wait();
    internals::rebind_data(t, moved);
  }
  prev_pos_.assign(units_.size(), -1);
  fwd_pos_.assign(units_.size(), -1);
}

// ---- iteration bookkeeping --------------------------------------------------

bool ShardedModelImpl::reshards_after_forward(const ShardedUnit& u) const {
  if (u.is_root() || replicated_) return false;  // root: needed again at once by backward
  return options_.strategy == ShardingStrategy::kFullShard || options_.strategy == ShardingStrategy::kHybridShard;
}

void ShardedModelImpl::on_pre_forward(ShardedUnit& u) {
  if (u.is_root()) {
    FSDP_CHECK(state_ != TrainingState::kBackward, "forward called while a backward pass of the same model is running");
    FSDP_CHECK(state_ != TrainingState::kAwaitingBackward,
               "forward called again before backward ran on the previous forward's loss; FSDP runs one forward "
               "per backward (every rank must issue the same collectives): call backward() on the previous loss, "
               "or drop it (destroying its graph ends that iteration), or run evaluation under at::NoGradGuard");
    FSDP_CHECK(state_ == TrainingState::kIdle, "the root unit was called from inside its own forward");
    transition_to(state_, TrainingState::kForward, "pre_forward", "the root");
    ++iteration_;
    live_graph_nodes_ = 0;
    if (!forward_order_.empty()) {
      prev_forward_order_ = forward_order_;
      std::fill(prev_pos_.begin(), prev_pos_.end(), -1);
      for (size_t k = 0; k < prev_forward_order_.size(); ++k) prev_pos_[prev_forward_order_[k]->index()] = int(k);
    }
    forward_order_.clear();
    std::fill(fwd_pos_.begin(), fwd_pos_.end(), -1);
    for (auto& x : units_) x->begin_iteration();
  } else {
    FSDP_CHECK(state_ == TrainingState::kForward, "unit '", u.name(),
               "' was called outside its model's forward; call the model through its root unit");
  }
  note_consumed(u);
  fwd_pos_[u.index()] = static_cast<int>(forward_order_.size());
  forward_order_.push_back(&u);
  u.unshard();
  if (options_.forward_prefetch) {
    const int k = prev_pos_[u.index()];
    if (k >= 0 && size_t(k + 1) < prev_forward_order_.size()) prefetch(prev_forward_order_[size_t(k + 1)]);
  }
}

void ShardedModelImpl::on_post_forward(ShardedUnit& u) {
  if (!u.is_root()) return;
  if (live_graph_nodes_ > 0) {
    transition_to(state_, TrainingState::kAwaitingBackward, "post_forward", "the root");
  } else {
    // Nothing of the forward requires grad: no backward will come.
    release_iteration();
    transition_to(state_, TrainingState::kIdle, "post_forward", "the root");
  }
}

void ShardedModelImpl::on_forward_failed() {
  // A secondary failure (a collective that broke) leaves the model unusable;
  // the first exception is the one to report.
  try {
    release_iteration();
  } catch (...) {
  }
  transition_to(state_, TrainingState::kIdle, "on_forward_failed", "the root");
}

void ShardedModelImpl::on_eval_forward(ShardedUnit& u) {
  (void)u;
  FSDP_CHECK(state_ != TrainingState::kBackward, "forward called while a backward pass of the same model is running");
  FSDP_CHECK(state_ != TrainingState::kAwaitingBackward,
             "evaluation forward (grad mode off) while the previous training forward's graph awaits backward: "
             "it would release parameters that graph still needs; call backward() on that loss, or drop it, first");
}

void ShardedModelImpl::on_graph_node_created(int64_t iteration) {
  if (iteration == iteration_) ++live_graph_nodes_;
}

void ShardedModelImpl::on_graph_node_destroyed(int64_t iteration) {
  if (iteration != iteration_) return;
  if (--live_graph_nodes_ == 0 && state_ == TrainingState::kAwaitingBackward) {
    // The graph was dropped without backward (Note [Graph lifetime]). Runs in
    // a destructor: nothing here throws (no collective is in flight).
    release_iteration();
    transition_to(state_, TrainingState::kIdle, "graph dropped", "the root");
  }
}

void ShardedModelImpl::check_backward(int64_t iteration) const {
  FSDP_CHECK(!at::GradMode::is_enabled(),
             "backward with create_graph=true is not supported: FSDP frees each unit's parameters after its "
             "backward, which a graph of the gradients would still need; call backward() without create_graph");
  FSDP_CHECK(iteration == iteration_ &&
                 (state_ == TrainingState::kAwaitingBackward || state_ == TrainingState::kBackward),
             "backward through a graph that is not the latest forward's, or whose backward already ran "
             "(retain_graph): FSDP runs exactly one backward per forward");
}

void ShardedModelImpl::prefetch(ShardedUnit* u) {
  if (u == nullptr || u->state() != ShardState::kSharded) return;
  if (prefetched_pending_ >= options_.limit_all_gathers) return;  // rate limit
  u->unshard();
  if (u->state() != ShardState::kSharded) {
    u->prefetched_ = true;
    ++prefetched_pending_;
  }
}

void ShardedModelImpl::note_consumed(ShardedUnit& u) {
  if (u.prefetched_) {
    u.prefetched_ = false;
    --prefetched_pending_;
  }
}

void ShardedModelImpl::on_pre_backward(ShardedUnit& u) {
  if (state_ == TrainingState::kAwaitingBackward) {
    internals::queue_backward_callback([this] { end_of_backward(); });
    transition_to(state_, TrainingState::kBackward, "pre_backward", "the root");
  }
  note_consumed(u);
  u.unshard();
  if (options_.backward_prefetch == BackwardPrefetch::kPre) prefetch(previous_in_forward(u));
}

ShardedUnit* ShardedModelImpl::previous_in_forward(const ShardedUnit& u) const {
  // Never the root: it encloses every other unit, so its backward began
  // first. It is unsharded until its own post-backward, after which nothing
  // of it is needed (it comes early when its only trainable parameters are
  // used last in forward, the others frozen).
  const int k = fwd_pos_[u.index()];
  return k > 1 ? forward_order_[size_t(k - 1)] : nullptr;
}

void ShardedModelImpl::after_post_backward(ShardedUnit& u) {
  if (u.grad_state() == GradState::kReduceIssued) {
    pending_reduces_.push_back(&u);
    while (pending_reduces_.size() > kMaxInflightReduces) {
      pending_reduces_.front()->finish_reduce();
      pending_reduces_.pop_front();
    }
  }
  if (options_.backward_prefetch == BackwardPrefetch::kPost) prefetch(previous_in_forward(u));
}

// Note [End of backward]
// Runs once the autograd engine finished the graph. Units whose gradients did
// not all arrive (a parameter without gradient, a unit whose output was not
// used) are reduced now, in unit order — the same on every rank, so the
// collectives match. Then every reduction is waited for and every unit
// resharded; the optimizer sees valid gradient shards (zeros where nothing
// arrived).
void ShardedModelImpl::end_of_backward() {
  for (auto& u : units_) {
    const bool pending = u->grad_state() == GradState::kIdle || u->grad_state() == GradState::kCollecting;
    if (pending && (u->ran_forward() || u->holds_unsharded_grads())) u->post_backward(/*flush=*/true);
  }
  while (!pending_reduces_.empty()) {
    pending_reduces_.front()->finish_reduce();
    pending_reduces_.pop_front();
  }
  release_iteration();
  if (options_.cpu_offload && options_.device.is_cuda()) {
    // The reductions' results reach the host shards by non-blocking copies,
    // and the optimizer reads them on the host next: the one host wait of an
    // offloaded step (none without offload).
    synchronize(options_.device);
  }
  if (sync_grads_) {
    for (auto& u : units_) u->ensure_grad_valid();
  }
  transition_to(state_, TrainingState::kIdle, "end_of_backward", "the root");
}

void ShardedModelImpl::release_iteration() {
  for (auto& u : units_) {
    u->reshard();
    u->prefetched_ = false;
  }
  prefetched_pending_ = 0;
}

void ShardedModelImpl::assert_idle(const char* what) const {
  FSDP_CHECK(state_ != TrainingState::kForward && state_ != TrainingState::kBackward, what,
             " called during forward or backward; call it between steps");
}

}  // namespace fsdp::detail

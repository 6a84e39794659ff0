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
#include "fsdp/common/trace.h"
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

// Note [Engine construction]
// build_units makes the engine from the plan in named steps, in this order on
// every rank (several steps are collective): the plan and its one-rank
// groups, the buffer pool the flat parameters draw from, the flat parameters
// with their units and hooks (a broadcast each with sync_module_states), the
// hpZ groups (collective), the scheduler, and the model's buffers (a
// broadcast each with sync_module_states).
void ShardedModelImpl::build_units() {
  const int shard_size = shard_group_->size();
  std::vector<PlannedUnit> plan = plan_units(root_module_, options_, shard_size);
  for (const at::Tensor& t : options_.ignored_params) {
    FSDP_CHECK(!t.is_meta(), "an ignored parameter (FsdpOptions::ignored_params, ", t.sizes(), ") is on the meta "
               "device: FSDP leaves ignored parameters to the caller, so materialize them before fully_shard");
  }
  const std::vector<bool> replicated = plan_replicated_units(plan, shard_size);
  FlatParamOptions fpo;
  fpo.device = options_.device;
  fpo.ledger = ledger_;
  make_buffer_pool(plan, shard_size, fpo);
  for (auto& u : nn::find_units(root_module_)) u.second->set_hooks(nullptr);  // folded units: plain call
  std::vector<ScheduleUnit> sched_units = schedule_units(plan, options_, shard_size,
                                                         replicate_group_ ? replicate_group_->size() : 1);
  std::vector<UnitPolicy> policies = schedule_policies(plan);
  for (size_t k = 0; k < plan.size(); ++k) make_unit(plan, k, replicated[k], fpo, policies[k].post_forward_group);
  // Groups of reshard_after_forward = int (hpZ): consecutive ranks of the
  // shard group, as FSDP2 views its mesh (-1, g). Collective: every rank
  // plans the same sizes.
  for (auto& [g, group] : post_forward_groups_) group = comm::make_hybrid_groups(*shard_group_, g).shard;
  sched_ = std::make_unique<StepScheduler>(std::move(sched_units), std::move(policies), schedule_options(options_));
  place_buffers();
}

// Note [One-rank shard groups]
// A shard group of one rank holds every parameter in its shard. When that
// shard can be the parameters themselves (same dtype, same device), sharding
// would only copy it into a buffer and free the buffer again, twice a step:
// the unit is laid out as NO_SHARD's single copy instead — nothing gathered,
// freed or copied, no extra memory — as PyTorch FSDP does at world size 1.
// Gradients are still averaged over the replicas (HYBRID). With a bf16 compute
// copy or CPU offload the strategy stands: keeping the compute copy resident
// would cost memory the user asked not to spend. Decided per unit (its own
// precision and offload may differ).
std::vector<bool> ShardedModelImpl::plan_replicated_units(const std::vector<PlannedUnit>& plan, int shard_size) {
  std::vector<bool> unit_replicated_flags;
  replicated_ = true;
  for (const PlannedUnit& pu : plan) {
    unit_replicated_flags.push_back(unit_replicated(pu, options_, shard_size));
    replicated_ = replicated_ && unit_replicated_flags.back();
  }
  return unit_replicated_flags;
}

namespace {

// Cache up to two blocks of the largest repeated unit: what the next unit
// takes while the previous one is being released (Note [Host buffers from
// mmap]). Repeated: a size several units share (the decoder layers); a
// language model's embedding and head, gathered twice a step each, are
// larger and are not kept between uses (they would stay resident). With no
// repeated size, the largest non-root unit.
int64_t largest_repeated_unit_bytes(const std::vector<PlannedUnit>& plan, int shard_size) {
  const auto padded_bytes = [&](const PlannedUnit& pu, const std::vector<FlatParam::Source>& sources) {
    int64_t numel = 0;
    for (const auto& s : sources) numel += s.param.numel();
    return (numel + shard_size - 1) / shard_size * shard_size *
           static_cast<int64_t>(c10::elementSize(pu.mixed_precision.param_dtype));
  };
  std::map<int64_t, int> sizes;  // padded bytes of a non-root unit -> how many units have it
  for (size_t k = 1; k < plan.size(); ++k) ++sizes[padded_bytes(plan[k], plan[k].sources) + padded_bytes(plan[k], plan[k].frozen)];
  int64_t largest = sizes.empty() ? 0 : sizes.rbegin()->first;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    if (it->second >= 2) {
      largest = it->first;
      break;
    }
  }
  return largest;
}

// Whether unit `k`'s subtree holds other units of the plan.
bool contains_other_units(const std::vector<PlannedUnit>& plan, size_t k) {
  const PlannedUnit& pu = plan[k];
  bool contains_units = false;
  for (size_t j = 0; j < plan.size(); ++j) {
    contains_units = contains_units || (j != k && (pu.name.empty() || plan[j].name.rfind(pu.name + ".", 0) == 0));
  }
  return contains_units;
}

}  // namespace

void ShardedModelImpl::make_buffer_pool(const std::vector<PlannedUnit>& plan, int shard_size, FlatParamOptions& fpo) {
  if (options_.device.is_cuda() || options_.unsharded_pool) {
    // Note [Preallocated pool]: the plan's bound for one step, plus the
    // alignment of the blocks live at once (a few dozen at most).
    const ShardingPlan sp = plan_sharding(root_module_, world_->size(), world_->rank(), options_);
    if (sp.step_unsharded_bytes > 0) {
      pool_ = std::make_shared<UnshardedPool>(options_.device,
                                              sp.step_unsharded_bytes + kPoolAlignmentBlocks * UnshardedPool::kAlignment);
      // A fragmented pool first gets back the oldest reduction's buffers.
      pool_->set_reclaim([this] { return reclaim_oldest_reduction(); });
      fpo.pool = pool_;
    }
  } else if (options_.device.is_cpu()) {
    host_pool_ = std::make_shared<internals::HostBufferPool>(
        static_cast<size_t>(2 * largest_repeated_unit_bytes(plan, shard_size)));
    fpo.host_pool = host_pool_;
  }
}

bool ShardedModelImpl::reclaim_oldest_reduction() {
  // The oldest reduction actually issued: one whose finish the events
  // being executed hold further on (it is then skipped there), else the
  // schedule's oldest in flight that the engine has issued.
  std::vector<Event> events;
  if (executing_ != nullptr) {
    for (size_t i = executing_pos_ + 1; i < executing_->size(); ++i) {
      const Event& e = (*executing_)[i];
      if (e.kind != EventKind::kFinishReduce ||
          units_[size_t(e.unit)]->grad_state() != GradState::kReduceIssued) {
        continue;
      }
      events.push_back(e);
      run_events(events);
      reclaimed_.push_back(e.unit);  // skipped when the events reach it
      return true;
    }
  }
  for (int u : sched_->in_flight()) {
    if (units_[size_t(u)]->grad_state() != GradState::kReduceIssued) continue;
    sched_->finish_now(u, events);
    run_events(events);
    return true;
  }
  return false;
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
std::unique_ptr<FlatParam> ShardedModelImpl::make_flat(const FlatParamOptions& fpo, const PlannedUnit& pu,
                                                       bool replicated, std::vector<FlatParam::Source> sources,
                                                       bool trainable) {
  FlatParamOptions o = fpo;
  o.param_dtype = pu.mixed_precision.param_dtype;
  o.shard_dtype = o.master_dtype = pu.mixed_precision.master_dtype;
  o.shard_device = pu.cpu_offload ? at::Device(at::kCPU) : options_.device;
  o.pin_shards = pu.cpu_offload && options_.device.is_cuda() && options_.pin_memory;
  o.shard_rank = replicated ? 0 : shard_group_->rank();
  o.shard_size = replicated ? 1 : shard_group_->size();
  o.replicated = replicated;
  o.trainable = trainable;
  if (!trainable) o.shard_dtype = o.param_dtype;
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
  flat->bind(/*keep_allocated=*/replicated);
  return flat;
}

void ShardedModelImpl::make_unit(std::vector<PlannedUnit>& plan, size_t k, bool replicated,
                                 const FlatParamOptions& fpo, int post_forward_group) {
  PlannedUnit& pu = plan[k];
  const bool lists_trainable = pu.lists_trainable(), lists_frozen = pu.lists_frozen();
  std::unique_ptr<FlatParam> flat = make_flat(fpo, pu, replicated, std::move(pu.sources), /*trainable=*/true);
  std::unique_ptr<FlatParam> frozen =
      lists_frozen ? make_flat(fpo, pu, replicated, std::move(pu.frozen), /*trainable=*/false) : nullptr;
  const std::string type_name = pu.module->inner_type_name();
  const bool contains_units = contains_other_units(plan, k);
  auto unit = std::make_shared<ShardedUnit>(this, k, pu.name, type_name, k == 0, pu.checkpoint, std::move(flat),
                                            std::move(frozen), contains_units, replicated, pu.mixed_precision);
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
  unit_names_.push_back(pu.name);
  units_.push_back(std::move(unit));
  const int g = post_forward_group;
  if (g > 1 && !replicated && post_forward_groups_.count(g) == 0) post_forward_groups_[g] = nullptr;
}

// Buffers are replicated, not sharded: cast (and with sync_module_states,
// broadcast) them in place.
void ShardedModelImpl::place_buffers() {
  for (auto& b : root_module_->named_buffers(/*recurse=*/true)) {
    at::Tensor t = b.value();
    FSDP_CHECK(!t.is_meta(), "buffer '", b.key(), "' is on the meta device; buffers are not sharded, so the model "
               "must create them materialized (or compute them in forward)");
    at::Tensor moved = t.to(options_.device, t.is_floating_point() ? options_.mixed_precision.buffer_dtype
                                                                   : t.scalar_type()).contiguous();
    if (options_.sync_module_states && world_->size() > 1) world_->broadcast(moved, 0)->wait();
    internals::rebind_data(t, moved);
  }
}

// ---- executing the schedule --------------------------------------------------

const comm::ProcessGroupPtr& ShardedModelImpl::post_forward_group(int size) const {
  static const comm::ProcessGroupPtr kNone;
  if (size <= 0) return kNone;
  const auto it = post_forward_groups_.find(size);
  FSDP_ASSERT(it != post_forward_groups_.end() && it->second != nullptr, "no post-forward group of ", size, " ranks");
  return it->second;
}

void ShardedModelImpl::note(EventKind kind, const ShardedUnit& u) {
  if (!trace::enabled()) return;
  const int64_t now = trace::now_us();
  trace::record(to_string(kind), "schedule", now, now, -1,
                to_string(Event{kind, static_cast<int>(u.index()), 0, false}, unit_names_));
}

void ShardedModelImpl::execute(std::vector<Event>& events) {
  const std::vector<Event>* outer = executing_;
  const size_t outer_pos = executing_pos_;
  executing_ = &events;
  try {
    run_events(events);
  } catch (...) {
    executing_ = outer;
    executing_pos_ = outer_pos;
    events.clear();
    throw;
  }
  executing_ = outer;
  executing_pos_ = outer_pos;
  events.clear();
}

void ShardedModelImpl::run_events(const std::vector<Event>& events) {
  // Executed in order; each primitive asserts the state it needs, so a
  // schedule that disagrees with the units stops here (Note [Step schedule]).
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (&events == executing_) executing_pos_ = i;
    ShardedUnit& u = *units_[size_t(e.unit)];
    if (e.kind == EventKind::kFinishReduce) {
      const auto it = std::find(reclaimed_.begin(), reclaimed_.end(), e.unit);
      if (it != reclaimed_.end()) {  // finished early by the pool (above)
        reclaimed_.erase(it);
        continue;
      }
    }
    switch (e.kind) {
      case EventKind::kUnshard:
      case EventKind::kPrefetch: u.unshard(post_forward_group(e.group)); break;
      case EventKind::kWait: u.wait_for_unshard(); break;
      case EventKind::kReshard: {
        const comm::ProcessGroupPtr& g = post_forward_group(e.group);
        u.reshard(e.group, g ? g->rank() : 0);
        break;
      }
      case EventKind::kPreBackward: u.begin_backward(); break;
      case EventKind::kPostBackward: u.end_backward(); break;
      case EventKind::kReduce: u.reduce(sched_->policy(e.unit).all_reduce); break;
      case EventKind::kKeepGrads: u.keep_grads(); break;
      case EventKind::kFinishReduce: u.finish_reduce(e.replicas); break;
      default: FSDP_ASSERT(false, "the schedule asked to execute a marker: ", to_string(e.kind));
    }
    if (trace::enabled()) {
      const int64_t now = trace::now_us();
      trace::record(to_string(e.kind), "schedule", now, now, -1, to_string(e, unit_names_));
    }
  }
}

// ---- iteration bookkeeping --------------------------------------------------

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
    sched_->begin_iteration(actions_);
    execute(actions_);
    for (auto& x : units_) x->begin_iteration();
  } else {
    FSDP_CHECK(state_ == TrainingState::kForward, "unit '", u.name(),
               "' was called outside its model's forward; call the model through its root unit");
  }
  sched_->pre_forward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

void ShardedModelImpl::on_post_forward(ShardedUnit& u) {
  sched_->post_forward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

void ShardedModelImpl::on_forward_done(ShardedUnit& u) {
  if (!u.is_root()) return;
  if (live_graph_nodes_ > 0) {
    transition_to(state_, TrainingState::kAwaitingBackward, "post_forward", "the root");
  } else {
    // Nothing of the forward requires grad: no backward will come.
    sched_->release_iteration(actions_);
    execute(actions_);
    transition_to(state_, TrainingState::kIdle, "post_forward", "the root");
  }
}

void ShardedModelImpl::on_forward_failed() {
  // A secondary failure (a collective that broke) leaves the model unusable;
  // the first exception is the one to report.
  try {
    actions_.clear();
    sched_->release_iteration(actions_);
    execute(actions_);
  } catch (...) {
    actions_.clear();
  }
  transition_to(state_, TrainingState::kIdle, "on_forward_failed", "the root");
}

void ShardedModelImpl::on_eval_pre_forward(ShardedUnit& u) {
  FSDP_CHECK(state_ != TrainingState::kBackward, "forward called while a backward pass of the same model is running");
  FSDP_CHECK(state_ != TrainingState::kAwaitingBackward,
             "evaluation forward (grad mode off) while the previous training forward's graph awaits backward: "
             "it would release parameters that graph still needs; call backward() on that loss, or drop it, first");
  sched_->eval_pre_forward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

void ShardedModelImpl::on_eval_post_forward(ShardedUnit& u) {
  sched_->eval_post_forward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

void ShardedModelImpl::on_graph_node_created(int64_t iteration) {
  if (iteration == iteration_) ++live_graph_nodes_;
}

void ShardedModelImpl::on_graph_node_destroyed(int64_t iteration) {
  if (iteration != iteration_) return;
  if (--live_graph_nodes_ == 0 && state_ == TrainingState::kAwaitingBackward) {
    // The graph was dropped without backward (Note [Graph lifetime]). Runs in
    // a destructor: nothing here throws (no collective is in flight).
    std::vector<Event> events;
    sched_->release_iteration(events);
    execute(events);
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

void ShardedModelImpl::on_pre_backward(ShardedUnit& u) {
  if (state_ == TrainingState::kAwaitingBackward) {
    internals::queue_backward_callback([this] { end_of_backward(); });
    transition_to(state_, TrainingState::kBackward, "pre_backward", "the root");
  }
  sched_->pre_backward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

void ShardedModelImpl::on_post_backward(ShardedUnit& u) {
  sched_->post_backward(static_cast<int>(u.index()), actions_);
  execute(actions_);
}

// Note [End of backward]
// Runs once the autograd engine finished the graph. Units whose gradients did
// not all arrive (a parameter without gradient, a unit whose output was not
// used) are reduced now, in unit order — the same on every rank, so the
// collectives match. Then every reduction is waited for and every unit
// resharded (the schedule's end_of_backward); the optimizer sees valid
// gradient shards (zeros where nothing arrived).
void ShardedModelImpl::end_of_backward() {
  sched_->end_of_backward(actions_);
  execute(actions_);
  if (options_.cpu_offload && options_.device.is_cuda()) {
    // The reductions' results reach the host shards by non-blocking copies,
    // and the optimizer reads them on the host next: the one host wait of an
    // offloaded step (none without offload).
    synchronize(options_.device);
  }
  for (auto& u : units_) {
    if (sched_->policy(static_cast<int>(u->index())).sync_grads && u->grad_state() != GradState::kReduceIssued) {
      u->ensure_grad_valid();
    }
  }
  transition_to(state_, TrainingState::kIdle, "end_of_backward", "the root");
}

void ShardedModelImpl::assert_idle(const char* what) const {
  FSDP_CHECK(state_ != TrainingState::kForward && state_ != TrainingState::kBackward, what,
             " called during forward or backward; call it between steps");
}

}  // namespace fsdp::detail

// ShardedModelImpl: the root state — unit construction, wrap policies,
// iteration bookkeeping, prefetching, the end-of-backward callback, and the
// public ShardedModel API.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/state.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& s) {
  if (s == "full" || s == "FULL_SHARD") return ShardingStrategy::kFullShard;
  if (s == "grad-op" || s == "SHARD_GRAD_OP") return ShardingStrategy::kShardGradOp;
  if (s == "none" || s == "NO_SHARD") return ShardingStrategy::kNoShard;
  if (s == "hybrid" || s == "HYBRID_SHARD") return ShardingStrategy::kHybridShard;
  FSDP_CHECK(false, "unknown sharding strategy '", s, "'; accepted: full, grad-op, none, hybrid");
  return ShardingStrategy::kFullShard;
}

const char* to_string(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kNone: return "none";
    case BackwardPrefetch::kPre: return "pre";
    case BackwardPrefetch::kPost: return "post";
  }
  return "?";
}

BackwardPrefetch parse_backward_prefetch(const std::string& s) {
  if (s == "none") return BackwardPrefetch::kNone;
  if (s == "pre" || s == "BACKWARD_PRE") return BackwardPrefetch::kPre;
  if (s == "post" || s == "BACKWARD_POST") return BackwardPrefetch::kPost;
  FSDP_CHECK(false, "unknown backward prefetch '", s, "'; accepted: pre, post, none");
  return BackwardPrefetch::kPre;
}

WrapPolicy parse_wrap_policy(const std::string& spec, std::type_index block_type) {
  if (spec == "block") return WrapPolicy::by_type({block_type});
  if (spec == "root") return WrapPolicy::root_only();
  if (spec == "all") return WrapPolicy::every_unit();
  if (spec.rfind("size:", 0) == 0) {
    const std::string num = spec.substr(5);
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FSDP_CHECK(!num.empty() && used == num.size() && n >= 1, "--wrap ", spec,
               ": the minimum parameter count after 'size:' must be a positive integer, e.g. size:1000000");
    return WrapPolicy::size_based(n);
  }
  FSDP_CHECK(false, "--wrap '", spec, "' is not one of: block, size:N, root, all");
  return {};
}

MixedPrecision MixedPrecision::preset(const std::string& name) {
  MixedPrecision m;
  if (name == "fp32") return m;
  if (name == "bf16") {
    m.param_dtype = at::kBFloat16;
    m.buffer_dtype = at::kBFloat16;
    return m;
  }
  if (name == "fp16") {
    m.param_dtype = at::kHalf;
    m.buffer_dtype = at::kHalf;
    return m;
  }
  if (name == "bf16-pure") {
    m.param_dtype = m.reduce_dtype = m.buffer_dtype = m.master_dtype = at::kBFloat16;
    return m;
  }
  FSDP_CHECK(false, "unknown mixed precision '", name, "'; accepted: fp32, bf16, fp16, bf16-pure");
  return m;
}

void check_options(const FsdpOptions& o, int world_size) {
  FSDP_CHECK(o.limit_all_gathers >= 1, "--limit-all-gathers must be >= 1 (all-gathers issued ahead of use), got ",
             o.limit_all_gathers);
  const MixedPrecision& mp = o.mixed_precision;
  for (at::ScalarType t : {mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype}) {
    FSDP_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
               "mixed precision dtypes must be float32, bfloat16 or float16; got ", t);
  }
  FSDP_CHECK(mp.master_dtype == at::kFloat || mp.master_dtype == at::kBFloat16,
             "the master (shard) dtype must be float32 or bfloat16 (pure bf16 training); got ", mp.master_dtype);
  FSDP_CHECK(!o.cpu_offload || o.device.is_cpu() || o.device.is_cuda(), "CPU offload needs a CPU or CUDA device, got ",
             o.device);
  FSDP_CHECK(!o.offload_checkpoint_inputs || o.checkpoint_all_units || !o.checkpoint_types.empty(),
             "offloading checkpointed inputs needs activation checkpointing (--activation-checkpointing)");
  if (o.strategy == ShardingStrategy::kHybridShard) {
    const int s = o.hybrid_shard_size;
    FSDP_CHECK(s >= 1, "HYBRID_SHARD needs a shard-group size >= 1 (--hybrid-shard-size, default LOCAL_WORLD_SIZE); "
               "got ", s);
    FSDP_CHECK(world_size <= 0 || world_size % s == 0, "world size ", world_size,
               " is not a multiple of the hybrid shard size ", s,
               "; choose a --hybrid-shard-size that divides the world size");
  }
}

namespace detail {


namespace {

bool is_prefix_of(const std::string& unit, const std::string& param) {
  if (unit.empty()) return true;
  return param.size() > unit.size() && param.compare(0, unit.size(), unit) == 0 && param[unit.size()] == '.';
}

}  // namespace

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
  for (auto& m : unit_modules_) m->set_hooks(nullptr);
}

UnitInfo unit_info(const PlannedUnit& pu, const FlatLayout& layout, int64_t shard_offset) {
  UnitInfo info;
  info.name = pu.name;
  info.type_name = pu.module->inner_type_name();
  info.numel = layout.numel;
  info.padded_numel = layout.padded_numel;
  info.shard_numel = layout.shard_numel;
  info.shard_offset = shard_offset;
  info.checkpointed = pu.checkpoint;
  info.params = layout.params;
  return info;
}

std::vector<PlannedUnit> plan_units(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options) {
  auto all = nn::find_units(root);
  FSDP_ASSERT(!all.empty() && all[0].first.empty() && all[0].second == root);

  // --- which boundaries become units -----------------------------------------
  std::vector<bool> selected(all.size(), false);
  selected[0] = true;
  const WrapPolicy& wp = options.wrap;
  auto params_under = [&](size_t i) {
    std::vector<std::string> names;
    for (auto& p : all[i].second->named_parameters(/*recurse=*/true)) {
      names.push_back(all[i].first.empty() ? p.key() : all[i].first + "." + p.key());
    }
    return names;
  };
  if (wp.kind == WrapPolicy::Kind::kEveryUnit) {
    std::fill(selected.begin(), selected.end(), true);
  } else if (wp.kind == WrapPolicy::Kind::kByType) {
    for (size_t i = 1; i < all.size(); ++i) {
      selected[i] = std::find(wp.types.begin(), wp.types.end(), all[i].second->inner_type()) != wp.types.end();
    }
  } else if (wp.kind == WrapPolicy::Kind::kSize) {
    FSDP_CHECK(wp.min_num_params >= 1, "size-based wrap needs min_num_params >= 1, got ", wp.min_num_params);
    // Children before parents (reverse pre-order): a boundary becomes a unit
    // once its not-yet-wrapped parameters reach min_num_params.
    std::unordered_map<std::string, int64_t> numel_of;
    for (auto& p : root->named_parameters(true)) numel_of[p.key()] = p.value().numel();
    std::unordered_set<std::string> claimed;
    for (size_t i = all.size() - 1; i >= 1; --i) {
      int64_t free_numel = 0;
      auto names = params_under(i);
      for (auto& n : names) {
        if (!claimed.count(n)) free_numel += numel_of[n];
      }
      if (free_numel >= wp.min_num_params) {
        selected[i] = true;
        claimed.insert(names.begin(), names.end());
      }
    }
  }
  // --- parameter ownership: the innermost selected unit whose name prefixes it
  std::vector<PlannedUnit> plan;
  for (size_t i = 0; i < all.size(); ++i) {
    if (selected[i]) plan.push_back({all[i].first, all[i].second, {}, false});
  }
  std::unordered_map<const c10::TensorImpl*, size_t> owner_of;  // shared tensors: listed once
  for (auto& p : root->named_parameters(/*recurse=*/true)) {
    size_t best = 0;  // the root matches every name
    size_t best_len = 0;
    for (size_t k = 1; k < plan.size(); ++k) {
      const std::string& un = plan[k].name;
      if (is_prefix_of(un, p.key()) && un.size() > best_len) {
        best = k;
        best_len = un.size();
      }
    }
    const c10::TensorImpl* impl = p.value().unsafeGetTensorImpl();
    auto it = owner_of.find(impl);
    if (it != owner_of.end()) {
      FSDP_CHECK(it->second == best || it->second == 0,
                 "parameter '", p.key(), "' is shared between unit '", plan[it->second].name, "' and unit '",
                 plan[best].name, "'; shared parameters must belong to one unit — wrap both users in a common "
                 "unit, or leave them to the root");
      continue;  // tied: the first name owns the storage
    }
    owner_of[impl] = best;
    plan[best].sources.push_back({p.key(), p.value()});
  }

  // --- checkpointing: leaf units only (the recompute must not re-enter units)
  for (size_t k = 1; k < plan.size(); ++k) {
    const auto& t = options.checkpoint_types;
    plan[k].checkpoint = options.checkpoint_all_units ||
                         std::find(t.begin(), t.end(), plan[k].module->inner_type()) != t.end();
    if (!plan[k].checkpoint) continue;
    for (size_t j = 0; j < plan.size(); ++j) {
      FSDP_CHECK(j == k || !is_prefix_of(plan[k].name, plan[j].name), "activation checkpointing of unit '",
                 plan[k].name, "' which contains unit '", plan[j].name,
                 "' is not supported; checkpoint the inner units instead");
    }
  }
  return plan;
}

void ShardedModelImpl::build_units() {
  std::vector<PlannedUnit> plan = plan_units(root_module_, options_);

  // --- flat parameters, shards, hooks
  FlatParamOptions fpo;
  fpo.param_dtype = options_.mixed_precision.param_dtype;
  fpo.shard_dtype = options_.mixed_precision.master_dtype;
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
  if (options_.device.is_cpu()) {
    // Cache up to two blocks of the largest non-root unit: what the next unit
    // takes while the previous one is being released (Note [Host buffers from
    // mmap]). The root's block is larger than that in language models
    // (embeddings) and is not kept between steps.
    int64_t largest = 0;
    for (size_t k = 1; k < plan.size(); ++k) {
      int64_t numel = 0;
      for (const auto& s : plan[k].sources) numel += s.param.numel();
      largest = std::max(largest, (numel + fpo.shard_size - 1) / fpo.shard_size * fpo.shard_size);
    }
    host_pool_ = std::make_shared<internals::HostBufferPool>(
        static_cast<size_t>(2 * largest) * c10::elementSize(fpo.param_dtype));
    fpo.host_pool = host_pool_;
  }
  for (auto& u : nn::find_units(root_module_)) u.second->set_hooks(nullptr);  // folded units: plain call
  for (size_t k = 0; k < plan.size(); ++k) {
    PlannedUnit& pu = plan[k];
    auto flat = std::make_unique<FlatParam>(std::move(pu.sources), fpo);
    at::Tensor source;
    if (options_.sync_module_states && world_->size() > 1) {
      // Rank 0's values, one unit at a time (on the group's device: NCCL
      // broadcasts device memory). Other ranks may hold meta parameters.
      source = world_->rank() == 0
                   ? flat->gather_source_values().to(options_.device)
                   : at::empty({flat->layout().numel}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
      world_->broadcast(source, 0)->wait();
    }
    flat->init_shard(source, options_.init_rule, options_.seed);
    flat->bind(/*keep_allocated=*/replicated_);

    infos_.push_back(unit_info(pu, flat->layout(), flat->shard_offset()));
    auto unit = std::make_shared<ShardedUnit>(this, k, pu.name, infos_.back().type_name, k == 0, pu.checkpoint,
                                              std::move(flat));
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
    FSDP_CHECK(!in_backward_, "forward called while a backward pass of the same model is running");
    for (auto& x : units_) {
      FSDP_CHECK(x->grad_state() != GradState::kCollecting && x->grad_state() != GradState::kReduceIssued,
                 "forward started before the previous backward finished (unit '", x->name(),
                 "' is still collecting gradients); call backward() on the previous loss first");
    }
    if (!forward_order_.empty()) {
      prev_forward_order_ = forward_order_;
      std::fill(prev_pos_.begin(), prev_pos_.end(), -1);
      for (size_t k = 0; k < prev_forward_order_.size(); ++k) prev_pos_[prev_forward_order_[k]->index()] = int(k);
    }
    forward_order_.clear();
    std::fill(fwd_pos_.begin(), fwd_pos_.end(), -1);
    for (auto& x : units_) x->begin_iteration();
    in_forward_ = true;
  } else {
    FSDP_CHECK(in_forward_, "unit '", u.name(),
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
  if (u.is_root()) in_forward_ = false;
}

void ShardedModelImpl::on_eval_forward(ShardedUnit& u) {
  (void)u;
  FSDP_CHECK(!in_backward_, "forward called while a backward pass of the same model is running");
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
  if (!callback_queued_) {
    internals::queue_backward_callback([this] { end_of_backward(); });
    callback_queued_ = true;
    in_backward_ = true;
  }
  note_consumed(u);
  u.unshard();
  if (options_.backward_prefetch == BackwardPrefetch::kPre) {
    const int k = fwd_pos_[u.index()];
    if (k > 0) prefetch(forward_order_[size_t(k - 1)]);
  }
}

void ShardedModelImpl::after_post_backward(ShardedUnit& u) {
  if (u.grad_state() == GradState::kReduceIssued) {
    pending_reduces_.push_back(&u);
    while (pending_reduces_.size() > kMaxInflightReduces) {
      pending_reduces_.front()->finish_reduce();
      pending_reduces_.pop_front();
    }
  }
  if (options_.backward_prefetch == BackwardPrefetch::kPost) {
    const int k = fwd_pos_[u.index()];
    if (k > 0) prefetch(forward_order_[size_t(k - 1)]);
  }
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
  for (auto& u : units_) {
    u->reshard();
    u->prefetched_ = false;
    if (sync_grads_) u->ensure_grad_valid();
  }
  prefetched_pending_ = 0;
  in_backward_ = false;
  callback_queued_ = false;
}

void ShardedModelImpl::assert_idle(const char* what) const {
  FSDP_CHECK(!in_backward_ && !in_forward_, what, " called during forward or backward; call it between steps");
}

// ---- public API ---------------------------------------------------------------

std::vector<ShardRef> ShardedModelImpl::shards() const {
  std::vector<ShardRef> out;
  for (const auto& u : units_) out.push_back({u->name(), u->flat().shard(), u->flat().grad_shard()});
  return out;
}

void ShardedModelImpl::zero_grad() {
  assert_idle("zero_grad");
  for (auto& u : units_) {
    FSDP_CHECK(!u->holds_unsharded_grads(), "zero_grad while unit '", u->name(),
               "' holds gradients accumulated without synchronization; run a synchronized backward first");
    u->invalidate_grad();
  }
}

double ShardedModelImpl::grad_norm() {
  assert_idle("grad_norm");
  double local = 0.0;
  for (auto& u : units_) {
    u->ensure_grad_valid();
    local += u->flat().grad_shard().to(at::kDouble).pow(2).sum().item<double>();
  }
  if (!replicated_ && shard_group_->size() > 1) {
    // Shards are disjoint within the shard group; replicas (HYBRID) hold the
    // same shards and are not summed again.
    at::Tensor t = at::full({1}, local, at::TensorOptions().dtype(at::kDouble));
    shard_group_->all_reduce(t, comm::ReduceOp::kSum)->wait();
    local = t.item<double>();
  }
  return std::sqrt(local);
}

double ShardedModelImpl::clip_grad_norm(double max_norm) {
  FSDP_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = grad_norm();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& u : units_) u->flat().grad_shard().mul_(coef);
  }
  return norm;
}

namespace {
// Adds what `group` counted since `base` to `s`, and moves `base` to now.
void take_since(const comm::ProcessGroup& group, comm::CommCounters& base, StepCounters& s) {
  const comm::CommCounters now = group.counters();
  s.allgather_bytes += now.allgather_bytes - base.allgather_bytes;
  s.reduce_scatter_bytes += now.reduce_scatter_bytes - base.reduce_scatter_bytes;
  s.allreduce_bytes += now.allreduce_bytes - base.allreduce_bytes;
  base = now;
}
}  // namespace

StepCounters ShardedModelImpl::take_step_counters() {
  StepCounters s;
  take_since(*shard_group_, counters_base_shard_, s);
  if (replicate_group_) take_since(*replicate_group_, counters_base_replicate_, s);
  return s;
}

at::Tensor ShardedModelImpl::gather_unit(size_t u) {
  assert_idle("gather_unit");
  FSDP_CHECK(u < units_.size(), "gather_unit: unit ", u, " out of range (", units_.size(), " units)");
  FlatParam& f = units_[u]->flat();
  if (replicated_) return f.shard().narrow(0, 0, f.layout().numel).clone();
  at::Tensor full = at::empty({f.layout().padded_numel}, f.shard().options());
  shard_group_->all_gather(full, f.shard())->wait();
  return full.narrow(0, 0, f.layout().numel);
}

void ShardedModelImpl::load_unit(size_t u, const at::Tensor& full) {
  assert_idle("load_unit");
  FSDP_CHECK(u < units_.size(), "load_unit: unit ", u, " out of range (", units_.size(), " units)");
  FlatParam& f = units_[u]->flat();
  FSDP_CHECK(full.numel() == f.layout().numel, "load_unit: unit '", units_[u]->name(), "' has ", f.layout().numel,
             " elements, got ", full.numel());
  f.init_shard(full.reshape({-1}), nullptr, 0);
  units_[u]->reshard();
}

std::vector<MemoryPlacement> ShardedModelImpl::memory_placement() const {
  auto device_name = [](const at::Tensor& t) { return t.device().str(); };
  MemoryPlacement shards{"parameter shards", "", 0, false};
  MemoryPlacement grads{"gradient shards", "", 0, false};
  MemoryPlacement full{"unsharded parameters (resident now)", options_.device.str(), 0, false};
  MemoryPlacement full_grads{"unsharded gradients (resident now)", options_.device.str(), 0, false};
  for (const auto& u : units_) {
    FlatParam& f = u->flat();
    shards.device = device_name(f.shard());
    shards.bytes += f.shard().nbytes();
    shards.pinned = f.shard().is_pinned();
    grads.device = device_name(f.grad_shard());
    grads.bytes += f.grad_shard().nbytes();
    grads.pinned = f.grad_shard().is_pinned();
  }
  full.bytes = ledger_->memory().now.params;
  full_grads.bytes = ledger_->memory().now.grads;
  return {shards, grads, full, full_grads};
}

std::string ShardedModelImpl::describe() const {
  std::ostringstream os;
  int64_t total = 0, padded = 0;
  for (const auto& i : infos_) {
    total += i.numel;
    padded += i.padded_numel;
  }
  os << to_string(options_.strategy) << ": " << infos_.size() << " units, " << total << " parameters (" << padded
     << " padded), shard group " << shard_group_->size()
     << (replicate_group_ ? " x " + std::to_string(replicate_group_->size()) + " replicas" : std::string()) << "\n";
  for (const auto& i : infos_) {
    os << "  unit '" << (i.name.empty() ? "<root>" : i.name) << "' " << i.type_name << ": " << i.params.size()
       << " params, " << i.numel << " elements, padded " << i.padded_numel << ", shard " << i.shard_numel
       << (i.checkpointed ? ", checkpointed" : "") << "\n";
  }
  return os.str();
}

}  // namespace detail

// ---- planning -------------------------------------------------------------------

bool detail::keeps_single_copy(const FsdpOptions& o, int shard_size) {
  const MixedPrecision& mp = o.mixed_precision;
  return shard_size == 1 && mp.param_dtype == mp.master_dtype && (!o.cpu_offload || o.device.is_cpu());
}

ShardingPlan plan_sharding(const std::shared_ptr<nn::UnitBase>& root, int world_size, int rank,
                           const FsdpOptions& options, at::ScalarType optimizer_state_dtype) {
  FSDP_CHECK(root != nullptr, "plan_sharding: the root module is null");
  FSDP_CHECK(world_size >= 1, "the world size (--world-size, the number of processes) must be >= 1, got ",
             world_size);
  FSDP_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " (--rank) is outside [0, ", world_size,
             ") — give a rank below the world size ", world_size);
  ShardingPlan plan;
  switch (options.strategy) {
    case ShardingStrategy::kNoShard: plan.shard_size = 1; break;
    case ShardingStrategy::kHybridShard:
      FSDP_CHECK(options.hybrid_shard_size >= 1 && world_size % options.hybrid_shard_size == 0,
                 "--sharding hybrid: --hybrid-shard-size ", options.hybrid_shard_size,
                 " must be >= 1 and divide the world size ", world_size, " (ranks per shard group)");
      plan.shard_size = options.hybrid_shard_size;
      break;
    default: plan.shard_size = world_size;
  }
  plan.replicas = world_size / plan.shard_size;
  const int shard_rank = rank % plan.shard_size;
  const MixedPrecision& mp = options.mixed_precision;
  const int64_t master = static_cast<int64_t>(c10::elementSize(mp.master_dtype));
  const int64_t pbytes = static_cast<int64_t>(c10::elementSize(mp.param_dtype));
  const int64_t sbytes = static_cast<int64_t>(c10::elementSize(optimizer_state_dtype));

  int64_t largest = 0, all_padded = 0, root_padded = 0;
  for (const auto& pu : detail::plan_units(root, options)) {
    std::vector<ParamPlacement> ps;
    for (const auto& src : pu.sources) {
      ParamPlacement pl;
      pl.name = src.name;
      pl.shape = src.param.sizes().vec();
      pl.numel = src.param.numel();
      ps.push_back(pl);
    }
    const detail::FlatLayout layout = detail::FlatLayout::make(std::move(ps), plan.shard_size);
    plan.units.push_back(detail::unit_info(pu, layout, shard_rank * layout.shard_numel));
    plan.parameters += layout.numel;
    plan.param_shard_bytes += layout.shard_numel * master;
    plan.optimizer_bytes += 2 * layout.shard_numel * sbytes;
    all_padded += layout.padded_numel;
    if (pu.name.empty()) {
      root_padded = layout.padded_numel;
    } else {
      largest = std::max(largest, layout.padded_numel);
    }
  }
  plan.grad_shard_bytes = plan.param_shard_bytes;
  plan.largest_unit_bytes = std::max(largest, root_padded) * pbytes;
  if (detail::keeps_single_copy(options, plan.shard_size)) return plan;  // nothing unsharded: 0

  // Note [Unsharded memory]
  // What the schedule holds at once, from the engine's rules (unit.cpp, and
  // the prefetch and reduction queue above), for units that run forward once
  // each in registration order with the root's gradients completing last:
  // R the root's padded elements, B the largest other unit's, A all of them.
  // - A unit's gradients (B x param bytes) are allocated at its pre-backward.
  //   At its post-backward, with a reduce dtype other than the param dtype, a
  //   reduce-dtype copy is made and the param-dtype buffer released at once
  //   (before the fix the buffer lived until the reduction finished: 6 bytes
  //   per element in flight for bf16, not 4); the reduction is issued into the
  //   gradient shard (a shard-sized scratch only with offloaded shards on
  //   CUDA); then the oldest reduction is waited for once more than
  //   kMaxInflightReduces are in flight. The worst moment of a post-backward is
  //   the copy being made, or the scratch allocated, with kMaxInflightReduces
  //   earlier reductions still in flight.
  // - FULL_SHARD/HYBRID keep the root unsharded through forward and backward;
  //   a block's parameters live from its unshard to its reshard: one block in
  //   backward, two with BACKWARD_PRE (the next one gathered during this one's
  //   backward) — BACKWARD_POST gathers it after this one is resharded.
  //   Prefetching looks one unit ahead, so limit_all_gathers beyond 1 adds
  //   nothing; forward prefetch holds two blocks in forward, when no gradients
  //   exist yet, which is never the maximum.
  // - SHARD_GRAD_OP keeps every unit's parameters from forward until its own
  //   post-backward: j post-backwards in, j blocks are resharded and j
  //   reductions are in flight, so the peak is at j = 0 or j = 2.
  // - NO_SHARD keeps every compute copy resident for the whole run.
  // - The root's post-backward comes last, with two blocks' reductions in flight.
  const int64_t R = root_padded, B = largest, A = all_padded;
  const int64_t rbytes = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
  const bool converts = mp.reduce_dtype != mp.param_dtype;
  const bool scratch = options.cpu_offload && options.device.is_cuda();
  const int64_t in_flight = static_cast<int64_t>(detail::kMaxInflightReduces);
  // A reduction in flight for `n` padded elements, and the worst moment of the post-backward that issues it.
  const auto held = [&](int64_t n) {
    return (converts ? n * rbytes : n * pbytes) + (scratch ? n / plan.shard_size * rbytes : 0);
  };
  const auto post_backward = [&](int64_t n, int64_t earlier) {
    return std::max(n * pbytes + (converts ? n * rbytes : 0), held(n)) + earlier * held(B);
  };
  int64_t forward = 0, blocks = 0;
  switch (options.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kHybridShard: {
      const int64_t gathered = options.backward_prefetch == BackwardPrefetch::kPre ? 2 : 1;
      forward = (R + (options.forward_prefetch ? 2 : 1) * B) * pbytes;
      blocks = R * pbytes + R * pbytes + gathered * B * pbytes + post_backward(B, in_flight);
      break;
    }
    case ShardingStrategy::kShardGradOp:
      forward = A * pbytes;
      for (int64_t j = 0; j <= in_flight; ++j) {
        blocks = std::max(blocks, (A - j * B) * pbytes + R * pbytes + post_backward(B, j));
      }
      break;
    case ShardingStrategy::kNoShard:
      forward = A * pbytes;
      blocks = A * pbytes + R * pbytes + post_backward(B, in_flight);
      break;
  }
  const int64_t resident = options.strategy == ShardingStrategy::kNoShard ? A * pbytes : R * pbytes;
  const int64_t root_last = resident + post_backward(R, in_flight);
  plan.step_unsharded_bytes = std::max({forward, blocks, root_last});
  // See Note [Accumulating without synchronization].
  plan.accumulation_bytes = A * std::max(pbytes, rbytes);
  return plan;
}

std::string ShardingPlan::describe() const {
  auto mib = [](int64_t b) { return format_bytes(b); };
  std::ostringstream os;
  os << units.size() << " units, " << parameters << " parameters; shard group " << shard_size << " x " << replicas
     << " replica" << (replicas == 1 ? "" : "s") << "\n"
     << "  per rank, resident: parameter shards " << mib(param_shard_bytes) << ", gradient shards "
     << mib(grad_shard_bytes) << ", optimizer state " << mib(optimizer_bytes) << "\n"
     << "  per rank, during a step: largest unit " << mib(largest_unit_bytes) << " unsharded, at most "
     << mib(step_unsharded_bytes) << " of unsharded parameters and gradients (+ " << mib(accumulation_bytes)
     << " with gradient accumulation)\n";
  return os.str();
}

// ---- ShardedModel --------------------------------------------------------------

ShardedModel::ShardedModel(std::unique_ptr<detail::ShardedModelImpl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() = default;
std::vector<ShardRef> ShardedModel::shards() const { return impl_->shards(); }
void ShardedModel::zero_grad() { impl_->zero_grad(); }
void ShardedModel::set_requires_gradient_sync(bool sync) { impl_->set_requires_gradient_sync(sync); }
double ShardedModel::grad_norm() { return impl_->grad_norm(); }
double ShardedModel::clip_grad_norm(double max_norm) { return impl_->clip_grad_norm(max_norm); }
const std::vector<UnitInfo>& ShardedModel::units() const { return impl_->units(); }
std::vector<MemoryPlacement> ShardedModel::memory_placement() const { return impl_->memory_placement(); }
StepCounters ShardedModel::take_step_counters() { return impl_->take_step_counters(); }
UnshardedMemory ShardedModel::unsharded_memory() const { return impl_->unsharded_memory(); }
void ShardedModel::reset_unsharded_peak() { impl_->reset_unsharded_peak(); }
at::Tensor ShardedModel::gather_unit(size_t u) { return impl_->gather_unit(u); }
void ShardedModel::load_unit(size_t u, const at::Tensor& full) { impl_->load_unit(u, full); }
const comm::ProcessGroupPtr& ShardedModel::shard_group() const { return impl_->shard_group(); }
const comm::ProcessGroupPtr& ShardedModel::replicate_group() const { return impl_->replicate_group(); }
const FsdpOptions& ShardedModel::options() const { return impl_->options(); }
std::string ShardedModel::describe() const { return impl_->describe(); }

std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>& root,
                                          const comm::ProcessGroupPtr& world, const FsdpOptions& options) {
  return std::shared_ptr<ShardedModel>(new ShardedModel(std::make_unique<detail::ShardedModelImpl>(root, world, options)));
}

}  // namespace fsdp

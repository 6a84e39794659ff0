// The public API (ShardedModel, fully_shard) and the root's between-steps
// operations behind it: shards, gradient norms, gathers, accounting.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/state.h"

namespace fsdp {
namespace detail {

// ---- public API ---------------------------------------------------------------

std::vector<ShardRef> ShardedModelImpl::shards() const {
  std::vector<ShardRef> out;
  for (const auto& e : entries_) {
    out.push_back({e.unit->name(), e.flat->shard(), e.flat->grad_shard(), e.flat->trainable()});
  }
  return out;
}

void ShardedModelImpl::set_requires_gradient_sync(bool sync) {
  for (int u = 0; u < sched_->size(); ++u) sched_->policy(u).sync_grads = sync;
}

// ---- FSDP2's per-module settings -----------------------------------------------

std::vector<int> ShardedModelImpl::select_units(const std::string& unit, bool recurse, const char* what) const {
  std::vector<int> out;
  for (size_t k = 0; k < unit_names_.size(); ++k) {
    const std::string& n = unit_names_[k];
    const bool nested = unit.empty() || (n.size() > unit.size() && n.compare(0, unit.size(), unit) == 0 &&
                                         n[unit.size()] == '.');
    if (n == unit || (recurse && nested)) out.push_back(static_cast<int>(k));
  }
  if (out.empty()) {
    std::string names;
    for (const auto& n : unit_names_) names += (names.empty() ? "'" : ", '") + n + "'";
    FSDP_CHECK(false, what, ": no unit is named '", unit, "'; the units are ", names, " ('' is the root)");
  }
  return out;
}

void ShardedModelImpl::set_policy(const std::string& unit, bool recurse, const char* what,
                                  const std::function<void(UnitPolicy&)>& change) {
  assert_idle(what);
  for (int u : select_units(unit, recurse, what)) change(sched_->policy(u));
}

void ShardedModelImpl::set_comms(const std::string& unit, bool recurse, const char* what,
                                 const std::function<void(ShardedUnit&)>& change) {
  assert_idle(what);
  for (int u : select_units(unit, recurse, what)) change(*units_[size_t(u)]);
}

void ShardedModelImpl::set_is_last_backward(bool last) {
  assert_idle("set_is_last_backward");
  sched_->options().is_last_backward = last;
}

void ShardedModelImpl::drain_reductions() {
  if (sched_->reductions_in_flight() == 0) return;
  sched_->finish_all(actions_);
  execute(actions_);
  for (auto& u : units_) {
    if (sched_->policy(static_cast<int>(u->index())).sync_grads) u->ensure_grad_valid();
  }
}

void ShardedModelImpl::user_unshard(int u, bool wait) {
  assert_idle("unshard");
  FSDP_CHECK(state_ == TrainingState::kIdle, "unshard: the previous forward's graph awaits backward; call it "
             "between steps");
  sched_->unshard(u, actions_);
  if (wait) sched_->wait(u, actions_);
  execute(actions_);
}

void ShardedModelImpl::user_wait(int u) {
  sched_->wait(u, actions_);
  execute(actions_);
}

void ShardedModelImpl::user_reshard(int u) {
  assert_idle("reshard");
  FSDP_CHECK(state_ == TrainingState::kIdle, "reshard: the previous forward's graph awaits backward, which needs "
             "the parameters; call it between steps");
  sched_->reshard(u, actions_);
  execute(actions_);
}

// Note [Summoned parameters]
// FSDP1's summon_full_params: every unit gathered in unit order (the same
// collectives on every rank), the module's parameters readable (they view
// each unit's unsharded buffer). With writeback each rank copies its own
// chunk of that buffer back into its shard before resharding, so changes
// made to the parameters in place become the model's; a chunk is only
// written by its owner, so every rank must make the same change.
void ShardedModelImpl::summon(bool writeback) {
  assert_idle("summon_full_params");
  FSDP_CHECK(state_ == TrainingState::kIdle, "summon_full_params: the previous forward's graph awaits backward; "
             "call it between steps");
  drain_reductions();
  if (writeback) {
    for (const auto& u : units_) {
      FSDP_CHECK(u->mixed_precision().param_dtype == u->mixed_precision().master_dtype, "summon_full_params(writeback) "
                 "under mixed precision: ", u->label(), "'s parameters are ", u->mixed_precision().param_dtype,
                 " copies of its ", u->mixed_precision().master_dtype, " shards; write values with load_unit instead");
    }
  }
  for (int u = 0; u < sched_->size(); ++u) sched_->unshard(u, actions_);
  for (int u = 0; u < sched_->size(); ++u) sched_->wait(u, actions_);
  execute(actions_);
}

void ShardedModelImpl::unsummon(bool writeback) {
  if (writeback) {
    at::NoGradGuard no_grad;
    for (auto& u : units_) {
      for (FlatParam* f : {&u->flat(), u->frozen()}) {
        if (f == nullptr || f->single_copy()) continue;  // the shard is the parameters
        f->shard().copy_(u->replicated() ? f->full().narrow(0, 0, f->shard().numel()) : f->own_chunk());
      }
    }
  }
  for (int u = 0; u < sched_->size(); ++u) sched_->reshard(u, actions_);
  execute(actions_);
}

void ShardedModelImpl::zero_grad() {
  assert_idle("zero_grad");
  drain_reductions();
  for (auto& u : units_) {
    FSDP_CHECK(!u->holds_unsharded_grads(), "zero_grad while unit '", u->name(),
               "' holds gradients accumulated without synchronization; run a synchronized backward first");
    u->clear_grad();
  }
}

// Note [Norm on the device]
// The norm is computed where the gradients are, and stays there: a (1) double
// tensor, summed unit by unit in unit order, all-reduced on the shard group's
// device. Clipping multiplies by a coefficient computed on the device too, so
// neither needs a host synchronization inside the step (docs/design.md, "GPU
// specifics"); only a caller that reads the value waits for it.
//
// Note [Norm without fp64 copies]
// Each unit's sum of squares reads its gradient shard once, in its own dtype:
// the 2-norms of rows of kNormRow elements, accumulated in fp32 by the
// reduction kernel, then squared and summed in fp64 — a (rows) temporary, not
// a copy of the shard. Until 9fc8542 the shard was cast to fp64 and squared
// (two fp64 copies of every gradient per step: ~45 GB of traffic at
// llama3.2-1b, ~8% of its step on an H100, by the GPU issue's estimate). The
// result differs from the fp64 sum by fp32 rounding within a row: within 1e-6
// relative (tests/fsdp/test_engine.cpp, GradNormEqualsTheFp64Reference...).
namespace {
// Short enough that fp32 accumulation within a row stays within 3e-7 of the
// fp64 sum on the CPU's vectorized kernel (measured on heavy-tailed values;
// rows of 65536 gave 5e-6); a (n / 4096) fp64 temporary: 2 MB at 1B elements.
constexpr int64_t kNormRow = int64_t{1} << 12;

at::Tensor sum_of_squares(const at::Tensor& g) {
  const at::Tensor flat = g.reshape({-1});  // a view: gradient shards are contiguous
  const int64_t n = flat.numel(), rows = n / kNormRow, tail = n - rows * kNormRow;
  // The reduction's own dtype: fp32 for fp32, bf16 and fp16 shards (no cast of the shard on CUDA).
  const at::ScalarType acc = at::isReducedFloatingType(g.scalar_type()) ? at::kFloat : g.scalar_type();
  at::Tensor sq = at::zeros({1}, g.options().dtype(at::kDouble));
  if (rows > 0) {
    const at::Tensor norms = at::linalg_vector_norm(flat.narrow(0, 0, rows * kNormRow).view({rows, kNormRow}), 2,
                                                    at::IntArrayRef{1}, false, acc);  // (rows)
    sq.add_(norms.to(at::kDouble).square_().sum());
  }
  if (tail > 0) {
    const at::Tensor norm =
        at::linalg_vector_norm(flat.narrow(0, rows * kNormRow, tail), 2, std::nullopt, false, acc);
    sq.add_(norm.to(at::kDouble).square_());
  }
  return sq;
}
}  // namespace

at::Tensor ShardedModelImpl::grad_norm_tensor() {
  assert_idle("grad_norm");
  drain_reductions();
  at::Tensor sq;
  for (auto& u : units_) {
    u->ensure_grad_valid();
    at::Tensor s = sum_of_squares(u->flat().grad_shard());
    sq = sq.defined() ? sq + s.to(sq.device()) : s;
  }
  if (!replicated_ && shard_group_->size() > 1) {
    // Shards are disjoint within the shard group; replicas (HYBRID) hold the
    // same shards and are not summed again.
    sq = sq.to(shard_group_->device());
    shard_group_->all_reduce(sq, comm::ReduceOp::kSum)->wait();
  }
  return sq.sqrt();
}

at::Tensor ShardedModelImpl::clip_grad_norm_tensor(double max_norm) {
  FSDP_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  at::Tensor norm = grad_norm_tensor();
  if (norm.is_cpu()) {
    // A host value already: skip the multiplication when nothing is clipped.
    const double coef = max_norm / (norm.item<double>() + 1e-6);
    if (coef < 1.0) {
      at::NoGradGuard no_grad;
      for (auto& u : units_) u->flat().grad_shard().mul_(coef);
    }
    return norm;
  }
  // Capped at 1: multiplying by exactly 1 changes no value.
  const at::Tensor coef = at::div(at::full_like(norm, max_norm), norm + 1e-6).clamp_max(1.0).to(at::kFloat);
  at::NoGradGuard no_grad;
  for (auto& u : units_) {
    at::Tensor& g = u->flat().grad_shard();
    g.mul_(coef.to(g.device()));  // the same device: no copy; offloaded host shards: synchronized anyway
  }
  return norm;
}

double ShardedModelImpl::grad_norm() { return grad_norm_tensor().item<double>(); }

double ShardedModelImpl::clip_grad_norm(double max_norm) { return clip_grad_norm_tensor(max_norm).item<double>(); }

namespace {
// Adds what `group` counted since `base` to `s`, and moves `base` to now.
void take_since(const comm::ProcessGroup& group, comm::CommCounters& base, StepCounters& s) {
  const comm::CommCounters now = group.counters();
  s.allgather_bytes += now.allgather_bytes - base.allgather_bytes;
  s.reduce_scatter_bytes += now.reduce_scatter_bytes - base.reduce_scatter_bytes;
  s.reduce_scatter_bytes += now.alltoall_bytes - base.alltoall_bytes;  // the compressed reduce-scatter
  s.allreduce_bytes += now.allreduce_bytes - base.allreduce_bytes;
  base = now;
}
}  // namespace

UnshardedMemory ShardedModelImpl::unsharded_memory() const {
  UnshardedMemory m = ledger_->memory();
  if (pool_) {
    const UnshardedPool::Stats s = pool_->stats();
    m.pool_capacity = s.capacity;
    m.pool_peak = s.peak;
    m.pool_reclaims = s.reclaims;
    m.pool_overflows = s.overflows;
  }
  return m;
}

void ShardedModelImpl::reset_unsharded_peak() {
  ledger_->reset_peak();
  if (pool_) pool_->reset_peak();
}

StepCounters ShardedModelImpl::take_step_counters() {
  StepCounters s;
  take_since(*shard_group_, counters_base_shard_, s);
  if (replicate_group_) take_since(*replicate_group_, counters_base_replicate_, s);
  return s;
}

at::Tensor ShardedModelImpl::gather_unit(size_t u) {
  assert_idle("gather_unit");
  drain_reductions();
  FSDP_CHECK(u < entries_.size(), "gather_unit: entry ", u, " out of range (", entries_.size(),
             " entries in ShardedModel::units())");
  FlatParam& f = *entries_[u].flat;
  if (entries_[u].unit->replicated()) return f.shard().narrow(0, 0, f.layout().numel).clone();
  // On the group's device (NCCL gathers device memory; offloaded shards are
  // on the host), returned on the shard's.
  const at::Device on = shard_group_->device();
  at::Tensor full = at::empty({f.layout().padded_numel}, f.shard().options().device(on).pinned_memory(false));
  shard_group_->all_gather(full, f.shard().to(on))->wait();
  return full.narrow(0, 0, f.layout().numel).to(f.shard().device());
}

void ShardedModelImpl::load_unit(size_t u, const at::Tensor& full) {
  assert_idle("load_unit");
  FSDP_CHECK(u < entries_.size(), "load_unit: entry ", u, " out of range (", entries_.size(),
             " entries in ShardedModel::units())");
  FlatParam& f = *entries_[u].flat;
  FSDP_CHECK(full.numel() == f.layout().numel, "load_unit: ", entries_[u].unit->label(),
             f.trainable() ? "" : " (frozen parameters)", " has ", f.layout().numel, " elements, got ", full.numel());
  f.init_shard(full.reshape({-1}), nullptr, 0);
  // Unsharded copies made before (a policy that keeps them) are stale now.
  sched_->reshard(static_cast<int>(entries_[u].unit->index()), actions_);
  execute(actions_);
}

std::vector<MemoryPlacement> ShardedModelImpl::memory_placement() const {
  auto device_name = [](const at::Tensor& t) { return t.device().str(); };
  MemoryPlacement shards{"parameter shards", "", 0, false};
  MemoryPlacement grads{"gradient shards", "", 0, false};
  MemoryPlacement full{"unsharded parameters (resident now)", options_.device.str(), 0, false};
  MemoryPlacement full_grads{"unsharded gradients (resident now)", options_.device.str(), 0, false};
  for (const auto& e : entries_) {
    FlatParam& f = *e.flat;
    shards.device = device_name(f.shard());
    shards.bytes += f.shard().nbytes();
    shards.pinned = f.shard().is_pinned();
    if (!f.trainable()) continue;
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
  os << to_string(options_.strategy) << ": " << units_.size() << " units, " << total << " parameters (" << padded
     << " padded), shard group " << shard_group_->size()
     << (replicate_group_ ? " x " + std::to_string(replicate_group_->size()) + " replicas" : std::string()) << "\n";
  for (const auto& i : infos_) {
    os << "  unit '" << (i.name.empty() ? "<root>" : i.name) << "' " << i.type_name << ": " << i.params.size()
       << " params, " << i.numel << " elements, padded " << i.padded_numel << ", shard " << i.shard_numel
       << (i.checkpointed ? ", checkpointed" : "") << (i.trainable ? "" : ", frozen") << "\n";
  }
  return os.str();
}

}  // namespace detail

// ---- ShardedModel --------------------------------------------------------------

detail::ShardedModelImpl& detail::impl_of(ShardedModel& m) { return *m.impl_; }

ShardedModel::ShardedModel(std::unique_ptr<detail::ShardedModelImpl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() = default;
std::vector<ShardRef> ShardedModel::shards() const { return impl_->shards(); }
void ShardedModel::zero_grad() { impl_->zero_grad(); }
void ShardedModel::set_requires_gradient_sync(bool sync) { impl_->set_requires_gradient_sync(sync); }
double ShardedModel::grad_norm() { return impl_->grad_norm(); }
double ShardedModel::clip_grad_norm(double max_norm) { return impl_->clip_grad_norm(max_norm); }
at::Tensor ShardedModel::grad_norm_tensor() { return impl_->grad_norm_tensor(); }
at::Tensor ShardedModel::clip_grad_norm_tensor(double max_norm) { return impl_->clip_grad_norm_tensor(max_norm); }
const std::vector<UnitInfo>& ShardedModel::units() const { return impl_->units(); }
std::vector<MemoryPlacement> ShardedModel::memory_placement() const { return impl_->memory_placement(); }
StepCounters ShardedModel::take_step_counters() { return impl_->take_step_counters(); }
UnshardedMemory ShardedModel::unsharded_memory() const { return impl_->unsharded_memory(); }
void ShardedModel::reset_unsharded_peak() { impl_->reset_unsharded_peak(); }
int64_t ShardedModel::checkpoint_kept_bytes() const { return impl_->kept_bytes()->load(); }
at::Tensor ShardedModel::gather_unit(size_t u) { return impl_->gather_unit(u); }
void ShardedModel::load_unit(size_t u, const at::Tensor& full) { impl_->load_unit(u, full); }
const comm::ProcessGroupPtr& ShardedModel::shard_group() const { return impl_->shard_group(); }
const comm::ProcessGroupPtr& ShardedModel::replicate_group() const { return impl_->replicate_group(); }
const FsdpOptions& ShardedModel::options() const { return impl_->options(); }
std::string ShardedModel::describe() const { return impl_->describe(); }

void ShardedModel::set_requires_gradient_sync(bool sync, const std::string& unit, bool recurse) {
  impl_->set_policy(unit, recurse, "set_requires_gradient_sync", [&](detail::UnitPolicy& p) { p.sync_grads = sync; });
}
void ShardedModel::set_reshard_after_forward(bool reshard, const std::string& unit, bool recurse) {
  impl_->set_policy(unit, recurse, "set_reshard_after_forward", [&](detail::UnitPolicy& p) {
    p.reshard_after_forward = reshard;
    if (!reshard) p.post_forward_group = 0;
  });
}
void ShardedModel::set_reshard_after_backward(bool reshard, const std::string& unit, bool recurse) {
  impl_->set_policy(unit, recurse, "set_reshard_after_backward",
                    [&](detail::UnitPolicy& p) { p.reshard_after_backward = reshard; });
}
void ShardedModel::set_requires_all_reduce(bool all_reduce, const std::string& unit, bool recurse) {
  impl_->set_policy(unit, recurse, "set_requires_all_reduce", [&](detail::UnitPolicy& p) { p.all_reduce = all_reduce; });
}
void ShardedModel::set_unshard_in_backward(bool unshard, const std::string& unit) {
  impl_->set_policy(unit, false, "set_unshard_in_backward",
                    [&](detail::UnitPolicy& p) { p.unshard_in_backward = unshard; });
}
void ShardedModel::set_is_last_backward(bool last) { impl_->set_is_last_backward(last); }
void ShardedModel::set_modules_to_forward_prefetch(const std::string& unit, const std::vector<std::string>& units) {
  std::vector<int> targets;
  for (const auto& n : units) targets.push_back(impl_->select_units(n, false, "set_modules_to_forward_prefetch")[0]);
  impl_->set_policy(unit, false, "set_modules_to_forward_prefetch", [&](detail::UnitPolicy& p) {
    p.explicit_forward = !targets.empty();
    p.forward_prefetch = targets;
  });
}
void ShardedModel::set_modules_to_backward_prefetch(const std::string& unit, const std::vector<std::string>& units) {
  std::vector<int> targets;
  for (const auto& n : units) targets.push_back(impl_->select_units(n, false, "set_modules_to_backward_prefetch")[0]);
  impl_->set_policy(unit, false, "set_modules_to_backward_prefetch", [&](detail::UnitPolicy& p) {
    p.explicit_backward = !targets.empty();
    p.backward_prefetch = targets;
  });
}
void ShardedModel::set_gradient_divide_factor(double factor, const std::string& unit, bool recurse) {
  FSDP_CHECK(std::isfinite(factor), "set_gradient_divide_factor: the factor must be finite, got ", factor);
  impl_->set_comms(unit, recurse, "set_gradient_divide_factor",
                   [&](detail::ShardedUnit& u) { u.comms().divide_factor = factor; });
}
void ShardedModel::set_force_sum_reduction_for_comms(bool enable, const std::string& unit, bool recurse) {
  impl_->set_comms(unit, recurse, "set_force_sum_reduction_for_comms",
                   [&](detail::ShardedUnit& u) { u.comms().force_sum = enable; });
}
void ShardedModel::set_custom_all_gather(std::shared_ptr<AllGatherComm> comm, const std::string& unit, bool recurse) {
  impl_->set_comms(unit, recurse, "set_custom_all_gather", [&](detail::ShardedUnit& u) { u.comms().all_gather = comm; });
}
void ShardedModel::set_custom_reduce_scatter(std::shared_ptr<ReduceScatterComm> comm, const std::string& unit,
                                             bool recurse) {
  impl_->set_comms(unit, recurse, "set_custom_reduce_scatter",
                   [&](detail::ShardedUnit& u) { u.comms().reduce_scatter = comm; });
}
void ShardedModel::set_all_reduce_hook(std::function<void(at::Tensor&)> hook, const std::string& unit, bool recurse) {
  impl_->set_comms(unit, recurse, "set_all_reduce_hook",
                   [&](detail::ShardedUnit& u) { u.comms().all_reduce_hook = hook; });
}
UnshardHandle ShardedModel::unshard(const std::string& unit, bool async_op) {
  const int u = impl_->select_units(unit, false, "unshard")[0];
  impl_->user_unshard(u, !async_op);
  return async_op ? UnshardHandle(impl_.get(), u) : UnshardHandle();
}
void ShardedModel::reshard(const std::string& unit) { impl_->user_reshard(impl_->select_units(unit, false, "reshard")[0]); }
FullParams ShardedModel::summon_full_params(bool writeback) {
  impl_->summon(writeback);
  return FullParams(impl_.get(), writeback);
}

void UnshardHandle::wait() {
  if (impl_ == nullptr) return;
  impl_->user_wait(unit_);
  impl_ = nullptr;
}

at::Tensor AllGatherComm::allocate(int64_t numel, at::ScalarType dtype, at::Device device) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
}
at::Tensor ReduceScatterComm::allocate(int64_t numel, at::ScalarType dtype, at::Device device) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
}

FullParams::FullParams(FullParams&& other) noexcept : impl_(other.impl_), writeback_(other.writeback_) {
  other.impl_ = nullptr;
}
FullParams::~FullParams() {
  if (impl_ == nullptr) return;
  try {
    impl_->unsummon(writeback_);
  } catch (const std::exception& e) {
    // A destructor cannot throw: the failure (a collective that broke) leaves
    // the model unusable, as any failed collective does.
    std::fprintf(stderr, "fsdp: summon_full_params could not reshard: %s\n", e.what());
  }
}

std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>& root,
                                          const comm::ProcessGroupPtr& world, const FsdpOptions& options) {
  return std::shared_ptr<ShardedModel>(new ShardedModel(std::make_unique<detail::ShardedModelImpl>(root, world, options)));
}

}  // namespace fsdp

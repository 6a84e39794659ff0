// The public API (ShardedModel, fully_shard) and the root's between-steps
// operations behind it: shards, gradient norms, gathers, accounting.
#include <cmath>
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

void ShardedModelImpl::zero_grad() {
  assert_idle("zero_grad");
  for (auto& u : units_) {
    FSDP_CHECK(!u->holds_unsharded_grads(), "zero_grad while unit '", u->name(),
               "' holds gradients accumulated without synchronization; run a synchronized backward first");
    u->clear_grad();
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
  FSDP_CHECK(u < entries_.size(), "gather_unit: entry ", u, " out of range (", entries_.size(),
             " entries in ShardedModel::units())");
  FlatParam& f = *entries_[u].flat;
  if (replicated_) return f.shard().narrow(0, 0, f.layout().numel).clone();
  at::Tensor full = at::empty({f.layout().padded_numel}, f.shard().options());
  shard_group_->all_gather(full, f.shard())->wait();
  return full.narrow(0, 0, f.layout().numel);
}

void ShardedModelImpl::load_unit(size_t u, const at::Tensor& full) {
  assert_idle("load_unit");
  FSDP_CHECK(u < entries_.size(), "load_unit: entry ", u, " out of range (", entries_.size(),
             " entries in ShardedModel::units())");
  FlatParam& f = *entries_[u].flat;
  FSDP_CHECK(full.numel() == f.layout().numel, "load_unit: ", entries_[u].unit->label(),
             f.trainable() ? "" : " (frozen parameters)", " has ", f.layout().numel, " elements, got ", full.numel());
  f.init_shard(full.reshape({-1}), nullptr, 0);
  entries_[u].unit->reshard();
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

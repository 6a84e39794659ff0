// Planning without a process group: which boundaries become units, which
// parameters each owns, and what a rank holds (plan_sharding), for the engine
// (build_units) and for command lines that check a run before starting it.
#include <algorithm>
#include <deque>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/plan.h"

namespace fsdp {
namespace detail {

namespace {

bool is_prefix_of(const std::string& unit, const std::string& param) {
  if (unit.empty()) return true;
  return param.size() > unit.size() && param.compare(0, unit.size(), unit) == 0 && param[unit.size()] == '.';
}

// Note [Per-unit options]
// FSDP2 takes its options per fully_shard call, so each unit may have its own
// reshard_after_forward, mixed precision, offload and prefetch lists; here a
// unit starts from the model's (FsdpOptions) and every UnitOverride that
// selects it (by name or inner type) sets the fields it has, in order. The
// root keeps its parameters after forward (backward needs them at once), as
// FSDP2's root does unless its own call says otherwise. The master and buffer
// dtypes stay the model's: one optimizer state dtype, one buffer cast.
void resolve_unit_options(std::vector<PlannedUnit>& plan, const FsdpOptions& o, int shard_size) {
  const bool sharded_forward =
      o.strategy == ShardingStrategy::kFullShard || o.strategy == ShardingStrategy::kHybridShard;
  const ReshardAfterForward model_default = o.reshard_after_forward.value_or(ReshardAfterForward(sharded_forward));
  std::string unit_list;
  for (const PlannedUnit& pu : plan) unit_list += (unit_list.empty() ? "'" : ", '") + pu.name + "'";
  const auto index_of = [&](const std::string& name, const char* what) {
    for (size_t k = 0; k < plan.size(); ++k) {
      if (plan[k].name == name) return static_cast<int>(k);
    }
    FSDP_CHECK(false, what, " names unit '", name, "', which the wrap policy did not make a unit; units: ",
               unit_list, " ('' is the root)");
    return -1;
  };
  for (const UnitOverride& ov : o.unit_overrides) {
    for (const std::string& n : ov.names) index_of(n, "FsdpOptions::unit_overrides");
  }
  std::vector<ReshardAfterForward> raf(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) {
    PlannedUnit& pu = plan[k];
    pu.mixed_precision = o.mixed_precision;
    pu.cpu_offload = o.cpu_offload;
    raf[k] = k == 0 ? ReshardAfterForward(false) : model_default;
    for (const UnitOverride& ov : o.unit_overrides) {
      const bool by_name = std::find(ov.names.begin(), ov.names.end(), pu.name) != ov.names.end();
      const bool by_type = std::find(ov.types.begin(), ov.types.end(), pu.module->inner_type()) != ov.types.end();
      if (!by_name && !by_type) continue;
      const UnitOptions& u = ov.options;
      if (u.reshard_after_forward) raf[k] = *u.reshard_after_forward;
      if (u.mixed_precision) {
        const MixedPrecision& mp = *u.mixed_precision;
        FSDP_CHECK(mp.master_dtype == o.mixed_precision.master_dtype && mp.buffer_dtype == o.mixed_precision.buffer_dtype,
                   "unit '", pu.name, "': a per-unit mixed precision must keep the model's master dtype (",
                   o.mixed_precision.master_dtype, ") and buffer dtype (", o.mixed_precision.buffer_dtype, "), got ",
                   mp.master_dtype, " and ", mp.buffer_dtype, "; set them in FsdpOptions::mixed_precision");
        pu.mixed_precision = mp;
      }
      if (u.cpu_offload) pu.cpu_offload = *u.cpu_offload;
      if (u.forward_prefetch) {
        pu.policy.explicit_forward = true;
        pu.policy.forward_prefetch.clear();
        for (const std::string& n : *u.forward_prefetch) pu.policy.forward_prefetch.push_back(index_of(n, "forward_prefetch"));
      }
      if (u.backward_prefetch) {
        pu.policy.explicit_backward = true;
        pu.policy.backward_prefetch.clear();
        for (const std::string& n : *u.backward_prefetch) {
          pu.policy.backward_prefetch.push_back(index_of(n, "backward_prefetch"));
        }
      }
    }
    // FSDP2's int: 1 is false, the shard-group size is true; else a divisor.
    ReshardAfterForward r = raf[k];
    if (r.reshard && r.group > 0 && shard_size > 0) {
      check_post_forward_group(r.group, shard_size, "unit '" + pu.name + "': reshard_after_forward");
      if (r.group == 1) r = ReshardAfterForward(false);
      if (r.group == shard_size) r.group = 0;
    }
    FSDP_CHECK(!r.reshard || r.group >= 0, "unit '", pu.name, "': reshard_after_forward group must be >= 1, got ",
               r.group);
    pu.policy.reshard_after_forward = r.reshard;
    pu.policy.post_forward_group = r.reshard ? r.group : 0;
  }
}
}  // namespace

UnitInfo unit_info(const PlannedUnit& pu, const FlatLayout& layout, int64_t shard_offset, bool trainable) {
  UnitInfo info;
  info.name = pu.name;
  info.type_name = pu.module->inner_type_name();
  info.trainable = trainable;
  info.numel = layout.numel;
  info.padded_numel = layout.padded_numel;
  info.shard_numel = layout.shard_numel;
  info.shard_offset = shard_offset;
  info.checkpointed = pu.checkpoint;
  info.params = layout.params;
  return info;
}

std::vector<PlannedUnit> plan_units(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                                    int shard_size) {
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
    if (selected[i]) plan.push_back({all[i].first, all[i].second, {}, {}, false});
  }
  std::unordered_map<const c10::TensorImpl*, size_t> owner_of;  // shared tensors: listed once
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (const at::Tensor& t : options.ignored_params) {
    FSDP_CHECK(t.defined(), "FsdpOptions::ignored_params holds an undefined tensor");
    ignored.insert(t.unsafeGetTensorImpl());
  }
  for (auto& p : root->named_parameters(/*recurse=*/true)) {
    if (ignored.count(p.value().unsafeGetTensorImpl()) > 0) continue;  // left to the caller (FSDP2's ignored_params)
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
    (p.value().requires_grad() ? plan[best].sources : plan[best].frozen).push_back({p.key(), p.value()});
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
  resolve_unit_options(plan, options, shard_size);
  return plan;
}

}  // namespace detail

// ---- planning -------------------------------------------------------------------

namespace {
// Whether shards live on the compute device (FlatParamOptions::shard_device ==
// device): only CPU offload from an accelerator moves them elsewhere.
bool shards_on_compute_device(bool cpu_offload, const at::Device& device) { return !cpu_offload || device.is_cpu(); }
}  // namespace

bool detail::unit_replicated(const PlannedUnit& pu, const FsdpOptions& o, int shard_size) {
  if (o.strategy == ShardingStrategy::kNoShard) return true;
  const MixedPrecision& mp = pu.mixed_precision;
  return shard_size == 1 && mp.param_dtype == mp.master_dtype && shards_on_compute_device(pu.cpu_offload, o.device);
}

ShardingPlan plan_sharding(const std::shared_ptr<nn::UnitBase>& root, int world_size, int rank,
                           const FsdpOptions& options, at::ScalarType optimizer_state_dtype) {
  FSDP_CHECK(root != nullptr, "plan_sharding: the root module is null");
  FSDP_CHECK(world_size >= 1, "plan_sharding: world_size (the number of processes) must be >= 1, got ",
             world_size);
  FSDP_CHECK(rank >= 0 && rank < world_size, "plan_sharding: rank ", rank, " is outside [0, ", world_size,
             ") — give a rank below the world size ", world_size);
  ShardingPlan plan;
  plan.shard_size = detail::shard_group_size(options, world_size);
  plan.replicas = world_size / plan.shard_size;
  const int shard_rank = rank % plan.shard_size;
  const int64_t sbytes = static_cast<int64_t>(c10::elementSize(optimizer_state_dtype));

  // Padded elements per unit: of parameters (trainable and frozen), and of
  // gradients (trainable only: frozen parameters have no gradient buffers).
  const auto layout_of = [&](const std::vector<detail::FlatParam::Source>& sources) {
    std::vector<ParamPlacement> ps;
    for (const auto& src : sources) {
      ParamPlacement pl;
      pl.name = src.name;
      pl.shape = src.param.sizes().vec();
      pl.numel = src.param.numel();
      ps.push_back(pl);
    }
    return detail::FlatLayout::make(std::move(ps), plan.shard_size);
  };
  const std::vector<detail::PlannedUnit> planned = detail::plan_units(root, options, plan.shard_size);
  int64_t all_grads_bytes = 0, largest = 0, root_bytes = 0;
  for (const auto& pu : planned) {
    const MixedPrecision& mp = pu.mixed_precision;
    const int64_t master = static_cast<int64_t>(c10::elementSize(mp.master_dtype));
    const int64_t pbytes = static_cast<int64_t>(c10::elementSize(mp.param_dtype));
    const int64_t rbytes = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
    const detail::FlatLayout trained = layout_of(pu.sources);
    const detail::FlatLayout frozen = layout_of(pu.frozen);
    if (pu.lists_trainable()) {
      plan.units.push_back(detail::unit_info(pu, trained, shard_rank * trained.shard_numel, /*trainable=*/true));
    }
    if (pu.lists_frozen()) {
      plan.units.push_back(detail::unit_info(pu, frozen, shard_rank * frozen.shard_numel, /*trainable=*/false));
    }
    plan.parameters += trained.numel + frozen.numel;
    plan.trainable_parameters += trained.numel;
    // Frozen shards hold the param dtype (Note [Frozen shards in the param dtype] in model.cpp).
    plan.param_shard_bytes += trained.shard_numel * master + frozen.shard_numel * pbytes;
    plan.grad_shard_bytes += trained.shard_numel * master;
    plan.optimizer_bytes += 2 * trained.shard_numel * sbytes;
    // See Note [Accumulating without synchronization].
    all_grads_bytes += trained.padded_numel * std::max(pbytes, rbytes);
    // Frozen parameters under NO_SHARD are their own shard (Note [Frozen shards in the param dtype]).
    const bool frozen_in_place = options.strategy == ShardingStrategy::kNoShard &&
                                 shards_on_compute_device(pu.cpu_offload, options.device);
    const int64_t gathered = (trained.padded_numel + (frozen_in_place ? 0 : frozen.padded_numel)) * pbytes;
    if (pu.name.empty()) {
      root_bytes = gathered;
    } else {
      largest = std::max(largest, gathered);
    }
  }
  plan.largest_unit_bytes = std::max(largest, root_bytes);
  const std::vector<detail::StepUnitBytes> bytes = detail::step_unit_bytes(planned, options, plan.shard_size);
  bool any = false;
  for (const auto& b : bytes) any = any || b.params > 0 || b.grads > 0 || b.reduce_copy > 0 || b.reduce_output > 0;
  if (!any) return plan;  // every unit is its own single copy: nothing unsharded, 0

  std::vector<bool> gathered_at_start;
  const std::vector<detail::Event> events = detail::step_events(
      detail::schedule_units(planned, options, plan.shard_size, plan.replicas), detail::schedule_policies(planned),
      detail::call_sequence(root, planned), detail::schedule_options(options), detail::StepPhase::kSynchronized,
      &gathered_at_start);
  plan.step_unsharded_bytes = detail::replay_bytes(events, bytes, gathered_at_start);
  plan.accumulation_bytes = all_grads_bytes;
  return plan;
}

// Note [Unsharded memory]
// What a synchronized step holds at once of unsharded parameters, gradients and
// gradients in flight to a reduction is found by replaying the step's schedule
// (step_events, Note [Step schedule] in schedule.cpp) — the one the engine
// executes — over the units' sizes, in the order the model calls them
// (nn::CallOrder; else each unit once in registration order, the root's own
// parameters first), in a steady state (the previous step's order known to
// forward prefetch). What each event costs, in the engine's order of
// allocation and release (unit.cpp, flat_param.cpp, collectives.cpp):
// - kUnshard / kPrefetch: the unit's parameters (param dtype; frozen ones too);
//   from a post-forward shard (hpZ), that shard is released at the kWait.
//   From host shards of another dtype (CPU offload), a master-dtype staging
//   buffer of the shard lives while the cast runs (Note [Offload staging]).
// - kReshard: the parameters go; to a post-forward group of R ranks, a 1/R
//   shard of them is copied first (both are held for a moment).
// - kPreBackward: the gradient buffer (param dtype, trainable elements).
// - kReduce: the reduce-dtype copy when the dtypes differ, after which the
//   param-dtype gradients go at once; a shard-sized output when the reduction
//   cannot land in the gradient shard (another dtype or device; none over a
//   shard group of one rank on the device, Note [One-rank reductions] in
//   collectives.cpp) — with CPU
//   offload and another dtype, a staging buffer of the master dtype beside it
//   (Note [Offload staging] in collectives.cpp). The copy (or the gradients
//   themselves) and the output are held until kFinishReduce.
//   (Resharding before the copy, not after it, took llama3.1-8b on 8 ranks in
//   bf16 from 9.45 to 7.50 GiB with the old layout, and the embedding and head
//   as units to 4.56.)
// - kKeepGrads: with a reduce dtype wider than the parameters', the gradients
//   move into a reduce-dtype buffer (Note [Accumulating without synchronization]).
// - Replicated units (NO_SHARD, single copies) hold their compute copy for the
//   whole step; frozen parameters count as parameters only, and not at all
//   under NO_SHARD (their shard is their copy).
// The ledger of a step (UnshardedMemory::peak) equals the replay's peak when
// the model calls its units as its CallOrder says (tests/fsdp/test_memory_contract.cpp).
namespace detail {

int shard_group_size(const FsdpOptions& o, int world_size) {
  switch (o.strategy) {
    case ShardingStrategy::kNoShard: return 1;
    case ShardingStrategy::kHybridShard:
      FSDP_CHECK(o.hybrid_shard_size >= 1 && world_size % o.hybrid_shard_size == 0,
                 "HYBRID_SHARD: FsdpOptions::hybrid_shard_size ", o.hybrid_shard_size,
                 " must be >= 1 and divide the world size ", world_size, " (ranks per shard group)");
      return o.hybrid_shard_size;
    default: return world_size;
  }
}

std::vector<int> call_sequence(const std::shared_ptr<nn::UnitBase>& root, const std::vector<PlannedUnit>& planned) {
  std::vector<std::string> names;
  if (const auto* order = dynamic_cast<const nn::CallOrder*>(&root->inner())) {
    names = order->unit_call_order();
  } else {
    names.push_back("");
    for (size_t k = 1; k < planned.size(); ++k) names.push_back(planned[k].name);
  }
  // Each call belongs to the innermost selected unit whose name prefixes the
  // boundary's (the root when none does: the boundary was folded into it).
  std::vector<int> calls;
  std::vector<bool> seen(planned.size(), false);
  for (const std::string& n : names) {
    size_t best = 0, best_len = 0;
    for (size_t k = 1; k < planned.size(); ++k) {
      const std::string& un = planned[k].name;
      if ((un == n || is_prefix_of(un, n)) && un.size() > best_len) {
        best = k;
        best_len = un.size();
      }
    }
    calls.push_back(static_cast<int>(best));
    seen[best] = true;
  }
  if (!seen[0]) calls.insert(calls.begin(), 0);
  for (size_t k = 1; k < planned.size(); ++k) {
    if (!seen[k]) calls.push_back(static_cast<int>(k));  // not in the model's order: assume it runs last
  }
  return calls;
}

std::vector<ScheduleUnit> schedule_units(const std::vector<PlannedUnit>& planned, const FsdpOptions& o,
                                         int shard_size, int replicas) {
  std::vector<ScheduleUnit> out;
  const bool hybrid = (o.strategy == ShardingStrategy::kHybridShard) && replicas > 1;
  for (size_t k = 0; k < planned.size(); ++k) {
    const PlannedUnit& pu = planned[k];
    ScheduleUnit su;
    su.is_root = k == 0;
    su.replicated = unit_replicated(pu, o, shard_size);
    su.trains = !pu.sources.empty();
    su.hybrid = hybrid;
    su.checkpointed = pu.checkpoint;
    // Note [Frozen parameters] in unit.cpp: a root with frozen parameters reduces at the end of backward.
    su.reduces_at_end = k == 0 && !pu.frozen.empty();
    out.push_back(su);
  }
  return out;
}

std::vector<UnitPolicy> schedule_policies(const std::vector<PlannedUnit>& planned) {
  std::vector<UnitPolicy> out;
  for (const PlannedUnit& pu : planned) out.push_back(pu.policy);
  return out;
}

ScheduleOptions schedule_options(const FsdpOptions& o) {
  ScheduleOptions s;
  s.backward_prefetch = o.backward_prefetch == BackwardPrefetch::kPre    ? ScheduleOptions::Backward::kPre
                        : o.backward_prefetch == BackwardPrefetch::kPost ? ScheduleOptions::Backward::kPost
                                                                         : ScheduleOptions::Backward::kNone;
  s.forward_prefetch = o.forward_prefetch;
  s.limit_all_gathers = o.limit_all_gathers;
  s.max_inflight_reductions = kMaxInflightReduces;
  return s;
}

std::vector<StepUnitBytes> step_unit_bytes(const std::vector<PlannedUnit>& planned, const FsdpOptions& o,
                                           int shard_size) {
  std::vector<StepUnitBytes> out;
  const auto padded = [&](const std::vector<FlatParam::Source>& sources, int s) {
    int64_t numel = 0;
    for (const auto& x : sources) numel += x.param.numel();
    return (numel + s - 1) / s * s;
  };
  for (const PlannedUnit& pu : planned) {
    const MixedPrecision& mp = pu.mixed_precision;
    const int64_t pb = static_cast<int64_t>(c10::elementSize(mp.param_dtype));
    const int64_t rb = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
    const bool on_device = shards_on_compute_device(pu.cpu_offload, o.device);
    StepUnitBytes b;
    b.replicated = unit_replicated(pu, o, shard_size);
    const int s = b.replicated ? 1 : shard_size;
    const int64_t trained = padded(pu.sources, s), frozen = padded(pu.frozen, s);
    const bool converts = mp.reduce_dtype != mp.param_dtype;
    if (b.replicated) {
      // FlatParam: a single copy when the shard has the param dtype on the device.
      const bool single_trained = mp.master_dtype == mp.param_dtype && on_device;
      b.params = (single_trained ? 0 : trained * pb) + (on_device ? 0 : frozen * pb);
      b.grads = single_trained ? 0 : trained * pb;
    } else {
      b.params = (trained + frozen) * pb;
      b.grads = trained * pb;
      // A reduction lands in the gradient shard when its output has the master dtype, on the shard's device;
      // over one rank on the device it runs no collective and needs no output (Note [One-rank reductions]).
      // Its output has the input's dtype, or fp32 for a compressed reduce-scatter, which sums the decoded
      // contributions in fp32 and is called even over one rank (compressed_collectives.cpp).
      const at::ScalarType input_dtype = converts ? mp.reduce_dtype : mp.param_dtype;
      const bool compressed = o.compression.reduce_scatter != WireFormat::kNative;
      const at::ScalarType output_dtype = compressed ? at::kFloat : input_dtype;
      const bool one_rank = s == 1 && on_device && !compressed;
      if (trained > 0 && !one_rank && (output_dtype != mp.master_dtype || !on_device)) {
        b.reduce_output = trained / s * static_cast<int64_t>(c10::elementSize(output_dtype));
      }
      // Note [Offload staging] in collectives.cpp: host shards of another
      // dtype pass through a master-dtype buffer on the device, for a gather
      // while its cast runs, for a reduction until it is folded in.
      const int64_t mb = static_cast<int64_t>(c10::elementSize(mp.master_dtype));
      if (!on_device && mp.param_dtype != mp.master_dtype) b.gather_staging = trained / s * mb;
      if (b.reduce_output > 0 && !on_device && input_dtype != mp.master_dtype) b.reduce_output += trained / s * mb;
    }
    if (pu.sources.empty()) b.grads = 0;
    if (converts && !pu.sources.empty()) b.reduce_copy = trained * rb;
    b.wider = rb > pb;
    out.push_back(b);
  }
  return out;
}

int64_t replay_bytes(const std::vector<Event>& events, const std::vector<StepUnitBytes>& units,
                     const std::vector<bool>& gathered_at_start) {
  int64_t cur = 0, peak = 0;
  const auto add = [&](int64_t b) {
    cur += b;
    peak = std::max(peak, cur);
  };
  const size_t n = units.size();
  std::vector<int64_t> post_forward(n, 0), held(n, 0);
  std::vector<bool> grads_held(n, false);
  for (size_t u = 0; u < n; ++u) {
    if (units[u].replicated || (u < gathered_at_start.size() && gathered_at_start[u])) add(units[u].params);
  }
  for (const Event& e : events) {
    const size_t u = size_t(e.unit);
    const StepUnitBytes& b = units[u];
    switch (e.kind) {
      case EventKind::kUnshard:
      case EventKind::kPrefetch:
        if (b.replicated) break;
        add(b.params);
        if (post_forward[u] == 0) peak = std::max(peak, cur + b.gather_staging);  // freed at once
        break;
      case EventKind::kWait:
        cur -= post_forward[u];
        post_forward[u] = 0;
        break;
      case EventKind::kReshard:
        if (b.replicated) break;
        if (post_forward[u] > 0) {  // a post-forward shard dropped
          cur -= post_forward[u];
          post_forward[u] = 0;
          break;
        }
        if (e.group > 0) {
          post_forward[u] = b.params / e.group;
          add(post_forward[u]);
        }
        cur -= b.params;
        break;
      case EventKind::kPreBackward:
        if (!grads_held[u]) add(b.grads);
        grads_held[u] = true;
        break;
      case EventKind::kReduce:
        if (b.reduce_copy > 0) {
          add(b.reduce_copy);
          cur -= b.grads;  // the param-dtype gradients go at once
          held[u] = b.reduce_copy;
        } else {
          held[u] = b.grads;  // the gradients themselves are reduced
        }
        if (b.reduce_output > 0) {
          add(b.reduce_output);
          held[u] += b.reduce_output;
        }
        grads_held[u] = false;
        break;
      case EventKind::kKeepGrads:
        if (b.wider && b.reduce_copy > 0) {
          add(b.reduce_copy);
          cur -= b.grads;
          grads_held[u] = false;
        }
        break;
      case EventKind::kFinishReduce:
        cur -= held[u];
        held[u] = 0;
        break;
      default: break;
    }
  }
  return peak;
}

}  // namespace detail

int64_t count_units(const std::vector<UnitInfo>& entries) {
  int64_t n = 0;
  for (size_t i = 0; i < entries.size(); ++i) n += i == 0 || entries[i].name != entries[i - 1].name ? 1 : 0;
  return n;
}

std::string ShardingPlan::describe() const {
  auto mib = [](int64_t b) { return format_bytes(b); };
  std::ostringstream os;
  os << count_units(units) << " units, " << parameters << " parameters";
  if (trainable_parameters != parameters) {
    os << " (" << trainable_parameters << " trainable, " << parameters - trainable_parameters << " frozen)";
  }
  os << "; shard group " << shard_size << " x " << replicas << " replica" << (replicas == 1 ? "" : "s") << "\n"
     << "  per rank, resident: parameter shards " << mib(param_shard_bytes) << ", gradient shards "
     << mib(grad_shard_bytes) << ", optimizer state " << mib(optimizer_bytes) << "\n"
     << "  per rank, during a step: largest unit " << mib(largest_unit_bytes) << " unsharded, at most "
     << mib(step_unsharded_bytes) << " of unsharded parameters and gradients (+ " << mib(accumulation_bytes)
     << " with gradient accumulation)\n";
  return os.str();
}

}  // namespace fsdp

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
#include "fsdp/state.h"

namespace fsdp {
namespace detail {

namespace {

bool is_prefix_of(const std::string& unit, const std::string& param) {
  if (unit.empty()) return true;
  return param.size() > unit.size() && param.compare(0, unit.size(), unit) == 0 && param[unit.size()] == '.';
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
    if (selected[i]) plan.push_back({all[i].first, all[i].second, {}, {}, false});
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
  return plan;
}

}  // namespace detail

// ---- planning -------------------------------------------------------------------

namespace {
// Whether shards live on the compute device (FlatParamOptions::shard_device ==
// device): only CPU offload from an accelerator moves them elsewhere.
bool shards_on_compute_device(const FsdpOptions& o) { return !o.cpu_offload || o.device.is_cpu(); }
}  // namespace

bool detail::keeps_single_copy(const FsdpOptions& o, int shard_size) {
  const MixedPrecision& mp = o.mixed_precision;
  return shard_size == 1 && mp.param_dtype == mp.master_dtype && shards_on_compute_device(o);
}

ShardingPlan plan_sharding(const std::shared_ptr<nn::UnitBase>& root, int world_size, int rank,
                           const FsdpOptions& options, at::ScalarType optimizer_state_dtype) {
  FSDP_CHECK(root != nullptr, "plan_sharding: the root module is null");
  FSDP_CHECK(world_size >= 1, "plan_sharding: world_size (the number of processes) must be >= 1, got ",
             world_size);
  FSDP_CHECK(rank >= 0 && rank < world_size, "plan_sharding: rank ", rank, " is outside [0, ", world_size,
             ") — give a rank below the world size ", world_size);
  ShardingPlan plan;
  switch (options.strategy) {
    case ShardingStrategy::kNoShard: plan.shard_size = 1; break;
    case ShardingStrategy::kHybridShard:
      FSDP_CHECK(options.hybrid_shard_size >= 1 && world_size % options.hybrid_shard_size == 0,
                 "HYBRID_SHARD: FsdpOptions::hybrid_shard_size ", options.hybrid_shard_size,
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
  // Frozen shards hold the param dtype, and under NO_SHARD are the compute
  // copy itself (Note [Frozen shards in the param dtype] in model.cpp).
  const bool frozen_in_place = options.strategy == ShardingStrategy::kNoShard && shards_on_compute_device(options);

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
  const std::vector<detail::PlannedUnit> planned = detail::plan_units(root, options);
  std::vector<detail::StepUnit> step_units;
  int64_t all_grads = 0, largest = 0, root_padded = 0;
  for (const auto& pu : planned) {
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
    plan.param_shard_bytes += trained.shard_numel * master + frozen.shard_numel * pbytes;
    plan.grad_shard_bytes += trained.shard_numel * master;
    plan.optimizer_bytes += 2 * trained.shard_numel * sbytes;
    detail::StepUnit su;
    su.params = trained.padded_numel + (frozen_in_place ? 0 : frozen.padded_numel);
    su.grads = trained.padded_numel;
    su.trains = !pu.sources.empty();
    // Note [Frozen parameters] in unit.cpp: a root with frozen parameters reduces at the end of backward.
    su.reduces_at_end = pu.name.empty() && !pu.frozen.empty();
    step_units.push_back(su);
    all_grads += trained.padded_numel;
    if (pu.name.empty()) {
      root_padded = su.params;
    } else {
      largest = std::max(largest, su.params);
    }
  }
  plan.largest_unit_bytes = std::max(largest, root_padded) * pbytes;
  if (detail::keeps_single_copy(options, plan.shard_size)) return plan;  // nothing unsharded: 0

  const int64_t rbytes = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
  plan.step_unsharded_bytes =
      detail::replay_step(step_units, detail::call_sequence(root, planned), options, plan.shard_size);
  // See Note [Accumulating without synchronization].
  plan.accumulation_bytes = all_grads * std::max(pbytes, rbytes);
  return plan;
}

// Note [Unsharded memory]
// What a synchronized step holds at once of unsharded parameters, gradients and
// gradients in flight to a reduction is found by replaying the engine's rules
// (unit.cpp, model.cpp, collectives.cpp) over the units' sizes, in the order the
// model calls them (nn::CallOrder; else each unit once in registration order,
// the root's own parameters first), in a steady-state step (the previous step's
// order known to forward prefetch):
// - Forward: the root is unsharded first and stays so until its post-backward;
//   each call unshards its unit (a prefetch may have done it: forward prefetch
//   gathers the unit after this one in the previous step's order, at most
//   limit_all_gathers ahead), and FULL_SHARD/HYBRID reshard it after the call.
// - Backward: the root's gradient buffer first; then, walking the calls in
//   reverse, a unit's last call unshards it, allocates its gradients and (with
//   BACKWARD_PRE) prefetches the unit called before it; its first call is where
//   its gradients are complete: post-backward. The root's post-backward comes
//   where its own parameters were first used ("" in the call order), or at the
//   end of backward when it holds frozen parameters.
// - A post-backward reshards the unit (its parameters are not read again),
//   makes the reduce-dtype copy (when the dtypes differ) and frees the
//   param-dtype gradients, allocates a shard-sized output when the reduction
//   cannot land in the gradient shard (another dtype or device) — with CPU
//   offload and another dtype, a staging buffer of the master dtype beside it
//   (Note [Offload staging] in collectives.cpp) — and waits for
//   the oldest reduction once more than kMaxInflightReduces are in flight,
//   freeing what it held; BACKWARD_POST then prefetches the unit called before
//   it. (Resharding before the copy, not after it, took llama3.1-8b on 8 ranks
//   in bf16 from 9.45 to 7.50 GiB with the old layout, and the embedding and
//   head as units to 4.56.)
// - NO_SHARD keeps every compute copy resident; frozen parameters count as
//   parameters only, and not at all under NO_SHARD (their shard is their copy).
// The ledger of a step (UnshardedMemory::peak) equals the replay's peak when
// the model calls its units as its CallOrder says (tests/fsdp/test_memory_contract.cpp).
namespace detail {

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

int64_t replay_step(const std::vector<StepUnit>& units, const std::vector<int>& calls, const FsdpOptions& o,
                    int shard_size) {
  const MixedPrecision& mp = o.mixed_precision;
  const int64_t pb = static_cast<int64_t>(c10::elementSize(mp.param_dtype));
  const int64_t rb = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
  const bool converts = mp.reduce_dtype != mp.param_dtype;
  const bool replicated = o.strategy == ShardingStrategy::kNoShard;
  const bool sharded_fwd = o.strategy == ShardingStrategy::kFullShard || o.strategy == ShardingStrategy::kHybridShard;
  // A reduction lands in the gradient shard when its input has the master dtype, on the shard's device.
  const at::ScalarType input_dtype = converts ? mp.reduce_dtype : mp.param_dtype;
  const bool output_scratch =
      !replicated && (input_dtype != mp.master_dtype || !shards_on_compute_device(o));
  // Note [Offload staging] in collectives.cpp: host shards of another dtype
  // pass through a master-dtype buffer on the device, for a gather while its
  // cast runs, for a reduction until it is folded in.
  const int64_t mb = static_cast<int64_t>(c10::elementSize(mp.master_dtype));
  const bool stage_gather = !shards_on_compute_device(o) && mp.param_dtype != mp.master_dtype;
  const bool stage_reduce = output_scratch && !shards_on_compute_device(o) && input_dtype != mp.master_dtype;
  const size_t n = units.size();

  int64_t cur = 0, peak = 0;
  const auto add = [&](int64_t b) {
    cur += b;
    peak = std::max(peak, cur);
  };
  std::vector<bool> gathered(n, replicated), prefetched(n, false);
  int pending_prefetch = 0;
  if (replicated) {
    for (const StepUnit& u : units) add(u.params * pb);
  }
  const auto unshard = [&](int u) {
    if (gathered[size_t(u)]) return;
    gathered[size_t(u)] = true;
    add(units[size_t(u)].params * pb);
    if (stage_gather) peak = std::max(peak, cur + units[size_t(u)].grads / shard_size * mb);  // freed at once
  };
  const auto reshard = [&](int u) {
    if (replicated || !gathered[size_t(u)]) return;
    gathered[size_t(u)] = false;
    cur -= units[size_t(u)].params * pb;
  };
  const auto prefetch = [&](int u) {
    if (u < 0 || gathered[size_t(u)] || pending_prefetch >= o.limit_all_gathers) return;
    unshard(u);
    prefetched[size_t(u)] = true;
    ++pending_prefetch;
  };
  const auto consumed = [&](int u) {
    if (!prefetched[size_t(u)]) return;
    prefetched[size_t(u)] = false;
    --pending_prefetch;
  };
  // The engine's forward order: the root, then every call of another unit.
  std::vector<int> order = {0};
  for (int u : calls) {
    if (u != 0) order.push_back(u);
  }
  std::vector<int> pos(n, -1), first_call(n, -1), last_call(n, -1);
  for (size_t k = 0; k < order.size(); ++k) pos[size_t(order[k])] = static_cast<int>(k);
  for (size_t j = 0; j < calls.size(); ++j) {
    const size_t u = size_t(calls[j]);
    if (first_call[u] < 0) first_call[u] = static_cast<int>(j);
    last_call[u] = static_cast<int>(j);
  }
  const auto after = [&](int u) {  // forward prefetch: the next unit in the (previous) order
    const int k = pos[size_t(u)];
    return k >= 0 && size_t(k + 1) < order.size() ? order[size_t(k + 1)] : -1;
  };
  const auto before = [&](int u) {  // backward prefetch: the unit called before u's last call
    const int k = pos[size_t(u)];
    return k > 1 ? order[size_t(k - 1)] : -1;
  };

  // --- forward
  consumed(0);
  unshard(0);
  if (o.forward_prefetch) prefetch(after(0));
  for (size_t k = 1; k < order.size(); ++k) {
    const int u = order[k];
    consumed(u);
    unshard(u);
    if (o.forward_prefetch) prefetch(after(u));
    if (sharded_fwd) reshard(u);
  }

  // --- backward
  std::vector<bool> reduced(n, false);
  std::deque<int> in_flight;
  std::vector<int64_t> held(n, 0);  // bytes a reduction in flight keeps
  const auto finish = [&](int u) {
    cur -= held[size_t(u)];
    held[size_t(u)] = 0;
  };
  const auto pre_backward = [&](int u) {
    consumed(u);
    unshard(u);
    if (o.backward_prefetch == BackwardPrefetch::kPre) prefetch(before(u));
    if (units[size_t(u)].trains) add(units[size_t(u)].grads * pb);
  };
  const auto post_backward = [&](int u) {
    reduced[size_t(u)] = true;
    const StepUnit& su = units[size_t(u)];
    reshard(u);  // first: its gradients are complete
    if (su.trains) {
      const int64_t g = su.grads;
      if (converts) {
        add(g * rb);      // the reduce-dtype copy
        cur -= g * pb;    // the param-dtype gradients go at once
        held[size_t(u)] = g * rb;
      } else {
        held[size_t(u)] = g * pb;  // the gradients themselves are reduced
      }
      if (output_scratch) {
        const int64_t scratch = g / shard_size * (rb + (stage_reduce ? mb : 0));
        add(scratch);
        held[size_t(u)] += scratch;
      }
    }
    if (su.trains) {
      in_flight.push_back(u);
      while (in_flight.size() > kMaxInflightReduces) {
        finish(in_flight.front());
        in_flight.pop_front();
      }
    }
    if (o.backward_prefetch == BackwardPrefetch::kPost) prefetch(before(u));
  };
  pre_backward(0);  // the root's outputs reach backward first
  for (size_t j = calls.size(); j-- > 0;) {
    const int u = calls[j];
    if (u == 0) {
      if (static_cast<int>(j) == first_call[0] && !units[0].reduces_at_end) post_backward(0);
      continue;
    }
    if (static_cast<int>(j) == last_call[size_t(u)]) pre_backward(u);
    if (static_cast<int>(j) == first_call[size_t(u)]) post_backward(u);
  }
  for (size_t u = 0; u < n; ++u) {  // end of backward: what did not complete, in unit order
    if (!reduced[u]) post_backward(static_cast<int>(u));
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

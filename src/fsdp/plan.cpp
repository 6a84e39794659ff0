// Planning without a process group: which boundaries become units, which
// parameters each owns, and what a rank holds (plan_sharding), for the engine
// (build_units) and for command lines that check a run before starting it.
#include <algorithm>
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

  // Padded elements: of parameters (trainable and frozen), and of gradients
  // (trainable only: frozen parameters have no gradient buffers).
  int64_t largest = 0, all_padded = 0, root_padded = 0;
  int64_t largest_grads = 0, all_grads = 0, root_grads = 0;
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
  for (const auto& pu : detail::plan_units(root, options)) {
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
    const int64_t padded = trained.padded_numel + (frozen_in_place ? 0 : frozen.padded_numel);
    all_padded += padded;
    all_grads += trained.padded_numel;
    if (pu.name.empty()) {
      root_padded = padded;
      root_grads = trained.padded_numel;
    } else {
      largest = std::max(largest, padded);
      largest_grads = std::max(largest_grads, trained.padded_numel);
    }
  }
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
  // - Frozen parameters are gathered and freed with their unit's, and have no
  //   gradients: parameters count R, B, A; gradients and reductions count
  //   their trainable parts Rg, Bg, Ag (Note [Frozen parameters] in unit.cpp).
  //   Under NO_SHARD they count in neither: their shard is their compute copy.
  const int64_t R = root_padded, B = largest, A = all_padded;
  const int64_t Rg = root_grads, Bg = largest_grads, Ag = all_grads;
  const int64_t rbytes = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
  const bool converts = mp.reduce_dtype != mp.param_dtype;
  const bool scratch = options.cpu_offload && options.device.is_cuda();
  const int64_t in_flight = static_cast<int64_t>(detail::kMaxInflightReduces);
  // A reduction in flight for `n` padded elements, and the worst moment of the post-backward that issues it.
  const auto held = [&](int64_t n) {
    return (converts ? n * rbytes : n * pbytes) + (scratch ? n / plan.shard_size * rbytes : 0);
  };
  const auto post_backward = [&](int64_t n, int64_t earlier) {
    return std::max(n * pbytes + (converts ? n * rbytes : 0), held(n)) + earlier * held(Bg);
  };
  int64_t forward = 0, blocks = 0;
  switch (options.strategy) {
    case ShardingStrategy::kFullShard:
    case ShardingStrategy::kHybridShard: {
      const int64_t gathered = options.backward_prefetch == BackwardPrefetch::kPre ? 2 : 1;
      forward = (R + (options.forward_prefetch ? 2 : 1) * B) * pbytes;
      blocks = R * pbytes + Rg * pbytes + gathered * B * pbytes + post_backward(Bg, in_flight);
      break;
    }
    case ShardingStrategy::kShardGradOp:
      forward = A * pbytes;
      for (int64_t j = 0; j <= in_flight; ++j) {
        blocks = std::max(blocks, (A - j * B) * pbytes + Rg * pbytes + post_backward(Bg, j));
      }
      break;
    case ShardingStrategy::kNoShard:
      forward = A * pbytes;
      blocks = A * pbytes + Rg * pbytes + post_backward(Bg, in_flight);
      break;
  }
  const int64_t resident = options.strategy == ShardingStrategy::kNoShard ? A * pbytes : R * pbytes;
  const int64_t root_last = resident + post_backward(Rg, in_flight);
  plan.step_unsharded_bytes = std::max({forward, blocks, root_last});
  // See Note [Accumulating without synchronization].
  plan.accumulation_bytes = Ag * std::max(pbytes, rbytes);
  return plan;
}

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

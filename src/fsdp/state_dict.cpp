// State dicts with PyTorch's options (fsdp/state_dict.h), on the engine's
// public surface: units() for placements, shards() for values, gather_unit /
// load_unit for whole flat parameters.
#include "fsdp/state_dict.h"

#include <unordered_map>
#include <unordered_set>

#include "fsdp/common/error.h"
#include "fsdp/state.h"

namespace fsdp {

namespace {

bool replicated(const UnitInfo& u) { return u.shard_numel == u.padded_numel; }

// Every rank's `shard_tensor` (entry `u`'s shard size) gathered: the entry's
// padded flat, on the tensor's device. Collective over the shard group unless
// the entry is replicated.
at::Tensor gather_flat(ShardedModel& m, const UnitInfo& u, const at::Tensor& shard_tensor) {
  if (replicated(u)) return shard_tensor;
  const at::Device on = m.shard_group()->device();
  at::Tensor full = at::empty({u.padded_numel}, shard_tensor.options().device(on).pinned_memory(false));
  m.shard_group()->all_gather(full, shard_tensor.contiguous().to(on))->wait();
  return full.to(shard_tensor.device());
}

// This rank's part of parameter `p` in entry `u`: [first, first + count) of
// the flattened parameter, at `at` in the shard.
struct Part {
  int64_t first = 0, count = 0, at = 0;
};
Part part_of(const UnitInfo& u, const ParamPlacement& p) {
  const int64_t lo = std::max(u.shard_offset, p.flat_offset);
  const int64_t hi = std::min(u.shard_offset + u.shard_numel, p.flat_offset + p.numel);
  if (hi <= lo) return {0, 0, 0};
  return {lo - p.flat_offset, hi - lo, lo - u.shard_offset};
}

StateDictTensor whole(const at::Tensor& t, bool cpu) {
  StateDictTensor e;
  e.value = cpu ? t.detach().to(at::kCPU) : t.detach().clone();
  e.shape = t.sizes().vec();
  return e;
}

// Where each parameter lives: (entry, placement), by the parameter's storage
// (a tied parameter's second name finds its first's place).
struct Places {
  std::unordered_map<std::string, std::pair<size_t, size_t>> by_name;  // name -> (entry, placement)
};
Places places(ShardedModel& m) {
  Places out;
  const auto& units = m.units();
  std::unordered_map<std::string, std::pair<size_t, size_t>> first;
  for (size_t e = 0; e < units.size(); ++e) {
    for (size_t k = 0; k < units[e].params.size(); ++k) first[units[e].params[k].name] = {e, k};
  }
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, size_t>> by_impl;
  for (auto& p : detail::impl_of(m).root_module()->named_parameters(true)) {
    auto it = first.find(p.key());
    if (it != first.end()) by_impl[p.value().unsafeGetTensorImpl()] = it->second;
  }
  for (auto& p : detail::impl_of(m).root_module()->named_parameters(true)) {
    auto it = by_impl.find(p.value().unsafeGetTensorImpl());
    if (it != by_impl.end()) out.by_name[p.key()] = it->second;
  }
  return out;
}

}  // namespace

StateDict get_model_state_dict(ShardedModel& model, const StateDictOptions& options) {
  detail::ShardedModelImpl& impl = detail::impl_of(model);
  impl.between_steps("get_model_state_dict");
  const auto& units = model.units();
  const std::vector<ShardRef> shards = model.shards();
  const Places where = places(model);
  // Full: every entry gathered once, in entry order (the same collectives on every rank).
  std::vector<at::Tensor> gathered(units.size());
  if (options.full_state_dict) {
    for (size_t e = 0; e < units.size(); ++e) {
      if (options.ignore_frozen_params && !units[e].trainable) continue;
      gathered[e] = model.gather_unit(e);
    }
  }
  StateDict out;
  const bool keep = !(options.full_state_dict && options.cpu_offload) || impl.world()->rank() == 0;
  if (!keep) return out;  // PyTorch: a full state dict offloaded to the CPU is rank 0's alone
  for (auto& p : impl.root_module()->named_parameters(true)) {
    const auto it = where.by_name.find(p.key());
    if (it == where.by_name.end()) {  // ignored: the module's own tensor
      if (options.ignore_frozen_params && !p.value().requires_grad()) continue;
      out.emplace_back(p.key(), whole(p.value(), options.cpu_offload));
      continue;
    }
    const UnitInfo& u = units[it->second.first];
    const ParamPlacement& pl = u.params[it->second.second];
    if (options.ignore_frozen_params && !u.trainable) continue;
    StateDictTensor t;
    t.shape = pl.shape;
    if (options.full_state_dict || replicated(u)) {
      const at::Tensor flat = options.full_state_dict ? gathered[it->second.first] : shards[it->second.first].param;
      t.value = flat.narrow(0, pl.flat_offset, pl.numel).view(pl.shape).clone();
    } else {
      const Part part = part_of(u, pl);
      t.full = false;
      t.offset = part.first;
      t.value = shards[it->second.first].param.narrow(0, part.at, part.count).clone();
    }
    if (options.cpu_offload) t.value = t.value.to(at::kCPU);
    out.emplace_back(p.key(), std::move(t));
  }
  for (auto& b : impl.root_module()->named_buffers(true)) out.emplace_back(b.key(), whole(b.value(), options.cpu_offload));
  return out;
}

namespace {

// set_model_state_dict's steps, with what they share: which dict this rank
// reads (rank 0's alone when broadcasting) and how the ranks agree.
struct DictLoad {
  ShardedModel& model;
  const comm::ProcessGroupPtr& world;
  const StateDictOptions& options;
  bool from_rank0 = false;
  bool reads = false;  // this rank's dict is read
  std::unordered_map<std::string, const StateDictTensor*> given;

  // Missing and unexpected names; a strict load refuses them on every rank.
  IncompatibleKeys check_keys(detail::ShardedModelImpl& impl, const StateDict& state) const {
    std::unordered_set<std::string> known;
    IncompatibleKeys keys;
    for (auto& p : impl.root_module()->named_parameters(true)) {
      known.insert(p.key());
      if (reads && given.count(p.key()) == 0) keys.missing.push_back(p.key());
    }
    for (auto& b : impl.root_module()->named_buffers(true)) {
      known.insert(b.key());
      if (reads && given.count(b.key()) == 0) keys.missing.push_back(b.key());
    }
    if (reads) {
      for (const auto& [name, t] : state) {
        if (known.count(name) == 0) keys.unexpected.push_back(name);
        FSDP_CHECK(known.count(name) == 0 || t.full == options.full_state_dict, "set_model_state_dict: '", name,
                   "' is ", t.full ? "a full tensor" : "a part", " but full_state_dict is ",
                   options.full_state_dict ? "true" : "false", "; load the dict with the options it was made with");
      }
    }
    // Strictness is decided where the dict is read and agreed on by every rank.
    int64_t refused = options.strict && (!keys.missing.empty() || !keys.unexpected.empty()) ? 1 : 0;
    if (from_rank0) {
      at::Tensor flag = at::tensor({refused}, at::kLong).to(world->device());
      world->broadcast(flag, 0)->wait();
      refused = flag.item<int64_t>();
    }
    if (refused != 0) {
      std::string missing, unexpected;
      for (const auto& n : keys.missing) missing += (missing.empty() ? "" : ", ") + n;
      for (const auto& n : keys.unexpected) unexpected += (unexpected.empty() ? "" : ", ") + n;
      FSDP_CHECK(false, "set_model_state_dict (strict): missing [", missing, "], unexpected [", unexpected,
                 "]", reads ? "" : " (on rank 0)", "; give every parameter and buffer, or set strict false");
    }
    return keys;
  }

  // A sharded entry: parts, each rank writes its own elements.
  void load_parts(size_t e, const UnitInfo& u, const std::vector<ShardRef>& shards) const {
    at::NoGradGuard no_grad;
    for (const ParamPlacement& pl : u.params) {
      const auto it = given.find(pl.name);
      if (it == given.end()) continue;
      const Part part = part_of(u, pl);
      const at::Tensor& v = it->second->value;
      FSDP_CHECK(it->second->offset == part.first && v.numel() == part.count, "set_model_state_dict: '", pl.name,
                 "' holds elements [", it->second->offset, ", ", it->second->offset + v.numel(),
                 ") of it, this rank's shard has [", part.first, ", ", part.first + part.count,
                 "): a sharded state dict loads only into the layout it came from; use full_state_dict");
      shards[e].param.narrow(0, part.at, part.count).copy_(v.reshape({-1}));
    }
    model.reshard(u.name);  // an unsharded copy kept by a policy is stale now
  }

  // A replicated entry or a full dict: the whole flat values, gathered where
  // the dict gives none.
  void load_full(size_t e, const UnitInfo& u, const std::vector<ShardRef>& shards) const {
    bool complete = true;
    for (const ParamPlacement& pl : u.params) complete = complete && given.count(pl.name) > 0;
    // Ranks agree on whether the current values are needed (a collective):
    // rank 0's dict decides when broadcasting, else any rank missing a name.
    int64_t gather = reads && !complete ? 1 : 0;
    if (world->size() > 1) {
      at::Tensor flag = at::tensor({gather}, at::kLong).to(world->device());
      if (from_rank0) {
        world->broadcast(flag, 0)->wait();
      } else {
        world->all_reduce(flag, comm::ReduceOp::kMax)->wait();
      }
      gather = flag.item<int64_t>();
    }
    // The entry's unpadded flat values: the current ones where the dict gives none.
    at::Tensor flat = gather != 0 ? model.gather_unit(e)
                                  : at::zeros({u.numel}, shards[e].param.options().device(at::kCPU));
    if (reads) {
      at::NoGradGuard no_grad;
      for (const ParamPlacement& pl : u.params) {
        const auto it = given.find(pl.name);
        if (it == given.end()) continue;
        const at::Tensor& v = it->second->value;
        FSDP_CHECK(v.numel() == pl.numel, "set_model_state_dict: '", pl.name, "' has ", v.numel(), " elements, the "
                   "model's ", pl.numel, " (shape ", c10::IntArrayRef(pl.shape), ")");
        flat.narrow(0, pl.flat_offset, pl.numel).copy_(v.reshape({-1}));
      }
    }
    if (from_rank0) {
      at::Tensor on = flat.to(world->device());
      world->broadcast(on, 0)->wait();
      flat = on;
    }
    model.load_unit(e, flat);
  }

  // Ignored parameters and buffers: the module's own tensors (from rank 0 when broadcasting).
  void write(const std::string& name, at::Tensor target) const {
    at::Tensor v = target.detach().clone();
    const auto it = given.find(name);
    if (reads && it != given.end()) v.copy_(it->second->value.reshape(target.sizes()));
    int64_t have = reads && it != given.end() ? 1 : 0;
    if (from_rank0) {
      at::Tensor flag = at::tensor({have}, at::kLong).to(world->device());
      world->broadcast(flag, 0)->wait();
      have = flag.item<int64_t>();
      if (have != 0) {
        at::Tensor on = v.to(world->device());
        world->broadcast(on, 0)->wait();
        v = on;
      }
    }
    if (have == 0) return;
    at::NoGradGuard no_grad;
    target.copy_(v);
  }
};

}  // namespace

IncompatibleKeys set_model_state_dict(ShardedModel& model, const StateDict& state, const StateDictOptions& options) {
  detail::ShardedModelImpl& impl = detail::impl_of(model);
  impl.between_steps("set_model_state_dict");
  const comm::ProcessGroupPtr& world = impl.world();
  DictLoad load{model, world, options};
  load.from_rank0 = options.broadcast_from_rank0 && world->size() > 1;
  FSDP_CHECK(!options.broadcast_from_rank0 || options.full_state_dict, "set_model_state_dict: broadcast_from_rank0 "
             "needs full_state_dict (rank 0's full tensors are broadcast)");
  load.reads = !load.from_rank0 || world->rank() == 0;
  for (const auto& [name, t] : state) load.given[name] = &t;
  const auto& units = model.units();
  const Places where = places(model);
  const IncompatibleKeys keys = load.check_keys(impl, state);
  const std::vector<ShardRef> shards = model.shards();
  for (size_t e = 0; e < units.size(); ++e) {
    if (!options.full_state_dict && !replicated(units[e])) {
      load.load_parts(e, units[e], shards);
    } else {
      load.load_full(e, units[e], shards);
    }
  }
  for (auto& p : impl.root_module()->named_parameters(true)) {
    if (where.by_name.count(p.key()) == 0) load.write(p.key(), p.value());
  }
  for (auto& b : impl.root_module()->named_buffers(true)) load.write(b.key(), b.value());
  return keys;
}

OptimizerStateDict get_optimizer_state_dict(ShardedModel& model, const std::vector<ShardOptimizerState>& optimizer,
                                            int64_t step, const StateDictOptions& options) {
  detail::ShardedModelImpl& impl = detail::impl_of(model);
  impl.between_steps("get_optimizer_state_dict");
  const auto& units = model.units();
  const std::vector<ShardRef> shards = model.shards();
  OptimizerStateDict out;
  out.step = step;
  const bool keep = !(options.full_state_dict && options.cpu_offload) || impl.world()->rank() == 0;
  for (size_t e = 0; e < units.size(); ++e) {
    if (!units[e].trainable) continue;
    const ShardOptimizerState* s = nullptr;
    for (const auto& x : optimizer) s = x.shard.is_same(shards[e].param) ? &x : s;
    if (s == nullptr) continue;  // no state for this shard (yet)
    std::map<std::string, at::Tensor> flats;
    for (const auto& [name, t] : s->tensors) {
      FSDP_CHECK(t.numel() == units[e].shard_numel, "get_optimizer_state_dict: state '", name, "' of the shard of ",
                 units[e].name.empty() ? "the root" : "unit '" + units[e].name + "'", " has ", t.numel(),
                 " elements, the shard ", units[e].shard_numel);
      flats[name] = options.full_state_dict ? gather_flat(model, units[e], t) : t;
    }
    if (!keep) continue;
    for (const ParamPlacement& pl : units[e].params) {
      std::map<std::string, StateDictTensor> entry;
      for (const auto& [name, flat] : flats) {
        StateDictTensor t;
        t.shape = pl.shape;
        if (options.full_state_dict || replicated(units[e])) {
          t.value = flat.narrow(0, pl.flat_offset, pl.numel).view(pl.shape).clone();
        } else {
          const Part part = part_of(units[e], pl);
          t.full = false;
          t.offset = part.first;
          t.value = flat.narrow(0, part.at, part.count).clone();
        }
        if (options.cpu_offload) t.value = t.value.to(at::kCPU);
        entry[name] = std::move(t);
      }
      out.state.emplace_back(pl.name, std::move(entry));
    }
  }
  return out;
}

int64_t set_optimizer_state_dict(ShardedModel& model, const std::vector<ShardOptimizerState>& optimizer,
                                 const OptimizerStateDict& state, const StateDictOptions& options) {
  detail::ShardedModelImpl& impl = detail::impl_of(model);
  impl.between_steps("set_optimizer_state_dict");
  const comm::ProcessGroupPtr& world = impl.world();
  const bool from_rank0 = options.broadcast_from_rank0 && world->size() > 1;
  FSDP_CHECK(!options.broadcast_from_rank0 || options.full_state_dict, "set_optimizer_state_dict: "
             "broadcast_from_rank0 needs full_state_dict");
  const bool reads = !from_rank0 || world->rank() == 0;
  std::unordered_map<std::string, const std::map<std::string, StateDictTensor>*> given;
  for (const auto& [name, m] : state.state) given[name] = &m;
  const auto& units = model.units();
  const std::vector<ShardRef> shards = model.shards();
  for (size_t e = 0; e < units.size(); ++e) {
    if (!units[e].trainable) continue;
    const ShardOptimizerState* s = nullptr;
    for (const auto& x : optimizer) s = x.shard.is_same(shards[e].param) ? &x : s;
    if (s == nullptr) continue;
    for (const auto& [name, target] : s->tensors) {
      at::NoGradGuard no_grad;
      if (!options.full_state_dict && !replicated(units[e])) {
        for (const ParamPlacement& pl : units[e].params) {
          const auto it = given.find(pl.name);
          FSDP_CHECK(!options.strict || it != given.end(), "set_optimizer_state_dict (strict): no state for '",
                     pl.name, "'");
          if (it == given.end() || it->second->count(name) == 0) continue;
          const StateDictTensor& t = it->second->at(name);
          const Part part = part_of(units[e], pl);
          FSDP_CHECK(t.offset == part.first && t.value.numel() == part.count, "set_optimizer_state_dict: '", pl.name,
                     "' state '", name, "' is not this rank's part; a sharded dict loads only into its own layout");
          target.narrow(0, part.at, part.count).copy_(t.value.reshape({-1}));
        }
        continue;
      }
      // Full: the entry's padded flat of this state (zeros in the padding), this rank's chunk kept.
      at::Tensor flat = at::zeros({units[e].padded_numel}, target.options().device(at::kCPU));
      if (reads) {
        for (const ParamPlacement& pl : units[e].params) {
          const auto it = given.find(pl.name);
          FSDP_CHECK(!options.strict || it != given.end(), "set_optimizer_state_dict (strict): no state for '",
                     pl.name, "'");
          if (it == given.end() || it->second->count(name) == 0) {
            // keep the current values: this rank's own part
            const Part part = part_of(units[e], pl);
            if (part.count > 0) {
              flat.narrow(0, pl.flat_offset + part.first, part.count).copy_(target.narrow(0, part.at, part.count));
            }
            continue;
          }
          flat.narrow(0, pl.flat_offset, pl.numel).copy_(it->second->at(name).value.reshape({-1}));
        }
      }
      if (from_rank0) {
        at::Tensor on = flat.to(world->device());
        world->broadcast(on, 0)->wait();
        flat = on.to(at::kCPU);
      }
      target.copy_(flat.narrow(0, units[e].shard_offset, units[e].shard_numel));
    }
  }
  int64_t step = state.step;
  if (from_rank0) {
    at::Tensor s = at::tensor({step}, at::kLong).to(world->device());
    world->broadcast(s, 0)->wait();
    step = s.item<int64_t>();
  }
  return step;
}

}  // namespace fsdp

// Planning without a process group (plan.cpp): which boundaries become
// units, which parameters each owns, each unit's options, the schedule's view
// of them and the byte ledger of a step. The engine (model.cpp's build_units),
// the time model (plan/estimate.cpp) and the option checks (options.cpp) read
// this; none of them needs the engine's state (state.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/flat_param.h"
#include "fsdp/fsdp.h"
#include "fsdp/schedule.h"

namespace fsdp::detail {

// At most this many reductions in flight: each holds an unsharded gradient
// buffer, so this bounds backward's gradient memory to ~3 units (one
// collecting, two reducing). ScheduleOptions::max_inflight_reductions.
constexpr int kMaxInflightReduces = 2;

// Blocks of alignment slack in the preallocated pool beyond the plan's bound
// (each block's size is rounded up to UnshardedPool::kAlignment).
constexpr int64_t kPoolAlignmentBlocks = 32;


// A boundary the wrap policy made a unit, with the parameters it owns
// (registration order; a shared tensor listed once, under its first name)
// and its options resolved (FsdpOptions and the overrides that select it).
struct PlannedUnit {
  std::string name;  // "" for the root
  std::shared_ptr<nn::UnitBase> module;
  std::vector<FlatParam::Source> sources;  // trainable parameters, registration order
  std::vector<FlatParam::Source> frozen;   // frozen parameters (Note [Frozen parameters] in unit.cpp)
  bool checkpoint = false;
  MixedPrecision mixed_precision;          // its dtypes
  bool cpu_offload = false;                // its shards in host memory
  UnitPolicy policy;                       // its schedule policy (prefetch lists as unit indices)
  // The entries of ShardedModel::units() this unit has (UnitInfo).
  bool lists_trainable() const { return !sources.empty() || frozen.empty(); }
  bool lists_frozen() const { return !frozen.empty(); }
};

// The wrap policy, parameter ownership and each unit's options, without
// touching the model (so also for a model on the meta device). Root first,
// then pre-order. `shard_size`: ranks per shard group (checks
// reshard-after-forward groups; <= 0: unknown, unchecked).
std::vector<PlannedUnit> plan_units(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                                    int shard_size);
UnitInfo unit_info(const PlannedUnit& pu, const FlatLayout& layout, int64_t shard_offset, bool trainable);
// Whether the unit keeps a single resident copy (its shard is its
// parameters): NO_SHARD, or a one-rank shard group in the master dtype on the
// compute device (Note [One-rank shard groups] in model.cpp).
bool unit_replicated(const PlannedUnit& pu, const FsdpOptions& o, int shard_size);

// Ranks per shard group (1 for NO_SHARD). UsageError for a HYBRID size that
// does not divide the world.
int shard_group_size(const FsdpOptions& o, int world_size);

// The units (indices into plan_units' result) in the order one forward calls
// them, from the root's nn::CallOrder when its inner module has one; 0 (the
// root) marks where the root's own parameters are first used.
std::vector<int> call_sequence(const std::shared_ptr<nn::UnitBase>& root, const std::vector<PlannedUnit>& planned);

// The schedule's view of the planned units, and its options (schedule.h).
std::vector<ScheduleUnit> schedule_units(const std::vector<PlannedUnit>& planned, const FsdpOptions& o,
                                         int shard_size, int replicas);
std::vector<UnitPolicy> schedule_policies(const std::vector<PlannedUnit>& planned);
ScheduleOptions schedule_options(const FsdpOptions& o);

// One unit's sizes as the byte ledger of a step sees them (Note [Unsharded
// memory] in plan.cpp).
struct StepUnitBytes {
  int64_t params = 0;         // bytes gathered for compute (frozen ones too, but not under NO_SHARD)
  int64_t grads = 0;          // bytes of its gradient buffer (param dtype; 0: nothing trainable)
  int64_t reduce_copy = 0;    // bytes of the reduce-dtype copy of its gradients (0: reduced in place)
  int64_t reduce_output = 0;  // bytes of a reduction output that cannot land in the gradient shard (and its staging)
  int64_t gather_staging = 0; // bytes of a gather's staging buffer, freed as soon as the cast is issued
  bool replicated = false;    // resident for the whole step
  bool wider = false;         // the reduce dtype is wider than the param dtype (kKeepGrads moves to it)
};
std::vector<StepUnitBytes> step_unit_bytes(const std::vector<PlannedUnit>& planned, const FsdpOptions& o,
                                           int shard_size);
// The byte ledger: the most a step's `events` hold at once of unsharded
// parameters, gradients and reductions in flight, starting from the units
// `gathered_at_start` keeps.
int64_t replay_bytes(const std::vector<Event>& events, const std::vector<StepUnitBytes>& units,
                     const std::vector<bool>& gathered_at_start);

// FSDP2's integer reshard_after_forward (Note [Post-forward shards]) must be
// >= 1 and divide the shard group (`shard_size` <= 0: not known yet, only >= 1
// is checked). `who` names the setting in the error: the model-wide option or
// one unit's.
void check_post_forward_group(int group, int shard_size, std::string_view who);

}  // namespace fsdp::detail

// Fully Sharded Data Parallel for LibTorch modules.
//
//   auto model = fsdp::nn::make_unit<MyModelImpl>(...);      // root must be a Unit
//   auto sharded = fsdp::fully_shard(model.ptr(), world, options);
//   auto opt = fsdp::optim::AdamW(sharded->shards(), adamw_options);
//   for (...) {
//     auto loss = model->impl().loss(x, y);                   // forward through the units
//     loss.backward();                                        // gradients land in sharded->shards()
//     sharded->clip_grad_norm(1.0);
//     opt.step();
//     sharded->zero_grad();
//   }
//
// What fully_shard does (DESIGN.md, "One training step"):
//  - Every fsdp::nn::Unit boundary chosen by the wrap policy becomes a unit;
//    the others fold into their parent. The root is always a unit.
//  - Each unit owns one flat parameter: its parameters in registration order,
//    flattened, concatenated, padded to a multiple of the shard-group size S.
//    Rank r of the shard group owns the contiguous chunk r (the "shard"),
//    kept in fp32 as the optimizer's master copy.
//  - The module's own parameter tensors stay the same objects (same names,
//    same shapes) but become views of the unit's unsharded flat buffer, whose
//    bytes exist only while the unit is unsharded. Touching a parameter of a
//    resharded unit outside forward/backward is not allowed (use
//    ShardedModel::full_state / gather_unit).
//  - Gradients are reduce-scattered (mean over the data-parallel ranks) into
//    fp32 gradient shards; the optimizer steps on the shards.
//
// Requirements: every rank builds the same model and calls fully_shard with
// the same options; forward and backward run the same units in the same order
// on every rank (the collectives must match). create_graph backward is not
// supported. One forward per backward.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"

namespace fsdp {

enum class ShardingStrategy {
  kFullShard,    // parameters resharded after forward and after backward
  kShardGradOp,  // parameters stay unsharded from forward to the end of backward
  kNoShard,      // everything replicated; gradients all-reduced (DDP)
  kHybridShard,  // FULL_SHARD within a shard group, replicated across groups
};
const char* to_string(ShardingStrategy s);
// "full" | "grad-op" | "none" | "hybrid" (also PyTorch's FULL_SHARD etc.).
ShardingStrategy parse_sharding_strategy(const std::string& s);

enum class BackwardPrefetch { kNone, kPre, kPost };
const char* to_string(BackwardPrefetch p);
BackwardPrefetch parse_backward_prefetch(const std::string& s);  // "none" | "pre" | "post"

// Which marked boundaries become their own unit.
struct WrapPolicy {
  enum class Kind {
    kEveryUnit,  // every fsdp::nn::Unit in the model
    kByType,     // Units whose inner type is in `types`
    kSize,       // a Unit whose not-yet-wrapped parameters reach min_num_params
    kRootOnly,   // the whole model is one unit
  };
  Kind kind = Kind::kEveryUnit;
  std::vector<std::type_index> types;
  int64_t min_num_params = 0;

  static WrapPolicy every_unit() { return {}; }
  static WrapPolicy by_type(std::vector<std::type_index> t) { return {Kind::kByType, std::move(t), 0}; }
  static WrapPolicy size_based(int64_t n) { return {Kind::kSize, {}, n}; }
  static WrapPolicy root_only() { return {Kind::kRootOnly, {}, 0}; }
};

// Dtypes of the copies FSDP keeps. The sharded master copy is what the
// optimizer updates: float32 normally; bfloat16 for pure-bf16 training (with
// optim::AdamW's Kahan-compensated bf16 mode, so small updates are not lost).
// The command line's wrap policies: "block" (every boundary whose inner type
// is `block_type`), "size:N" (size-based, N parameters), "root" (one unit),
// "all" (every boundary). UsageError naming --wrap for anything else.
WrapPolicy parse_wrap_policy(const std::string& spec, std::type_index block_type);

struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   // unsharded parameters, hence compute and activations
  at::ScalarType reduce_dtype = at::kFloat;  // gradient communication
  at::ScalarType buffer_dtype = at::kFloat;  // module buffers (not sharded)
  at::ScalarType master_dtype = at::kFloat;  // parameter and gradient shards

  // The command line's presets: "fp32", "bf16" (bf16 params, fp32 reduce),
  // "fp16" (fp16 params, fp32 reduce; use a gradient scaler), "bf16-pure"
  // (bf16 everywhere, bf16 master shards). UsageError for other names.
  static MixedPrecision preset(const std::string& name);
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  WrapPolicy wrap = WrapPolicy::every_unit();
  // HYBRID_SHARD: ranks per shard group (consecutive ranks). 0: LOCAL_WORLD_SIZE.
  int hybrid_shard_size = 0;
  MixedPrecision mixed_precision;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  // At most this many all-gathers issued ahead of use (prefetches). >= 1.
  int limit_all_gathers = 2;
  // Keep parameter and gradient shards (hence optimizer state, which the
  // optimizer allocates beside them) in host memory — page-locked when CUDA is
  // present — while unsharded parameters live on `device`. The optimizer step
  // then runs on the host.
  bool cpu_offload = false;
  // Activation checkpointing: units whose inner type is listed (or every
  // non-root unit) keep only their inputs in forward and recompute their
  // forward in backward. Only units without nested units can be checkpointed.
  std::vector<std::type_index> checkpoint_types;
  bool checkpoint_all_units = false;
  // Keep the checkpointed units' saved inputs in host memory (GPU runs).
  bool offload_checkpoint_inputs = false;
  // Parameters on the meta device are materialized shard by shard with this
  // rule (fsdp::nn::init_slice); required when the model was built on meta.
  nn::InitRuleFn init_rule;
  uint64_t seed = 0;
  // Broadcast rank 0's parameter values before sharding: rank 0's parameters
  // must be materialized; the other ranks' may be on the meta device (only
  // rank 0 then needs memory for, or files of, the whole model).
  bool sync_module_states = false;
  // Device the unsharded parameters live on (CPU for the tcp group).
  at::Device device = at::kCPU;
};

// The optimizer's view of one unit's shard.
struct ShardRef {
  std::string unit_name;  // "" for the root
  at::Tensor param;       // (n) master dtype, the local shard; updated in place by the optimizer
  at::Tensor grad;        // (n) master dtype, reduced gradient (zeros when none arrived)
};

// Per-parameter placement, for checkpoints and HF export.
struct ParamPlacement {
  std::string name;              // fully qualified, as in named_parameters()
  std::vector<int64_t> shape;
  int64_t flat_offset = 0;       // offset in the unit's unpadded flat parameter
  int64_t numel = 0;
};

struct UnitInfo {
  std::string name;              // "" for the root
  std::string type_name;
  int64_t numel = 0;             // unpadded
  int64_t padded_numel = 0;      // multiple of the shard-group size
  int64_t shard_numel = 0;       // padded_numel / shard-group size
  int64_t shard_offset = 0;      // this rank's first element in the padded flat
  bool checkpointed = false;
  std::vector<ParamPlacement> params;
};

// Where the engine's bytes live (for logs and tests; the optimizer's state
// lives beside the shards it updates).
struct MemoryPlacement {
  std::string what;    // "parameter shards", "gradient shards", "unsharded parameters (resident)", ...
  std::string device;  // "cpu", "cuda:0"
  int64_t bytes = 0;
  bool pinned = false;
};

// The engine's own count of the buffers it allocates for a step beyond the
// resident shards (Note [Unsharded memory] in src/fsdp/model.cpp), in bytes.
struct UnshardedBytes {
  int64_t params = 0;       // unsharded parameters (param dtype)
  int64_t grads = 0;        // unsharded gradients while they are computed (param dtype)
  int64_t reductions = 0;   // gradients in flight to a reduction: reduce-dtype copies,
                            // and reduction outputs that cannot land in the gradient shard
  int64_t accumulated = 0;  // gradients kept across micro-batches without synchronization
  int64_t total() const { return params + grads + reductions + accumulated; }
};

struct UnshardedMemory {
  UnshardedBytes now;      // held at this moment
  UnshardedBytes at_peak;  // what was held when the total peaked
  int64_t peak = 0;        // the largest total since the last reset (or since fully_shard)
};

struct StepCounters {
  int64_t allgather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t allreduce_bytes = 0;
};

namespace detail {
class ShardedModelImpl;
}

class ShardedModel {
 public:
  ~ShardedModel();

  // Local shards and their gradients, one per unit, in unit order.
  std::vector<ShardRef> shards() const;
  // Drops accumulated gradients (no memset: the next reduction overwrites).
  void zero_grad();
  // false: the next backward passes keep unsharded gradients locally and skip
  // communication (like PyTorch's no_sync); true again before the last
  // micro-batch. Memory cost while off: one unsharded gradient buffer per unit
  // (the full model's gradients in param dtype) stays resident.
  void set_requires_gradient_sync(bool sync);

  // Global L2 norm of the gradients over the whole model (every rank gets the
  // same value; replicas are not counted twice).
  double grad_norm();
  // Scales gradients so that their global norm is at most max_norm, like
  // torch.nn.utils.clip_grad_norm_ (coef = max_norm / (norm + 1e-6), capped
  // at 1). Returns the norm before clipping.
  double clip_grad_norm(double max_norm);

  // Layout and this rank's placement.
  const std::vector<UnitInfo>& units() const;
  std::vector<MemoryPlacement> memory_placement() const;
  // Bytes this rank communicated since the last call (and resets them).
  StepCounters take_step_counters();
  // The unsharded buffers this rank holds and has held at most (the engine's
  // ledger: every allocation and release of them goes through it), and the
  // start of a new peak. ShardingPlan::step_unsharded_bytes bounds `peak`.
  UnshardedMemory unsharded_memory() const;
  void reset_unsharded_peak();

  // Full (unpadded) flat parameter of unit `u`, gathered to every rank of the
  // shard group, in the master dtype (fp32; bf16 for pure-bf16 training).
  // Collective over the shard group.
  at::Tensor gather_unit(size_t u);
  // Writes `full` (the unit's unpadded flat values, any float dtype) into this
  // rank's shard.
  void load_unit(size_t u, const at::Tensor& full);

  const comm::ProcessGroupPtr& shard_group() const;
  const comm::ProcessGroupPtr& replicate_group() const;  // null unless hybrid
  const FsdpOptions& options() const;
  // A multi-line description: units, sizes, padding, strategy.
  std::string describe() const;

 private:
  friend std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>&,
                                                   const comm::ProcessGroupPtr&, const FsdpOptions&);
  explicit ShardedModel(std::unique_ptr<detail::ShardedModelImpl> impl);
  std::unique_ptr<detail::ShardedModelImpl> impl_;
};

// The checks fully_shard makes of its options, without a process group (for
// command lines that validate before starting workers). world_size <= 0:
// unknown. UsageError naming the problem and the fix.
void check_options(const FsdpOptions& options, int world_size);

// The layout fully_shard would build for `rank` of `world_size` processes,
// and that rank's memory, from the model's structure alone: no process group,
// works on the meta device (a 70B model is planned in milliseconds), does not
// modify the model.
struct ShardingPlan {
  std::vector<UnitInfo> units;  // what ShardedModel::units() would report on `rank`
  int shard_size = 1;           // ranks sharing one copy of the parameters (1 for NO_SHARD)
  int replicas = 1;             // world_size / shard_size
  int64_t parameters = 0;       // unpadded total
  // Resident on every rank for the whole run (host memory with CPU offload):
  int64_t param_shard_bytes = 0;  // master shards, master dtype
  int64_t grad_shard_bytes = 0;   // reduced gradient shards, master dtype
  int64_t optimizer_bytes = 0;    // AdamW exp_avg + exp_avg_sq beside the shards
  // Unsharded buffers on the compute device while a step runs; see
  // Note [Unsharded memory] in src/fsdp/model.cpp for the schedule behind it:
  int64_t largest_unit_bytes = 0;   // the largest unit's parameters (param dtype)
  int64_t step_unsharded_bytes = 0; // the most a synchronized step holds at once of
      // unsharded parameters, gradients and gradients in flight to a reduction
      // (UnshardedMemory::peak of a step never exceeds it), assuming units run
      // forward once each in registration order and the root's own gradients
      // complete last (its embedding is used before the first unit), as in the
      // decoder models this project trains. 0 when every unit is its own single
      // copy (NO_SHARD or a one-rank shard group, master dtype, no offload).
  int64_t accumulation_bytes = 0;   // added by micro-batches without gradient
      // synchronization (no_sync, --grad-accum > 1): every unit's gradients stay
      // unsharded between them (in the reduce dtype when it is the wider).
  // Not included: activations, communication scratch, LibTorch's own memory.
  // The bound for a step of `micro_batches` micro-batches, synchronized on the last.
  int64_t unsharded_bound(int64_t micro_batches) const {
    return step_unsharded_bytes + (micro_batches > 1 ? accumulation_bytes : 0);
  }
  std::string describe() const;
};
ShardingPlan plan_sharding(const std::shared_ptr<nn::UnitBase>& root, int world_size, int rank,
                           const FsdpOptions& options, at::ScalarType optimizer_state_dtype = at::kFloat);

// Shards `root` over `world` (every rank calls it with the same model and
// options). HYBRID_SHARD builds shard and replicate subgroups of `world`.
// The returned object must outlive every forward/backward of the model.
std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>& root,
                                          const comm::ProcessGroupPtr& world, const FsdpOptions& options);

}  // namespace fsdp

// Fully Sharded Data Parallel for LibTorch modules.
//
// Example (tests/fsdp/test_header_example.cpp compiles and runs it as written):
//
//   struct BlockImpl : torch::nn::Module {  // any module; a Unit marks a shard boundary
//     BlockImpl() { w = register_parameter("w", torch::randn({16, 16}) * 0.1); }
//     at::Tensor forward(const at::Tensor& x) { return x + torch::tanh(x.matmul(w)); }
//     at::Tensor w;
//   };
//   struct NetImpl : torch::nn::Module {
//     NetImpl() : a(fsdp::nn::make_unit<BlockImpl>()), b(fsdp::nn::make_unit<BlockImpl>()) {
//       register_module("a", a.ptr());
//       register_module("b", b.ptr());
//     }
//     at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {  // the loss, inside the root
//       return (b(a(x)) - y).pow(2).mean();
//     }
//     fsdp::nn::Unit<BlockImpl> a, b;
//   };
//
//   fsdp::comm::Runtime rt = fsdp::comm::init_process_group(fsdp::comm::detect_world());
//   auto model = fsdp::nn::make_unit<NetImpl>();  // the root must be a Unit
//   std::shared_ptr<fsdp::ShardedModel> sharded = fsdp::fully_shard(model.ptr(), rt.world_group, {});
//   fsdp::optim::AdamW opt({/*lr=*/1e-2});
//   opt.add_shards(sharded->shards());
//   at::Tensor loss;
//   for (int step = 0; step < 20; ++step) {
//     at::Tensor x = torch::randn({8, 16}), y = torch::zeros({8, 16});
//     loss = model->forward(x, y);  // through the root: each unit is gathered as it runs
//     loss.backward();              // each unit's gradients are reduce-scattered into its shard
//     sharded->clip_grad_norm(1.0);
//     opt.step();                   // updates this rank's shards (fp32 master copies)
//     sharded->zero_grad();
//   }
//
// End of example.
//
// What fully_shard does (docs/design.md, "One training step"):
//  - Every fsdp::nn::Unit boundary chosen by the wrap policy becomes a unit;
//    the others fold into their parent. The root is always a unit.
//  - Each unit owns one flat parameter: its parameters in registration order,
//    flattened, concatenated, padded to a multiple of the shard-group size S.
//    Rank r of the shard group owns the contiguous chunk r (the "shard"),
//    kept in the master dtype (fp32) as the optimizer's copy.
//  - The module's own parameter tensors stay the same objects (same names,
//    same shapes) but become views of the unit's unsharded flat buffer, whose
//    bytes exist only while the unit is unsharded.
//  - Gradients are reduce-scattered (mean over the data-parallel ranks) into
//    gradient shards; the optimizer steps on the shards.
//
// The contract.
//
// Requires (every rank): the same model, built the same way, and the same
// options to fully_shard; the same units run forward and backward in the same
// order (their collectives must match). One training forward (grad mode on),
// then one backward of its result, then the next forward: a second forward
// before backward, an evaluation forward (grad mode off) while a training
// forward's graph awaits backward, a second backward through one graph
// (retain_graph) and backward with create_graph are refused with a UsageError
// before anything is changed. Dropping a forward's result without backward is
// allowed: the graph's destruction ends that iteration. The model is called
// through its root unit only (calling an inner unit on its own is refused).
//
// Parameters: between uses a unit keeps only this rank's shard; reading one
// of its parameters then (outside the model's forward) throws a c10::Error
// naming the parameter. Values: gather_unit, or a checkpoint or export.
// Parameters with one copy per rank (NO_SHARD, a one-rank shard group in the
// master dtype) stay readable.
//
// Threads: a ShardedModel and its module are used from one thread at a time;
// forward, backward and the between-steps calls below are not synchronized.
// Backward may run the engine's hooks on LibTorch's autograd threads (CUDA);
// they finish before backward() returns.
//
// Ownership and lifetime: fully_shard returns the only owner of the engine's
// state; the module stays the caller's (its parameters are rebound, its
// hooks installed, and the hooks removed when the ShardedModel is
// destroyed; the parameters keep pointing where they point then). The
// ShardedModel must outlive the backward of every forward it
// ran: backward through a graph whose ShardedModel is gone is a UsageError
// (the graph holds the engine weakly); dropping such a graph is fine.
// ShardRef tensors alias the engine's shards and stay valid as long as the
// ShardedModel.
//
// Collective calls: fully_shard, forward, backward, grad_norm, clip_grad_norm,
// gather_unit (and checkpoint saves and loads) are collective: every rank of
// the group must call them, in the same order. The others are local.
//
// Errors: bad options or misuse: UsageError (what was wrong, the values, the
// fix), thrown on the rank that saw it, the model unchanged. A forward that
// throws (e.g. a shape error in the module) leaves the model as if it had not
// run. A failed collective (a rank died or timed out: comm's Failure) leaves
// the model unusable: destroy it; the job has to restart (from a checkpoint).
//
// "Between steps" below: not during a forward or a backward (UsageError).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/recompute.h"
#include "fsdp/nn/unit.h"

namespace fsdp {

// What is sharded, and when parameters are gathered (PyTorch's ShardingStrategy).
enum class ShardingStrategy {
  kFullShard,    // parameters resharded after forward and after backward
  kShardGradOp,  // parameters stay unsharded from forward to the end of backward
  kNoShard,      // everything replicated; gradients all-reduced (DDP)
  kHybridShard,  // FULL_SHARD within a shard group, replicated across groups
};
const char* to_string(ShardingStrategy s);  // "full", "grad-op", "none", "hybrid"
// "full" | "grad-op" | "none" | "hybrid" (also PyTorch's FULL_SHARD etc.).
ShardingStrategy parse_sharding_strategy(const std::string& s);

// When backward gathers the previous unit's parameters: not ahead, before the
// current unit's gradient computation (kPre), or after it (kPost).
enum class BackwardPrefetch { kNone, kPre, kPost };
const char* to_string(BackwardPrefetch p);  // "none", "pre", "post"
BackwardPrefetch parse_backward_prefetch(const std::string& s);  // "none" | "pre" | "post"

// Which marked boundaries become their own unit.
struct WrapPolicy {
  // The rule.
  enum class Kind {
    kEveryUnit,  // every fsdp::nn::Unit in the model
    kByType,     // Units whose inner type is in `types`
    kSize,       // a Unit whose not-yet-wrapped parameters reach min_num_params
    kRootOnly,   // the whole model is one unit
  };
  Kind kind = Kind::kEveryUnit;         // the rule
  std::vector<std::type_index> types;   // kByType: the inner types that become units
  int64_t min_num_params = 0;           // kSize: the threshold

  // Every Unit.
  static WrapPolicy every_unit() { return {}; }
  // Units of these inner types, e.g. {typeid(BlockImpl)}.
  static WrapPolicy by_type(std::vector<std::type_index> t) { return {Kind::kByType, std::move(t), 0}; }
  // Units whose not yet wrapped parameters number at least n.
  static WrapPolicy size_based(int64_t n) { return {Kind::kSize, {}, n}; }
  // The whole model as one unit.
  static WrapPolicy root_only() { return {Kind::kRootOnly, {}, 0}; }
};

// The command line's wrap policies: "block" (every boundary whose inner type
// is `block_type`), "size:N" (size-based, N parameters), "root" (one unit),
// "all" (every boundary). UsageError naming --wrap for anything else.
WrapPolicy parse_wrap_policy(const std::string& spec, std::type_index block_type);
// Its words back: "block" (any kByType), "size:N", "root", "all".
std::string to_string(const WrapPolicy& p);

// Dtypes of the copies FSDP keeps. The sharded master copy is what the
// optimizer updates: float32 normally; bfloat16 for pure-bf16 training (with
// optim::AdamW's Kahan-compensated bf16 mode, so small updates are not lost).
struct MixedPrecision {
  at::ScalarType param_dtype = at::kFloat;   // unsharded parameters, hence compute and activations
  at::ScalarType reduce_dtype = at::kFloat;  // gradient communication
  at::ScalarType buffer_dtype = at::kFloat;  // module buffers (not sharded)
  at::ScalarType master_dtype = at::kFloat;  // parameter and gradient shards
  // A unit's floating-point forward outputs are cast to this dtype (FSDP2's
  // output_dtype); none: left as computed.
  std::optional<at::ScalarType> output_dtype;
  // A unit's floating-point tensor inputs are cast to param_dtype (FSDP2's
  // cast_forward_inputs).
  bool cast_forward_inputs = true;

  // The command line's presets: "fp32", "bf16" (bf16 params, fp32 reduce),
  // "fp16" (fp16 params, fp32 reduce; use a gradient scaler), "bf16-pure"
  // (bf16 everywhere, bf16 master shards). UsageError for other names.
  static MixedPrecision preset(const std::string& name);
  // The preset these dtypes are ("fp32", ...), its reduce dtype aside (set on
  // its own); "" when they are no preset's.
  std::string preset_name() const;
};

// The dtype words of the presets: "fp32" | "bf16" | "fp16"; UsageError naming
// `what` for another.
at::ScalarType parse_dtype_word(const std::string& s, const char* what);
// parse_dtype_word's word for `t`; "?" for a dtype that has none.
const char* dtype_word(at::ScalarType t);

// What a shard group's collectives put on the wire (docs/compression.md
// states each format's numerical contract). kNative: the tensors' own dtype
// (the param dtype for all-gathers, the reduce dtype for reduce-scatters).
enum class WireFormat {
  kNative,
  kBf16,  // bfloat16, rounded to nearest even; all-gathered parameters are widened on arrival,
          // reduced gradients summed in fp32
  kInt8,  // 8-bit integers with one fp32 scale per block of elements (CPU process group)
};
const char* to_string(WireFormat f);  // "native", "bf16", "int8"
WireFormat parse_wire_format(const std::string& s, const char* what);  // "native" | "bf16" | "int8"

// Compressed collectives (Note [Wire formats] in src/fsdp/compressed_collectives.cpp).
// The master shards and the optimizer stay in the master dtype; only the
// bytes between ranks change. NO_SHARD's all-reduce and HYBRID's replica
// all-reduce are not compressed. kInt8, and a compressed reduce-scatter, need
// the CPU process group.
struct CommCompression {
  // Parameter all-gathers: kBf16 gathers bf16 while compute stays in
  // param_dtype (with param_dtype bf16 it is the native gather); kInt8
  // quantizes each block to nearest, and every rank dequantizes every chunk,
  // its own included, so all compute with the same values.
  WireFormat all_gather = WireFormat::kNative;
  // Gradient reduce-scatters: each rank's contribution is encoded (kBf16:
  // nearest even; kInt8: stochastic rounding, unbiased, no per-rank state),
  // and the owner sums the decoded contributions in fp32 in rank order.
  WireFormat reduce_scatter = WireFormat::kNative;
  int64_t block_size = 256;  // kInt8: elements per scale (4 / block_size extra bytes per element)
  // True when either collective is compressed.
  bool any() const { return all_gather != WireFormat::kNative || reduce_scatter != WireFormat::kNative; }
};

// After a unit's forward (FSDP2's reshard_after_forward, bool or int): keep
// its unsharded parameters (false), free them (true), or keep a shard of them
// over groups of `group` consecutive ranks of the shard group, so that
// backward gathers over those ranks only (an int: ZeRO++'s hpZ, e.g. the
// ranks of one node). Parameters gathered again in backward are the bits
// forward used.
struct ReshardAfterForward {
  bool reshard = true;  // false: kept unsharded until the unit's post-backward
  int group = 0;        // > 0: keep a shard over groups of this many ranks
  ReshardAfterForward(bool r = true) : reshard(r) {}  // NOLINT: as FSDP2 takes a bool
  // FSDP2's int: 1 is false and the shard-group size is true (as FSDP2 treats
  // them); otherwise it must divide the shard-group size (UsageError when
  // sharding).
  static ReshardAfterForward to_group(int ranks) {
    ReshardAfterForward r(true);
    r.group = ranks;
    return r;
  }
};
// "default" (nullopt: the strategy's) | "true" | "false" | N >= 1 (to_group(N));
// `what` names the option in the error.
std::optional<ReshardAfterForward> parse_reshard_after_forward(const std::string& s, const char* what);
// Its words back: "default", "true", "false" or N.
std::string to_string(const std::optional<ReshardAfterForward>& r);

// The options of one fully_shard call of FSDP2, for the units an override
// selects (FsdpOptions::unit_overrides). Unset fields keep the model's.
struct UnitOptions {
  std::optional<ReshardAfterForward> reshard_after_forward;  // after its forward (FSDP2's per-call argument)
  // Its dtypes (FSDP2's per-module MixedPrecisionPolicy); master_dtype and
  // buffer_dtype must be the model's.
  std::optional<MixedPrecision> mixed_precision;
  std::optional<bool> cpu_offload;  // its shards in host memory (FSDP2's per-module CPUOffloadPolicy)
  // Units (by name, "" the root) this unit's pre-forward / pre-backward
  // gathers after its own wait; replaces the implicit prefetch for it (FSDP2's
  // set_modules_to_forward_prefetch / set_modules_to_backward_prefetch).
  std::optional<std::vector<std::string>> forward_prefetch;   // gathered after its pre-forward wait
  std::optional<std::vector<std::string>> backward_prefetch;  // gathered after its pre-backward wait
};

// Which units UnitOptions apply to: every unit named (exactly; "" the root) or
// whose inner type is listed.
struct UnitOverride {
  std::vector<std::string> names;      // units by name ("" the root)
  std::vector<std::type_index> types;  // units by inner module type, e.g. typeid(BlockImpl)
  UnitOptions options;                 // what they get
};

// The options of fully_shard: the same on every rank.
struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  // what is sharded
  WrapPolicy wrap = WrapPolicy::every_unit();                 // which Unit marks become units
  // HYBRID_SHARD: ranks per shard group (consecutive ranks). 0: LOCAL_WORLD_SIZE.
  int hybrid_shard_size = 0;
  // Every unit but the root (FSDP2's fully_shard argument): unset follows the
  // strategy (FULL_SHARD, HYBRID_SHARD: true; SHARD_GRAD_OP: false). HYBRID
  // with false is FSDP1's _HYBRID_SHARD_ZERO2 (ZeRO-2 inside each shard group).
  std::optional<ReshardAfterForward> reshard_after_forward;
  // Per-unit options, applied in order (a later override wins per field);
  // the root keeps its parameters after forward unless an override says so.
  std::vector<UnitOverride> unit_overrides;
  // Parameters left out of sharding (FSDP2's ignored_params; FSDP1's
  // ignored_modules: list their parameters): they stay the module's own
  // tensors, never gathered, freed or reduced — their gradients are each
  // rank's own, and the caller optimizes them. They must be materialized.
  std::vector<at::Tensor> ignored_params;
  MixedPrecision mixed_precision;                               // dtypes of the copies kept
  CommCompression compression;                                  // what the collectives send
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;  // gather the previous unit early in backward
  bool forward_prefetch = false;                                // gather the next unit early in forward
  // At most this many all-gathers issued ahead of use (prefetches). >= 1.
  int limit_all_gathers = 2;
  // Keep parameter and gradient shards (hence optimizer state, which the
  // optimizer allocates beside them) in host memory — page-locked when CUDA is
  // present — while unsharded parameters live on `device`. The optimizer step
  // then runs on the host.
  bool cpu_offload = false;
  // With CPU offload on CUDA: page-locked host shards (FSDP2's
  // CPUOffloadPolicy(pin_memory)); false saves pinned memory, copies then block.
  bool pin_memory = true;
  // Activation checkpointing: units whose inner type is listed (or every
  // non-root unit) keep only their inputs in forward and recompute their
  // forward in backward. Only units without nested units can be checkpointed.
  std::vector<std::type_index> checkpoint_types;
  bool checkpoint_all_units = false;  // checkpoint every non-root unit (whatever checkpoint_types says)
  // What a checkpointed unit's backward recomputes (nn/recompute.h): kTail
  // (the default) re-runs its forward up to the products the model marks as
  // its tail, whose backward then runs without them — the gradients of kFull,
  // bit for bit, with fewer products; kFull re-runs everything; kSelective
  // also keeps the products and attention outputs the model marks
  // (ShardedModel::checkpoint_kept_bytes) and recomputes the rest.
  nn::RecomputePolicy checkpoint_policy = nn::RecomputePolicy::kTail;
  // Keep the checkpointed units' saved inputs (and what kSelective keeps) in
  // host memory (GPU runs): blocking copies, a host wait per unit each way.
  bool offload_checkpoint_inputs = false;
  // Parameters on the meta device are materialized shard by shard with this
  // rule (fsdp::nn::init_slice); required when the model was built on meta.
  nn::InitRuleFn init_rule;
  uint64_t seed = 0;  // init_rule's seed
  // Broadcast rank 0's parameter values before sharding: rank 0's parameters
  // must be materialized; the other ranks' may be on the meta device (only
  // rank 0 then needs memory for, or files of, the whole model).
  bool sync_module_states = false;
  // Device the unsharded parameters live on (CPU for the tcp group).
  at::Device device = at::kCPU;
  // Unsharded parameters and gradients (and reduce-dtype copies, reduction
  // scratch) come from one allocation made by fully_shard, sized by
  // plan_sharding's step bound: peak memory is what the plan says, and no
  // unsharded buffer goes through the caching allocator during a step. Always
  // so on CUDA; on the CPU only when set (the host default, mmap'd blocks
  // per unit, keeps less resident between steps); set it there to check the
  // pool without a GPU. UnshardedMemory reports the pool's use.
  bool unsharded_pool = false;
};

// The optimizer's view of one flat parameter's shard (ShardedModel::units()).
struct ShardRef {
  std::string unit_name;  // "" for the root
  at::Tensor param;       // (n) the local shard: master dtype, updated in place by the optimizer; a
                          // frozen entry holds the param dtype (Note [Frozen shards in the param dtype])
  at::Tensor grad;        // (n) master dtype, reduced gradient (zeros when none arrived);
                          // undefined for a frozen flat parameter
  bool trainable = true;  // false: frozen parameters (requires_grad false): no gradient, no optimizer state
};

// Per-parameter placement, for checkpoints and HF export.
struct ParamPlacement {
  std::string name;              // fully qualified, as in named_parameters()
  std::vector<int64_t> shape;    // as the module declares it
  int64_t flat_offset = 0;       // offset in the unit's unpadded flat parameter
  int64_t numel = 0;             // elements (the product of shape)
};

// One flat parameter of a unit. A unit's parameters are laid out in two flat
// parameters when some of them are frozen (requires_grad false when
// fully_shard runs): its trainable ones, then its frozen ones, listed as two
// entries with the unit's name. A frozen flat parameter is gathered for
// compute like any other, but has no gradient buffers, no reduction and no
// optimizer state (Note [Frozen parameters] in src/fsdp/unit.cpp). A unit
// without frozen parameters has one entry, trainable; one without trainable
// parameters has only its frozen entry.
struct UnitInfo {
  std::string name;              // "" for the root
  std::string type_name;         // the unit's inner module type (UnitBase::inner_type_name)
  bool trainable = true;         // false: this entry holds the unit's frozen parameters
  int64_t numel = 0;             // unpadded
  int64_t padded_numel = 0;      // multiple of the shard-group size
  int64_t shard_numel = 0;       // padded_numel / shard-group size
  int64_t shard_offset = 0;      // this rank's first element in the padded flat
  bool checkpointed = false;     // recomputed in backward (activation checkpointing)
  std::vector<ParamPlacement> params;  // its parameters, in the flat parameter's order
};

// The units among `entries` (ShardedModel::units(), ShardingPlan::units): a
// unit's trainable and frozen entries, which are consecutive, count once.
int64_t count_units(const std::vector<UnitInfo>& entries);

// Where the engine's bytes live (for logs and tests; the optimizer's state
// lives beside the shards it updates).
struct MemoryPlacement {
  std::string what;    // "parameter shards", "gradient shards", "unsharded parameters (resident)", ...
  std::string device;  // "cpu", "cuda:0"
  int64_t bytes = 0;    // their size
  bool pinned = false;  // page-locked host memory (CPU offload with CUDA present)
};

// The engine's own count of the buffers it allocates for a step beyond the
// resident shards (Note [Unsharded memory] in src/fsdp/plan.cpp), in bytes.
struct UnshardedBytes {
  int64_t params = 0;       // unsharded parameters (param dtype)
  int64_t grads = 0;        // unsharded gradients while they are computed (param dtype)
  int64_t reductions = 0;   // gradients in flight to a reduction: reduce-dtype copies,
                            // and reduction outputs that cannot land in the gradient shard
  int64_t accumulated = 0;  // gradients kept across micro-batches without synchronization
  int64_t total() const { return params + grads + reductions + accumulated; }  // all four
};

// ShardedModel::unsharded_memory(): the unsharded buffers held now and at the peak.
struct UnshardedMemory {
  UnshardedBytes now;      // held at this moment
  UnshardedBytes at_peak;  // what was held when the total peaked
  int64_t peak = 0;        // the largest total since the last reset (or since fully_shard)
  // The preallocated pool (FsdpOptions::unsharded_pool; always on CUDA), zeros without one.
  int64_t pool_capacity = 0;   // bytes allocated by fully_shard
  int64_t pool_peak = 0;       // the most of them in use at once since the last reset (sizes rounded up)
  int64_t pool_reclaims = 0;   // reductions finished early because the pool was too fragmented to place a buffer
  int64_t pool_overflows = 0;  // buffers the pool could not hold, taken from the device allocator instead
};

// ShardedModel::take_step_counters(): bytes this rank's collectives moved (comm::CommCounters).
struct StepCounters {
  int64_t allgather_bytes = 0;       // parameter all-gathers
  int64_t reduce_scatter_bytes = 0;  // gradient reduce-scatters
  int64_t allreduce_bytes = 0;       // all-reduces (NO_SHARD, HYBRID replicas, norms)
};

class ShardedModel;
namespace detail {
class ShardedModelImpl;
ShardedModelImpl& impl_of(ShardedModel& m);  // the engine's state (tests and library internals)
}

// FSDP2's AllGather (a Comm): a unit's all-gather done by user code
// (ShardedModel::set_custom_all_gather).
class AllGatherComm {
 public:
  virtual ~AllGatherComm() = default;
  // The all-gather's output buffer — the unit's unsharded parameters (which
  // view it) — `numel` elements of `dtype` on `device`, 1-D and contiguous.
  // Default: at::empty. Called at every gather.
  virtual at::Tensor allocate(int64_t numel, at::ScalarType dtype, at::Device device);
  // Gathers every rank's `input` (this rank's chunk of `output`, already
  // filled) into `output` over `group`. Returns the work the engine waits for
  // before the parameters are read (null: done).
  virtual comm::WorkPtr operator()(const at::Tensor& output, const at::Tensor& input, comm::ProcessGroup& group) = 0;
};

// FSDP2's ReduceScatter (a Comm): a unit's gradient reduce-scatter done by
// user code (ShardedModel::set_custom_reduce_scatter).
class ReduceScatterComm {
 public:
  virtual ~ReduceScatterComm() = default;
  // The reduction's input (the unit's gradients in the reduce dtype, copied
  // in) and output (its shard of them): `numel` elements of `dtype` on
  // `device`. Default: at::empty. Called at every reduction, twice. Both are
  // counted in ShardedModel::unsharded_memory(), not in plan_sharding's bound.
  virtual at::Tensor allocate(int64_t numel, at::ScalarType dtype, at::Device device);
  // Reduces `input` (group.size() chunks of output's size) with `op` over
  // `group`, this rank's chunk into `output`. Returns the work the engine
  // waits for (null: done).
  virtual comm::WorkPtr operator()(const at::Tensor& output, const at::Tensor& input, comm::ProcessGroup& group,
                                   comm::ReduceOp op) = 0;
};

// ShardedModel::unshard(unit, async): the gather of one unit in flight. Valid
// while its ShardedModel lives.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  // Waits for the gather: the unit's parameters are readable afterwards. The
  // unit's next pre-forward waits for it anyway when nobody did. Idempotent.
  void wait();

 private:
  friend class ShardedModel;
  UnshardHandle(detail::ShardedModelImpl* impl, int unit) : impl_(impl), unit_(unit) {}
  detail::ShardedModelImpl* impl_ = nullptr;  // null: nothing to wait for
  int unit_ = -1;
};

// ShardedModel::summon_full_params: every unit's parameters gathered (and so
// readable through the module) while this object lives; resharded when it is
// destroyed, after writing what was changed into the shards (writeback; each
// rank its own chunk). It must not outlive its ShardedModel; its destruction
// is local.
class FullParams {
 public:
  FullParams(FullParams&& other) noexcept;  // the scope moves; the moved-from one reshards nothing
  FullParams& operator=(FullParams&&) = delete;
  FullParams(const FullParams&) = delete;
  ~FullParams();  // writes back (if asked) and reshards every unit

 private:
  friend class ShardedModel;
  FullParams(detail::ShardedModelImpl* impl, bool writeback) : impl_(impl), writeback_(writeback) {}
  detail::ShardedModelImpl* impl_;
  bool writeback_;
};

// A model sharded by fully_shard: the engine's state (units, flat parameters,
// shards, hooks). See "The contract" at the top of this file.
class ShardedModel {
 public:
  ~ShardedModel();  // removes the hooks; the module's parameters keep pointing where they point

  // Local shards and their gradients, one per entry of units(), in that
  // order (frozen entries included, marked !trainable). Local.
  std::vector<ShardRef> shards() const;
  // Drops accumulated gradients (no memset: the next reduction overwrites).
  // Local; between steps or between a forward and its backward. Requires: no
  // gradients held without synchronization (run the synchronized backward).
  void zero_grad();
  // false: the next backward passes keep unsharded gradients locally and skip
  // communication (like PyTorch's no_sync); true again before the last
  // micro-batch. Memory cost while off: one unsharded gradient buffer per unit
  // (the full model's gradients in param dtype) stays resident.
  void set_requires_gradient_sync(bool sync);

  // ---- FSDP2's per-module settings (FSDPModule's setters) ------------------
  // Each acts on the unit named `unit` ("" the root) and, with `recurse`, the
  // units nested in it (from the root: every unit). Local, between steps, and
  // the same on every rank (they change which collectives run). A name that is
  // no unit's: UsageError listing the units.
  void set_requires_gradient_sync(bool sync, const std::string& unit, bool recurse = true);
  // Free (true) or keep the unit's parameters after each forward call.
  void set_reshard_after_forward(bool reshard, const std::string& unit = "", bool recurse = true);
  // false: the unit stays unsharded after its backward, into the next forward
  // (no gather there; for gradient accumulation — set it back before the
  // optimizer step changes the shards).
  void set_reshard_after_backward(bool reshard, const std::string& unit = "", bool recurse = true);
  // HYBRID: false reduce-scatters inside the shard group but skips the
  // all-reduce across replicas, summing the results aside until a backward
  // with it on (gradient accumulation across replicas once per step).
  void set_requires_all_reduce(bool all_reduce, const std::string& unit = "", bool recurse = true);
  // false: the unit's backward does not need its parameters (e.g. an
  // embedding): not gathered in backward. Not recursive (as FSDP2).
  void set_unshard_in_backward(bool unshard, const std::string& unit);
  // false: the end of this backward leaves gradient reductions in flight; they
  // finish at the next forward, or when this model reads or changes gradients
  // (grad_norm, clip_grad_norm, zero_grad, gather_unit, state dicts). For
  // micro-batches: an optimizer step needs a backward with it true first.
  void set_is_last_backward(bool last);
  // The units `unit` gathers after its own pre-forward (pre-backward) wait,
  // replacing the implicit prefetch for it; empty: back to the implicit one.
  void set_modules_to_forward_prefetch(const std::string& unit, const std::vector<std::string>& units);
  void set_modules_to_backward_prefetch(const std::string& unit,
                                        const std::vector<std::string>& units);  // the same in backward

  // ---- reductions: factors and hooks (FSDP2's) -----------------------------
  // Gradients are summed over the data-parallel ranks and divided by
  // `factor` (default: their number, a mean). <= 0: back to the default.
  void set_gradient_divide_factor(double factor, const std::string& unit = "", bool recurse = true);
  // Only sum reductions on the wire; the division happens before (fp16: part
  // of it) and after, locally (FSDP2's set_force_sum_reduction_for_comms).
  void set_force_sum_reduction_for_comms(bool enable, const std::string& unit = "", bool recurse = true);
  // The unit's all-gather / reduce-scatter done by `comm` (null: the engine's own).
  void set_custom_all_gather(std::shared_ptr<AllGatherComm> comm, const std::string& unit = "", bool recurse = true);
  void set_custom_reduce_scatter(std::shared_ptr<ReduceScatterComm> comm, const std::string& unit = "",
                                 bool recurse = true);  // the same for the reduce-scatter
  // Called with the unit's reduced gradient shard (reduce dtype) after its
  // reduce-scatter, or after the all-reduce across replicas (HYBRID), before
  // the final division (force-sum): e.g. an all-reduce over another group.
  // Empty: none.
  void set_all_reduce_hook(std::function<void(at::Tensor& reduce_output)> hook, const std::string& unit = "",
                           bool recurse = true);

  // ---- entry points besides the root's forward ------------------------------
  // Gathers `unit`'s parameters (collective over its shard group: every rank
  // calls it); async: returns at once, the handle (or the unit's next
  // pre-forward) waits. Between steps; the unit's policy frees them again
  // after its next forward, or reshard() does.
  UnshardHandle unshard(const std::string& unit, bool async_op = false);
  // Frees `unit`'s unsharded parameters (waits for a gather in flight). Local.
  void reshard(const std::string& unit);
  // Every unit gathered, in unit order (collective), for reading (or, with
  // writeback, changing) the module's parameters in place until the returned
  // object is destroyed; then each rank writes its chunk back into its
  // shards (writeback) and every unit is resharded. Parameters are in the
  // param dtype: writeback requires it to be the master dtype. Between steps.
  FullParams summon_full_params(bool writeback = false);

  // Global L2 norm of the gradients over the whole model (every rank gets the
  // same value; replicas are not counted twice). Collective; between steps.
  double grad_norm();
  // Scales gradients so that their global norm is at most max_norm, like
  // torch.nn.utils.clip_grad_norm_ (coef = max_norm / (norm + 1e-6), capped
  // at 1). Returns the norm before clipping.
  double clip_grad_norm(double max_norm);
  // grad_norm() without waiting for the value: a (1) float64 tensor on the
  // gradients' device — no host synchronization on CUDA (Note [Norm on the
  // device] in src/fsdp/api.cpp). Collective; between steps.
  at::Tensor grad_norm_tensor();
  // clip_grad_norm() without waiting: the norm as grad_norm_tensor() returns
  // it, the clipping coefficient computed on the device too. Collective;
  // between steps.
  at::Tensor clip_grad_norm_tensor(double max_norm);

  // Layout and this rank's placement: one entry per flat parameter (a unit
  // with frozen and trainable parameters has two; see UnitInfo).
  const std::vector<UnitInfo>& units() const;
  std::vector<MemoryPlacement> memory_placement() const;  // where the engine's bytes live
  // Bytes this rank communicated since the last call (and resets them).
  StepCounters take_step_counters();
  // The unsharded buffers this rank holds and has held at most (the engine's
  // ledger: every allocation and release of them goes through it), and the
  // start of a new peak. ShardingPlan::step_unsharded_bytes bounds `peak`,
  // except for what a custom reduce-scatter's allocate returns: the plan is
  // made from FsdpOptions alone, and that comm's input and output buffers (the
  // unit's gradients and its shard of them, in the reduce dtype) are counted
  // here even where the engine's own reduction would copy or hold nothing.
  UnshardedMemory unsharded_memory() const;
  void reset_unsharded_peak();  // unsharded_memory().peak starts again from what is held now
  // Bytes activation checkpointing holds now beyond the units' inputs: what
  // FsdpOptions::checkpoint_policy kSelective keeps from forward until the
  // unit's recompute (0 under kFull and kTail).
  int64_t checkpoint_kept_bytes() const;

  // Full (unpadded) flat parameter of entry `u` of units(), gathered to every rank of the
  // shard group, in the master dtype (fp32; bf16 for pure-bf16 training).
  // Collective over the shard group; between steps. The result is a new tensor.
  at::Tensor gather_unit(size_t u);
  // Writes `full` (entry `u`'s unpadded flat values, any float dtype) into this
  // rank's shard. Local; between steps.
  void load_unit(size_t u, const at::Tensor& full);

  const comm::ProcessGroupPtr& shard_group() const;      // the ranks that share one copy of the parameters
  const comm::ProcessGroupPtr& replicate_group() const;  // null unless hybrid
  const FsdpOptions& options() const;                    // as given to fully_shard
  // A multi-line description: units, sizes, padding, strategy.
  std::string describe() const;

 private:
  friend detail::ShardedModelImpl& detail::impl_of(ShardedModel&);
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
  int64_t trainable_parameters = 0;  // of them, not frozen
  // Resident on every rank for the whole run (host memory with CPU offload):
  int64_t param_shard_bytes = 0;  // master shards, master dtype
  int64_t grad_shard_bytes = 0;   // reduced gradient shards, master dtype (trainable entries)
  int64_t optimizer_bytes = 0;    // AdamW exp_avg + exp_avg_sq beside the trainable shards
  // Unsharded buffers on the compute device while a step runs; see
  // Note [Unsharded memory] in src/fsdp/plan.cpp for the schedule behind it:
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
  std::string describe() const;  // a multi-line description (what fsdp-inspect prints)
};
// See ShardingPlan. `optimizer_state_dtype`: AdamW's moments (optimizer_bytes).
ShardingPlan plan_sharding(const std::shared_ptr<nn::UnitBase>& root, int world_size, int rank,
                           const FsdpOptions& options, at::ScalarType optimizer_state_dtype = at::kFloat);

// Shards `root` over `world` (every rank calls it with the same model and
// options). HYBRID_SHARD builds shard and replicate subgroups of `world`.
// The returned object is the engine's only owner: it must outlive the
// backward of every forward it ran (see "The contract" above). A program
// holding a c10d backend passes it instead of `world`: fsdp/c10d.h.
std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>& root,
                                          const comm::ProcessGroupPtr& world, const FsdpOptions& options);

}  // namespace fsdp

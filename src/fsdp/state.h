// Engine state: ShardedUnit (one per unit) and ShardedModelImpl (the root
// state shared by all units of one model).
//
// Note [Unit lifecycle]
// Forward:   pre_forward  -> unshard (all-gather issued), prefetch next, wait
//            run the inner forward (or a checkpointed recompute wrapper)
//            post_forward -> reshard (per the unit's policy), attach the
//                            pre-backward identity to outputs
// Backward:  pre_backward -> unshard + wait, point .grad at full_grad, prefetch
//            (BACKWARD_PRE) the unit that ran before this one in forward
//            every parameter's AccumulateGrad post-hook counts down; at zero:
//            post_backward -> reshard, issue the reduction of full_grad,
//            prefetch (BACKWARD_POST)
//            finish_reduce -> (later) wait, fold into grad_shard, free full_grad
// End of backward (queued callback): reduce every unit that ran forward but
// was not reduced (unused parameters), in unit order on every rank so the
// collectives match; wait for all reductions; reshard everything.
// Which of these happen when is decided by the step schedule (schedule.h,
// Note [Step schedule]): the root asks its StepScheduler at every hook and
// executes the events it returns with the primitives of ShardedUnit below,
// each of which asserts the state it requires — so the engine's states and the
// schedule's agree, or the step stops at the first difference.
//
// Every state below is a named enum; each change goes through transition_to(),
// which refuses an illegal one with both state names (an internal error: a
// user's misuse is refused earlier, with a UsageError saying what to do).
// Three operations are idempotent by design, and return early when already
// done: unshard (a prefetch may have issued it), reshard (end of backward
// sweeps every unit) and pre_backward (a unit whose outputs reach backward
// through several nodes). The others assert the state they require.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/collectives.h"
#include "fsdp/common/error.h"
#include "fsdp/flat_param.h"
#include "fsdp/fsdp.h"
#include "fsdp/plan.h"
#include "fsdp/schedule.h"

namespace fsdp::detail {

class ShardedModelImpl;

// Whether this rank holds the unsharded parameters.
enum class ShardState {
  kSharded,             // only shard_ is resident; full_ has no bytes
  kShardedPostForward,  // full_ freed, a post-forward shard over a smaller group resident (hpZ)
  kUnsharding,          // full_ allocated, all-gather in flight: do not read it yet
  kUnsharded,           // full_ holds every parameter's current value
};

// Where the unit is in the current iteration's backward.
enum class GradState {
  kIdle,         // no backward yet this iteration
  kCollecting,   // pre_backward ran; gradients are landing in full_grad
  kReduceIssued, // reduction in flight
  kDone,         // reduced into grad_shard, or kept unsharded (no_sync)
};

// What this rank holds of the unit's gradients since the last zero_grad,
// across iterations (GradState is within one).
enum class GradHold {
  kNone,       // nothing: grad_shard's bytes are stale (ensure_grad_valid zeroes them)
  kSharded,    // grad_shard holds the reduced gradients: what the optimizer reads
  kUnsharded,  // gradients of backward passes without synchronization, unsharded:
               // in full_grad, or in `accumulated_` when the reduce dtype is wider
               // (Note [Accumulating without synchronization]); grad_shard stale
  kBoth,       // kSharded, plus unsynchronized gradients since: the next
               // synchronized backward reduces them and adds them to grad_shard
};

// The root's phase of a training iteration (grad mode on; evaluation forwards
// under NoGradGuard leave it kIdle).
enum class TrainingState {
  kIdle,              // between iterations: nothing gathered for a step, no reduction in flight
  kForward,           // between the root's pre-forward and post-forward
  kAwaitingBackward,  // forward done; its graph is alive and holds the root unsharded
  kBackward,          // the autograd engine runs the graph; end_of_backward is queued
};

const char* to_string(ShardState s);
const char* to_string(GradState s);
const char* to_string(GradHold s);
const char* to_string(TrainingState s);
bool legal(ShardState from, ShardState to);
bool legal(GradState from, GradState to);
bool legal(GradHold from, GradHold to);
bool legal(TrainingState from, TrainingState to);

// Moves `state` to `to`, asserting that the change is legal; `owner` names
// the unit (or "the root") in the assertion.
template <class State>
void transition_to(State& state, State to, const char* what, std::string_view owner) {
  FSDP_ASSERT(legal(state, to), owner, ": illegal state change ", to_string(state), " -> ", to_string(to), " in ",
              what);
  state = to;
}

// How a unit's collectives run beyond the model's options (ShardedModel's
// setters: FSDP2's per-module settings).
struct UnitComms {
  double divide_factor = 0;  // <= 0: the number of data-parallel ranks (a mean)
  bool force_sum = false;    // only sums on the wire (Note [Reduction arithmetic] in collectives.cpp)
  std::shared_ptr<AllGatherComm> all_gather;          // null: the shard group's
  std::shared_ptr<ReduceScatterComm> reduce_scatter;  // null: the shard group's
  std::function<void(at::Tensor&)> all_reduce_hook;   // empty: none
};

class ShardedUnit : public nn::UnitHooks, public std::enable_shared_from_this<ShardedUnit> {
 public:
  // `flat`: the unit's trainable parameters (possibly none); `frozen`: its
  // frozen ones, null when there are none (Note [Frozen parameters]).
  // `contains_units`: other units are nested inside this one.
  ShardedUnit(ShardedModelImpl* root, size_t index, std::string name, std::string type_name, bool is_root,
              bool checkpoint, std::unique_ptr<FlatParam> flat, std::unique_ptr<FlatParam> frozen,
              bool contains_units, bool replicated, const MixedPrecision& mixed_precision);

  std::vector<at::Tensor> run(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) override;

  // ---- the schedule's primitives (EventKind; the root executes them) -----
  // kUnshard / kPrefetch. Requires: state() == kSharded. Issues the
  // all-gather (from the post-forward shard over `from` when it holds one);
  // replicated: casts the master copy (kUnsharded at once).
  void unshard(const comm::ProcessGroupPtr& from);
  // kWait. Requires: state() == kUnsharding. Afterwards kUnsharded.
  void wait_for_unshard();
  // kReshard. Requires: state() != kUnsharding, and something to free.
  // `group` > 0 keeps a shard over `groups` (hpZ); `rank_in_group` is this
  // rank's place in it.
  void reshard(int group, int rank_in_group);
  // kPreBackward: gradient buffer (zeros, or what no_sync kept), counting of
  // the gradients to come. Requires: grad_state() == kIdle.
  void begin_backward();
  // kPostBackward. Requires: grad_state() == kCollecting.
  void end_backward();
  // kReduce: issue the reduction of full_grad. Requires: kCollecting, trains().
  // `all_reduce`: HYBRID's all-reduce across replicas follows at the finish
  // (else the shard group's result is summed aside: set_requires_all_reduce).
  void reduce(bool all_reduce);
  // kKeepGrads: no synchronization; keep the gradients unsharded.
  void keep_grads();
  // kFinishReduce: wait for the reduction and fold it into grad_shard; free
  // full_grad. `replicas`: then all-reduce across the replicate group (HYBRID).
  void finish_reduce(bool replicas);

  // From the graph of forward `iteration` (Note [Graph lifetime]).
  void pre_backward(int64_t iteration);
  void on_grad_ready();
  // From the post-backward node on the inputs of a unit without trainable
  // parameters: its backward of forward `iteration` is over.
  void on_inputs_grad_ready(int64_t iteration);

  // Per-iteration reset (called by the root at the start of forward).
  void begin_iteration();
  void register_grad_hooks();

  ShardState state() const { return state_; }
  GradState grad_state() const { return grad_state_; }
  bool ran_forward() const { return ran_forward_; }
  bool is_root() const { return is_root_; }
  bool replicated() const { return replicated_; }
  size_t index() const { return index_; }
  const std::string& name() const { return name_; }
  const std::string& type_name() const { return type_name_; }
  bool checkpointed() const { return checkpoint_; }
  const MixedPrecision& mixed_precision() const { return mp_; }
  UnitComms& comms() { return comms_; }
  // Shard-group results summed without the all-reduce across replicas (HYBRID), or undefined.
  const at::Tensor& partial_grads() const { return partial_; }
  FlatParam& flat() { return *flat_; }  // the trainable parameters (possibly none)
  FlatParam* frozen() { return frozen_.get(); }  // null: no frozen parameters
  // Whether any parameter gets gradients: else no gradient buffer, reduction
  // or hook exists for this unit.
  bool trains() const { return !flat_->params().empty(); }
  // How the unit learns that its backward is over (Note [Frozen parameters]).
  enum class BackwardEnd {
    kGrads,           // every parameter's gradient arrived (no frozen parameters)
    kGradsAndInputs,  // that, and the gradients of its inputs were computed
    kEndOfBackward,   // only at the end of backward (frozen parameters in a unit with nested units)
  };
  ShardedModelImpl& root() const { return *root_; }

  // Gradients held unsharded across micro-batches (no_sync).
  bool holds_unsharded_grads() const { return grad_hold_ == GradHold::kUnsharded || grad_hold_ == GradHold::kBoth; }
  // zero_grad. Requires: !holds_unsharded_grads().
  void clear_grad() { transition_to(grad_hold_, GradHold::kNone, "zero_grad", label()); }
  // Makes grad_shard meaningful for the optimizer: zeros when nothing landed.
  void ensure_grad_valid();
  // "unit 'layers.0'", "the root unit": for messages.
  const std::string& label() const { return label_; }

 private:
  std::vector<at::Tensor> run_eval(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs);
  std::vector<at::Tensor> cast_inputs(const std::vector<at::Tensor>& inputs) const;
  // Whether begin_backward keeps what full_grad holds (else zeros).
  bool keep_full_grad() const;
  // Whether gradients kept without synchronization are summed in `accumulated_`
  // (the reduce dtype is wider than full_grad's) rather than in full_grad.
  bool accumulates_wider() const;
  // One gradient (or the inputs' node) arrived: post_backward after the last.
  void count_down();
  bool grad_shard_holds_sum() const { return grad_hold_ == GradHold::kSharded || grad_hold_ == GradHold::kBoth; }

  ShardedModelImpl* root_;  // not owned; outlives every unit
  size_t index_;
  std::string name_;
  std::string type_name_;
  bool is_root_;
  bool checkpoint_;
  std::unique_ptr<FlatParam> flat_;
  std::unique_ptr<FlatParam> frozen_;  // null: none
  BackwardEnd backward_end_;
  bool replicated_;     // its shard is (or casts to) its parameters: nothing gathered or freed
  MixedPrecision mp_;   // its dtypes (the model's, or its override)
  UnitComms comms_;
  std::string label_;  // built once: transitions name the unit without building a string each time

  ShardState state_ = ShardState::kSharded;
  GradState grad_state_ = GradState::kIdle;
  GradHold grad_hold_ = GradHold::kNone;
  AllGather gather_;            // in flight while kUnsharding (trainable parameters)
  AllGather gather_frozen_;     // in flight while kUnsharding (frozen parameters)
  Reduction reduction_;         // in flight while kReduceIssued

  bool ran_forward_ = false;
  int pending_grads_ = 0;       // gradients (and the inputs' node) still to come this backward
  bool inputs_hooked_ = false;  // this iteration's forward attached the post-backward node to its inputs
  int64_t backward_begin_us_ = -1;  // trace: when this iteration's backward of the unit began (-1: not traced)
  at::Tensor accumulated_;      // (Np) reduce dtype: unsynchronized gradients, when wider than full_grad's
  at::Tensor partial_;          // (n) reduce dtype: reduce-scattered, not yet all-reduced across replicas
  ReduceSpec spec_;             // of the reduction in flight
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps hooks alive

  friend class ShardedModelImpl;
};

class ShardedModelImpl {
 public:
  ShardedModelImpl(const std::shared_ptr<nn::UnitBase>& root, const comm::ProcessGroupPtr& world,
                   const FsdpOptions& options);
  ~ShardedModelImpl();

  // Called by units at their hooks: each asks the schedule and executes what
  // it returns (Note [Step schedule] in schedule.cpp).
  void on_pre_forward(ShardedUnit& u);
  void on_post_forward(ShardedUnit& u);  // the unit's policy: reshard
  void on_forward_done(ShardedUnit& u);  // after its outputs are hooked (root: the iteration's state)
  void on_eval_pre_forward(ShardedUnit& u);
  void on_eval_post_forward(ShardedUnit& u);
  // The root's forward threw: reshard everything and return to kIdle, so the
  // model is as if that forward had never run.
  void on_forward_failed();
  void on_pre_backward(ShardedUnit& u);
  void on_post_backward(ShardedUnit& u);
  void end_of_backward();
  // Records a compute marker (kForward, kPostForward, kRecompute) of unit `u` in the trace.
  void note(EventKind kind, const ShardedUnit& u);

  // Note [Graph lifetime]
  // Every pre-backward node of an iteration's graph counts itself here while
  // it lives. When the last one is destroyed before backward started, the
  // graph was dropped (a loss computed and discarded): the iteration is over,
  // and its buffers (the root's unsharded parameters) are released. Nodes of
  // an earlier iteration (`iteration` differs) no longer count.
  int64_t iteration() const { return iteration_; }
  void on_graph_node_created(int64_t iteration);
  void on_graph_node_destroyed(int64_t iteration);
  // UsageError unless a backward may run through the graph of `iteration`
  // now: the latest forward's, once, without create_graph.
  void check_backward(int64_t iteration) const;

  // Every unit keeps all its parameters resident and reduces with an all-reduce:
  // NO_SHARD, or a shard group of one rank whose shard can serve as the
  // parameters themselves. See Note [One-rank shard groups].
  bool replicated() const { return replicated_; }
  MemoryLedger& ledger() { return *ledger_; }
  // The preallocated pool of unsharded buffers; null where there is none (the
  // CPU by default). See Note [Preallocated pool].
  UnshardedPool* pool() const { return pool_.get(); }

  // Public API (ShardedModel forwards here).
  std::vector<ShardRef> shards() const;
  void zero_grad();
  void set_requires_gradient_sync(bool sync);
  // The units `unit` names, with the ones nested in it when `recurse`; `what`
  // names the setter in the UsageError for an unknown name.
  std::vector<int> select_units(const std::string& unit, bool recurse, const char* what) const;
  // Between steps: the schedule's policy of the selected units changed.
  void set_policy(const std::string& unit, bool recurse, const char* what,
                  const std::function<void(UnitPolicy&)>& change);
  void set_comms(const std::string& unit, bool recurse, const char* what,
                 const std::function<void(ShardedUnit&)>& change);
  void set_is_last_backward(bool last);
  // Reductions a backward left in flight (is_last_backward false) finished,
  // before gradients are read or changed.
  void drain_reductions();
  void user_unshard(int u, bool wait);
  void user_wait(int u);
  void user_reshard(int u);
  void summon(bool writeback);
  void unsummon(bool writeback);
  double grad_norm();
  double clip_grad_norm(double max_norm);
  at::Tensor grad_norm_tensor();
  at::Tensor clip_grad_norm_tensor(double max_norm);
  const std::vector<UnitInfo>& units() const { return infos_; }
  std::vector<MemoryPlacement> memory_placement() const;
  StepCounters take_step_counters();
  UnshardedMemory unsharded_memory() const;
  void reset_unsharded_peak();
  // What checkpointed units keep from forward (ShardedModel::checkpoint_kept_bytes):
  // each checkpointed call adds its kept bytes and takes them off when released.
  const std::shared_ptr<std::atomic<int64_t>>& kept_bytes() const { return kept_bytes_; }
  at::Tensor gather_unit(size_t u);
  void load_unit(size_t u, const at::Tensor& full);
  std::string describe() const;

  const FsdpOptions& options() const { return options_; }
  const std::shared_ptr<nn::UnitBase>& root_module() const { return root_module_; }
  const comm::ProcessGroupPtr& world() const { return world_; }
  // Between steps, nothing in flight (for state dicts and other between-steps work).
  void between_steps(const char* what) {
    assert_idle(what);
    FSDP_CHECK(state_ == TrainingState::kIdle, what, ": the previous forward's graph awaits backward; call it "
               "between steps");
    drain_reductions();
  }
  const comm::ProcessGroupPtr& shard_group() const { return shard_group_; }
  const comm::ProcessGroupPtr& replicate_group() const { return replicate_group_; }
  StepScheduler& scheduler() { return *sched_; }
  // The units, root first (pre-order), and their names (for the schedule's messages).
  const std::vector<std::shared_ptr<ShardedUnit>>& sharded_units() const { return units_; }
  const std::vector<std::string>& unit_names() const { return unit_names_; }

 private:
  // Construction in steps (Note [Engine construction] in model.cpp).
  void build_units();
  // Which units keep a single resident copy; sets replicated_.
  std::vector<bool> plan_replicated_units(const std::vector<PlannedUnit>& plan, int shard_size);
  // The unsharded buffers' pool (CUDA, or FsdpOptions::unsharded_pool) or the
  // host buffer cache (CPU), named in `fpo`.
  void make_buffer_pool(const std::vector<PlannedUnit>& plan, int shard_size, FlatParamOptions& fpo);
  // The pool's reclaim: finishes the oldest reduction issued; false if none.
  bool reclaim_oldest_reduction();
  std::unique_ptr<FlatParam> make_flat(const FlatParamOptions& fpo, const PlannedUnit& pu, bool replicated,
                                       std::vector<FlatParam::Source> sources, bool trainable);
  // Unit `k` of the plan (its sources are moved out): flat parameters, hooks,
  // its entries in infos_/entries_, its hpZ group's slot.
  void make_unit(std::vector<PlannedUnit>& plan, size_t k, bool replicated, const FlatParamOptions& fpo,
                 int post_forward_group);
  void place_buffers();
  void assert_idle(const char* what) const;
  // Executes the schedule's events in order, then clears them.
  void execute(std::vector<Event>& events);
  void run_events(const std::vector<Event>& events);
  // The group a unit gathers from after a post-forward reshard over `size` ranks.
  const comm::ProcessGroupPtr& post_forward_group(int size) const;

  FsdpOptions options_;
  std::shared_ptr<nn::UnitBase> root_module_;
  comm::ProcessGroupPtr world_;
  comm::ProcessGroupPtr shard_group_;
  comm::ProcessGroupPtr replicate_group_;  // HYBRID only
  std::map<int, comm::ProcessGroupPtr> post_forward_groups_;  // reshard_after_forward = int: size -> group

  std::vector<std::shared_ptr<ShardedUnit>> units_;  // pre-order, root first
  std::vector<std::shared_ptr<nn::UnitBase>> unit_modules_;
  std::vector<std::string> unit_names_;
  // One per flat parameter: infos_[i] describes entries_[i] (ShardedModel::units()).
  struct Entry {
    ShardedUnit* unit;
    FlatParam* flat;
  };
  std::vector<UnitInfo> infos_;
  std::vector<Entry> entries_;

  bool replicated_ = false;
  std::unique_ptr<StepScheduler> sched_;
  std::vector<Event> actions_;  // reused by the hooks
  std::vector<int> reclaimed_;  // reductions the pool finished early, whose scheduled finish is still to come
  const std::vector<Event>* executing_ = nullptr;  // the events execute() is running, and where it is
  size_t executing_pos_ = 0;
  std::shared_ptr<internals::HostBufferPool> host_pool_;  // CPU: unsharded buffers
  std::shared_ptr<UnshardedPool> pool_;                   // CUDA (or FsdpOptions::unsharded_pool): unsharded buffers
  std::shared_ptr<std::atomic<int64_t>> kept_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<MemoryLedger> ledger_ = std::make_shared<MemoryLedger>();
  TrainingState state_ = TrainingState::kIdle;
  int64_t iteration_ = 0;                         // training forwards started
  int64_t live_graph_nodes_ = 0;                  // of this iteration (Note [Graph lifetime])

  comm::CommCounters counters_base_shard_;
  comm::CommCounters counters_base_replicate_;
};

}  // namespace fsdp::detail

// The step schedule: what the engine does at each point of a training step,
// and in which order — defined once (Note [Step schedule] in schedule.cpp).
//
// StepScheduler is a state machine over units: at each hook point of a step
// (a unit's pre-forward, post-forward, pre-backward, post-backward, the end of
// backward) it returns the actions to take now, as Events. The engine
// (model.cpp) calls it from the real hooks and executes the actions on real
// units; step_events() drives the same machine through the hook order a
// model's call order predicts and returns every event of the step, which the
// memory plan (plan.cpp: replay_bytes) and the time model (src/plan:
// estimate.cpp) interpret. tests/fsdp/test_schedule.cpp holds the engine's
// traced events to step_events() for every strategy x prefetch x option.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

// What happens to one unit at one point of a step.
enum class EventKind : uint8_t {
  kUnshard,       // all-gather issued for the unit's own use (its pre-forward or pre-backward)
  kPrefetch,      // all-gather issued ahead of its use, from another unit's hook
  kWait,          // its all-gather waited for: the parameters are readable
  kForward,       // one forward call of the unit begins
  kPostForward,   // that call ended
  kReshard,       // its unsharded parameters freed (group > 0: a post-forward shard of them kept)
  kPreBackward,   // backward reached the unit: its gradient buffer is allocated (zeros)
  kRecompute,     // its forward runs again (activation checkpointing)
  kPostBackward,  // its gradients are complete (or the end of backward flushes it)
  kReduce,        // its gradient reduction is issued (reduce-scatter; all-reduce when replicated)
  kKeepGrads,     // no reduction: its gradients stay unsharded (no synchronization)
  kFinishReduce,  // its reduction waited for and folded into the gradient shard
};
const char* to_string(EventKind k);

struct Event {
  EventKind kind = EventKind::kUnshard;
  int unit = 0;  // index into the units (root 0)
  // kReshard: > 0 keeps a shard of the parameters over groups of this many
  // ranks (reshard_after_forward = int, hpZ); kUnshard / kPrefetch: > 0
  // gathers from those groups. 0: the unit's shard group.
  int group = 0;
  bool replicas = false;  // kFinishReduce: the shard group's result is all-reduced across replicas (HSDP)
  bool operator==(const Event& o) const {
    return kind == o.kind && unit == o.unit && group == o.group && replicas == o.replicas;
  }
};
std::string to_string(const Event& e, const std::vector<std::string>& unit_names);

// A unit as the schedule sees it: fixed when the model is sharded.
struct ScheduleUnit {
  bool is_root = false;
  bool replicated = false;      // its parameters are always resident (NO_SHARD, single copy): nothing gathered
  bool trains = false;          // has trainable parameters: gradient buffers and a reduction
  bool hybrid = false;          // its reductions are all-reduced across replicas afterwards (HYBRID)
  bool checkpointed = false;    // recomputed in backward (step_events only)
  bool reduces_at_end = false;  // post-backward only at the end of backward (step_events only;
                                // Note [Frozen parameters] in unit.cpp)
};

// A unit's policy: set when sharding (FsdpOptions, per-unit overrides) and
// changeable between steps (ShardedModel's setters), as FSDP2's per-module state.
struct UnitPolicy {
  bool reshard_after_forward = true;  // free (or shrink, post_forward_group) after each forward call
  int post_forward_group = 0;         // > 0: keep a shard over groups of this many ranks (hpZ)
  bool reshard_after_backward = true; // free after its post-backward (false: kept into the next forward)
  bool unshard_in_backward = true;    // false: its backward does not need its parameters
  bool sync_grads = true;             // reduce its gradients (false: keep them unsharded, no_sync)
  bool all_reduce = true;             // HYBRID: all-reduce across replicas (false: only reduce-scatter)
  bool explicit_forward = false;      // forward_prefetch replaces the implicit forward prefetch
  bool explicit_backward = false;     // backward_prefetch replaces the implicit backward prefetch
  std::vector<int> forward_prefetch;   // units gathered after this unit's pre-forward wait
  std::vector<int> backward_prefetch;  // units gathered after this unit's pre-backward wait
};

// The model-wide scheduling options (from FsdpOptions).
struct ScheduleOptions {
  enum class Backward { kNone, kPre, kPost };
  Backward backward_prefetch = Backward::kPre;  // implicit: the unit that ran before, in forward order
  bool forward_prefetch = false;                // implicit: the unit that ran after, in the previous forward
  int limit_all_gathers = 2;                    // implicit prefetches outstanding at most
  int max_inflight_reductions = 2;              // reductions in flight at most (each holds a gradient buffer)
  bool is_last_backward = true;                 // false: the end of backward leaves reductions in flight
};

// The state machine. Hooks append the actions to take now to `out`, in order.
class StepScheduler {
 public:
  StepScheduler(std::vector<ScheduleUnit> units, std::vector<UnitPolicy> policy, ScheduleOptions options);

  const ScheduleOptions& options() const { return options_; }
  ScheduleOptions& options() { return options_; }
  const UnitPolicy& policy(int u) const { return policy_[size_t(u)]; }
  UnitPolicy& policy(int u) { return policy_[size_t(u)]; }
  const ScheduleUnit& unit(int u) const { return units_[size_t(u)]; }
  int size() const { return static_cast<int>(units_.size()); }

  // The root's pre-forward of a training iteration: reductions left in flight
  // (is_last_backward false) are finished, the forward order restarts.
  void begin_iteration(std::vector<Event>& out);
  void pre_forward(int u, std::vector<Event>& out);
  void post_forward(int u, std::vector<Event>& out);
  // Once per unit and iteration.
  void pre_backward(int u, std::vector<Event>& out);
  // Once per unit and iteration, from its last gradient (or the end of backward).
  void post_backward(int u, std::vector<Event>& out);
  // Flushes what did not complete (in unit order), finishes reductions,
  // reshards what the policy does not keep.
  void end_of_backward(std::vector<Event>& out);
  // A forward ended without backward (dropped graph, failure, nothing needed
  // grad): every unit resharded, prefetches forgotten.
  void release_iteration(std::vector<Event>& out);

  // Evaluation forward (grad mode off): gather, run, free again.
  void eval_pre_forward(int u, std::vector<Event>& out);
  void eval_post_forward(int u, std::vector<Event>& out);

  // Outside the hooks: finish the oldest reduction (a fragmented pool), every
  // reduction, or gather / free a unit for the user (ShardedModel::unshard).
  bool finish_oldest(std::vector<Event>& out);
  void finish_all(std::vector<Event>& out);
  // Finishes unit u's reduction now (a fragmented pool reclaiming it early).
  void finish_now(int u, std::vector<Event>& out);
  // Reductions in flight, oldest first.
  const std::vector<int>& in_flight() const { return in_flight_; }
  void unshard(int u, std::vector<Event>& out);
  void wait(int u, std::vector<Event>& out);
  void reshard(int u, std::vector<Event>& out);

  // What the machine believes (the engine asserts its units agree).
  enum class Gather : uint8_t { kSharded, kInFlight, kGathered };
  Gather gather_state(int u) const { return state_[size_t(u)].gather; }
  bool holds_unsynced_grads(int u) const { return state_[size_t(u)].holds; }
  int reductions_in_flight() const { return static_cast<int>(in_flight_.size()); }
  // Units in this iteration's forward order (a unit called twice listed twice).
  const std::vector<int>& forward_order() const { return order_; }

 private:
  struct UnitState {
    Gather gather = Gather::kSharded;
    int from_group = 0;       // > 0: a post-forward shard over groups of this size is held
    bool prefetched = false;  // gathered ahead by an implicit prefetch, not yet consumed
    bool ran_forward = false;
    enum class Bwd : uint8_t { kIdle, kCollecting, kDone } bwd = Bwd::kIdle;
    bool holds = false;      // unsynchronized gradients held across iterations
    bool in_flight = false;  // a reduction of it is in flight
    bool eval_gathered = false;
  };

  void issue(int u, EventKind kind, std::vector<Event>& out);
  void implicit_prefetch(int u, std::vector<Event>& out);
  void consume(int u);
  void free(int u, int group, std::vector<Event>& out);
  void finish(int u, std::vector<Event>& out);
  int previous_in_forward(int u) const;
  int next_in_previous_forward(int u) const;

  std::vector<ScheduleUnit> units_;
  std::vector<UnitPolicy> policy_;
  ScheduleOptions options_;
  std::vector<UnitState> state_;
  int prefetched_pending_ = 0;
  std::vector<int> in_flight_;  // reductions, oldest first
  std::vector<int> order_;      // this iteration's forward order
  std::vector<int> prev_order_; // the last complete one
  std::vector<int> pos_;        // unit -> its last position in order_ (-1)
  std::vector<int> prev_pos_;   // unit -> its last position in prev_order_ (-1)
};

// Which step the schedule is generated for.
enum class StepPhase {
  kSynchronized,  // training forward and backward, gradients reduced (per UnitPolicy::sync_grads)
  kAccumulating,  // training forward and backward without synchronization (no_sync micro-batches)
  kEvaluation,    // forward with grad mode off
};

// The one schedule: every event of one step of `units` called in the order
// `calls` gives (indices; 0, the root, marks where the root's own parameters
// are first used: Note [Unsharded memory] in plan.cpp), in a steady state
// (the previous step's forward order is this one's). Units other than the
// root are assumed not to enclose each other; the step before was of phase
// `after` (default: the same). `gathered_at_start` (when not null) receives,
// per unit, whether its parameters are unsharded when the step begins (a
// policy that keeps them after backward).
std::vector<Event> step_events(const std::vector<ScheduleUnit>& units, const std::vector<UnitPolicy>& policy,
                               const std::vector<int>& calls, const ScheduleOptions& options, StepPhase phase,
                               std::vector<bool>* gathered_at_start = nullptr,
                               std::optional<StepPhase> after = std::nullopt);

}  // namespace fsdp::detail

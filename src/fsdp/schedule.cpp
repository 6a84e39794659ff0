// The step schedule (schedule.h). See Note [Step schedule].
#include "fsdp/schedule.h"

#include <algorithm>

#include "fsdp/common/error.h"

namespace fsdp::detail {

// Note [Step schedule]
// One state machine decides, for every unit, when its parameters are
// gathered, waited for and freed, when its gradients are reduced and when
// those reductions are finished. Its rules, per hook point:
// - pre-forward (training): the unit's own all-gather unless it is gathered
//   or in flight; the implicit forward prefetch (FsdpOptions::forward_prefetch:
//   the unit after it in the previous iteration's forward order, at most
//   limit_all_gathers implicit prefetches outstanding); the wait; then the
//   unit's explicit forward prefetch list (FSDP2's set_modules_to_forward_prefetch
//   runs after the wait).
// - post-forward: reshard when the unit's policy says so — fully, or to a
//   shard over a smaller group (reshard_after_forward = int, hpZ).
// - pre-backward: its all-gather (unless unshard_in_backward is off); the
//   implicit BACKWARD_PRE prefetch of the unit that ran before it in this
//   forward (never the root); the wait; the gradient buffer; the explicit
//   backward list. An explicit list replaces the implicit prefetch.
// - post-backward: reshard (reshard_after_backward), then reduce or keep the
//   gradients (sync_grads); more than max_inflight_reductions in flight: the
//   oldest is finished; BACKWARD_POST then prefetches the unit before it.
// - end of backward: units that ran forward (or hold unsynchronized gradients)
//   but did not complete are flushed in unit order (every rank issues the same
//   collectives), every reduction is finished (unless is_last_backward is off:
//   then at the next pre-forward), and every unit is resharded but those whose
//   policy keeps them after backward.
// The engine calls these hooks as autograd reaches them and executes what they
// return; step_events() calls them in the order a model's call order predicts.
// Replicated units (NO_SHARD, a single copy) go through the same states — their
// "gather" is a cast of the master copy, or nothing — and are never freed early.

const char* to_string(EventKind k) {
  switch (k) {
    case EventKind::kUnshard: return "unshard";
    case EventKind::kPrefetch: return "prefetch";
    case EventKind::kWait: return "wait";
    case EventKind::kForward: return "forward";
    case EventKind::kPostForward: return "post_forward";
    case EventKind::kReshard: return "reshard";
    case EventKind::kPreBackward: return "pre_backward";
    case EventKind::kRecompute: return "recompute";
    case EventKind::kPostBackward: return "post_backward";
    case EventKind::kReduce: return "reduce";
    case EventKind::kKeepGrads: return "keep_grads";
    case EventKind::kFinishReduce: return "finish_reduce";
  }
  return "?";
}

std::string to_string(const Event& e, const std::vector<std::string>& unit_names) {
  std::string s = to_string(e.kind);
  s += " ";
  const std::string& n = e.unit >= 0 && size_t(e.unit) < unit_names.size() ? unit_names[size_t(e.unit)] : "?";
  s += n.empty() ? "<root>" : n;
  if (e.group > 0) s += " (group " + std::to_string(e.group) + ")";
  if (e.replicas) s += " (+replicas)";
  return s;
}

StepScheduler::StepScheduler(std::vector<ScheduleUnit> units, std::vector<UnitPolicy> policy,
                             ScheduleOptions options)
    : units_(std::move(units)), policy_(std::move(policy)), options_(options) {
  FSDP_ASSERT(!units_.empty() && units_[0].is_root && policy_.size() == units_.size(),
              "a schedule needs the root first and one policy per unit");
  state_.resize(units_.size());
  pos_.assign(units_.size(), -1);
  prev_pos_.assign(units_.size(), -1);
}

void StepScheduler::issue(int u, EventKind kind, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  FSDP_ASSERT(s.gather == Gather::kSharded, "schedule: unit ", u, " gathered twice");
  out.push_back({kind, u, s.from_group, false});
  s.gather = units_[size_t(u)].replicated ? Gather::kGathered : Gather::kInFlight;
}

void StepScheduler::consume(int u) {
  UnitState& s = state_[size_t(u)];
  if (!s.prefetched) return;
  s.prefetched = false;
  --prefetched_pending_;
}

// The implicit prefetches (forward prefetch, BACKWARD_PRE / POST): counted
// against limit_all_gathers until the unit's own hook consumes them.
void StepScheduler::implicit_prefetch(int u, std::vector<Event>& out) {
  if (u < 0 || state_[size_t(u)].gather != Gather::kSharded) return;
  if (prefetched_pending_ >= options_.limit_all_gathers) return;
  issue(u, EventKind::kPrefetch, out);
  state_[size_t(u)].prefetched = true;
  ++prefetched_pending_;
}

void StepScheduler::wait(int u, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  if (s.gather != Gather::kInFlight) return;
  out.push_back({EventKind::kWait, u, 0, false});
  s.gather = Gather::kGathered;
  s.from_group = 0;  // the post-forward shard went into the gathered buffer
}

void StepScheduler::free(int u, int group, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  if (s.gather == Gather::kSharded && (group > 0 || s.from_group == 0)) return;
  wait(u, out);  // never free what a collective still writes
  out.push_back({EventKind::kReshard, u, group, false});
  s.gather = Gather::kSharded;
  s.from_group = group;
}

void StepScheduler::unshard(int u, std::vector<Event>& out) {
  if (state_[size_t(u)].gather == Gather::kSharded) issue(u, EventKind::kUnshard, out);
}

void StepScheduler::reshard(int u, std::vector<Event>& out) { free(u, 0, out); }

int StepScheduler::previous_in_forward(int u) const {
  // Never the root: it encloses every other unit, so its backward began first.
  const int k = pos_[size_t(u)];
  return k > 1 ? order_[size_t(k - 1)] : -1;
}

int StepScheduler::next_in_previous_forward(int u) const {
  const int k = prev_pos_[size_t(u)];
  return k >= 0 && size_t(k + 1) < prev_order_.size() ? prev_order_[size_t(k + 1)] : -1;
}

void StepScheduler::begin_iteration(std::vector<Event>& out) {
  finish_all(out);  // left in flight by a backward that was not the last
  if (!order_.empty()) {
    prev_order_ = order_;
    std::fill(prev_pos_.begin(), prev_pos_.end(), -1);
    for (size_t k = 0; k < prev_order_.size(); ++k) prev_pos_[size_t(prev_order_[k])] = static_cast<int>(k);
  }
  order_.clear();
  std::fill(pos_.begin(), pos_.end(), -1);
  for (UnitState& s : state_) {
    s.ran_forward = false;
    s.bwd = UnitState::Bwd::kIdle;
  }
}

void StepScheduler::pre_forward(int u, std::vector<Event>& out) {
  consume(u);
  state_[size_t(u)].ran_forward = true;
  pos_[size_t(u)] = static_cast<int>(order_.size());
  order_.push_back(u);
  unshard(u, out);
  const UnitPolicy& p = policy_[size_t(u)];
  if (options_.forward_prefetch && !p.explicit_forward) implicit_prefetch(next_in_previous_forward(u), out);
  wait(u, out);
  for (int v : p.forward_prefetch) unshard(v, out);
}

void StepScheduler::post_forward(int u, std::vector<Event>& out) {
  const UnitPolicy& p = policy_[size_t(u)];
  if (units_[size_t(u)].replicated || !p.reshard_after_forward) return;
  free(u, p.post_forward_group, out);
}

void StepScheduler::pre_backward(int u, std::vector<Event>& out) {
  consume(u);
  const UnitPolicy& p = policy_[size_t(u)];
  const bool needs_params = p.unshard_in_backward || units_[size_t(u)].replicated;
  if (needs_params) unshard(u, out);
  if (options_.backward_prefetch == ScheduleOptions::Backward::kPre && !p.explicit_backward) {
    const int v = previous_in_forward(u);
    if (v >= 0 && (policy_[size_t(v)].unshard_in_backward || units_[size_t(v)].replicated)) {
      implicit_prefetch(v, out);
    }
  }
  if (needs_params) wait(u, out);
  out.push_back({EventKind::kPreBackward, u, 0, false});
  state_[size_t(u)].bwd = UnitState::Bwd::kCollecting;
  for (int v : p.backward_prefetch) {
    if (policy_[size_t(v)].unshard_in_backward || units_[size_t(v)].replicated) unshard(v, out);
  }
}

void StepScheduler::post_backward(int u, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  FSDP_ASSERT(s.bwd == UnitState::Bwd::kCollecting, "schedule: post-backward of unit ", u, " before its pre-backward");
  const UnitPolicy& p = policy_[size_t(u)];
  out.push_back({EventKind::kPostBackward, u, 0, false});
  s.bwd = UnitState::Bwd::kDone;
  // Every gradient has arrived: nothing reads the parameters any more.
  if (!units_[size_t(u)].replicated && p.reshard_after_backward) free(u, 0, out);
  if (units_[size_t(u)].trains) {
    if (!p.sync_grads) {
      out.push_back({EventKind::kKeepGrads, u, 0, false});
      s.holds = true;
    } else {
      out.push_back({EventKind::kReduce, u, 0, false});
      s.holds = false;
      s.in_flight = true;
      in_flight_.push_back(u);
      while (static_cast<int>(in_flight_.size()) > options_.max_inflight_reductions) finish_oldest(out);
    }
  }
  if (options_.backward_prefetch == ScheduleOptions::Backward::kPost && !p.explicit_backward) {
    const int v = previous_in_forward(u);
    if (v >= 0 && (policy_[size_t(v)].unshard_in_backward || units_[size_t(v)].replicated)) {
      implicit_prefetch(v, out);
    }
  }
}

void StepScheduler::finish(int u, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  FSDP_ASSERT(s.in_flight, "schedule: no reduction of unit ", u, " in flight");
  s.in_flight = false;
  out.push_back({EventKind::kFinishReduce, u, 0, units_[size_t(u)].hybrid && policy_[size_t(u)].all_reduce});
}

bool StepScheduler::finish_oldest(std::vector<Event>& out) {
  if (in_flight_.empty()) return false;
  const int u = in_flight_.front();
  in_flight_.erase(in_flight_.begin());
  finish(u, out);
  return true;
}

void StepScheduler::finish_now(int u, std::vector<Event>& out) {
  const auto it = std::find(in_flight_.begin(), in_flight_.end(), u);
  FSDP_ASSERT(it != in_flight_.end(), "schedule: no reduction of unit ", u, " in flight");
  in_flight_.erase(it);
  finish(u, out);
}

void StepScheduler::finish_all(std::vector<Event>& out) {
  while (finish_oldest(out)) {
  }
}

void StepScheduler::end_of_backward(std::vector<Event>& out) {
  for (int u = 0; u < size(); ++u) {
    UnitState& s = state_[size_t(u)];
    if (s.bwd == UnitState::Bwd::kDone || !(s.ran_forward || s.holds)) continue;
    if (s.bwd == UnitState::Bwd::kIdle) {
      // No gradient reached it this time: it contributes zeros (or what it
      // holds), so every rank issues the same collectives.
      out.push_back({EventKind::kPreBackward, u, 0, false});
      s.bwd = UnitState::Bwd::kCollecting;
    }
    post_backward(u, out);
  }
  if (options_.is_last_backward) finish_all(out);
  for (int u = 0; u < size(); ++u) {
    wait(u, out);  // a prefetch nothing consumed
    if (units_[size_t(u)].replicated || policy_[size_t(u)].reshard_after_backward) free(u, 0, out);
    state_[size_t(u)].prefetched = false;
  }
  prefetched_pending_ = 0;
}

void StepScheduler::release_iteration(std::vector<Event>& out) {
  for (int u = 0; u < size(); ++u) {
    free(u, 0, out);
    state_[size_t(u)].prefetched = false;
  }
  prefetched_pending_ = 0;
}

void StepScheduler::eval_pre_forward(int u, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  s.eval_gathered = s.gather == Gather::kSharded;
  unshard(u, out);
  wait(u, out);
}

void StepScheduler::eval_post_forward(int u, std::vector<Event>& out) {
  UnitState& s = state_[size_t(u)];
  if (!s.eval_gathered) return;
  s.eval_gathered = false;
  free(u, 0, out);
}

namespace {

void simulate_step(StepScheduler& s, const std::vector<ScheduleUnit>& units, const std::vector<int>& calls,
                   StepPhase phase, std::vector<Event>& out) {
  const auto mark = [&](EventKind k, int u) { out.push_back({k, u, 0, false}); };
  if (phase == StepPhase::kEvaluation) {
    s.eval_pre_forward(0, out);
    mark(EventKind::kForward, 0);
    for (int c : calls) {
      if (c == 0) continue;
      s.eval_pre_forward(c, out);
      mark(EventKind::kForward, c);
      mark(EventKind::kPostForward, c);
      s.eval_post_forward(c, out);
    }
    mark(EventKind::kPostForward, 0);
    s.eval_post_forward(0, out);
    return;
  }
  s.begin_iteration(out);
  s.pre_forward(0, out);
  mark(EventKind::kForward, 0);
  for (int c : calls) {
    if (c == 0) continue;
    s.pre_forward(c, out);
    mark(EventKind::kForward, c);
    mark(EventKind::kPostForward, c);
    s.post_forward(c, out);
  }
  mark(EventKind::kPostForward, 0);
  s.post_forward(0, out);

  std::vector<int> first(units.size(), -1), last(units.size(), -1);
  for (size_t j = 0; j < calls.size(); ++j) {
    const size_t u = size_t(calls[j]);
    if (first[u] < 0) first[u] = static_cast<int>(j);
    last[u] = static_cast<int>(j);
  }
  s.pre_backward(0, out);  // the root's outputs reach backward first
  for (size_t j = calls.size(); j-- > 0;) {
    const int u = calls[j];
    const bool first_use = static_cast<int>(j) == first[size_t(u)];
    if (u != 0) {
      if (static_cast<int>(j) == last[size_t(u)]) s.pre_backward(u, out);
      if (units[size_t(u)].checkpointed) mark(EventKind::kRecompute, u);
    }
    if (first_use && !units[size_t(u)].reduces_at_end) s.post_backward(u, out);
  }
  s.end_of_backward(out);
}

}  // namespace

std::vector<Event> step_events(const std::vector<ScheduleUnit>& units, const std::vector<UnitPolicy>& policy,
                               const std::vector<int>& calls, const ScheduleOptions& options, StepPhase phase,
                               std::vector<bool>* gathered_at_start, std::optional<StepPhase> after) {
  const StepPhase before = after.value_or(phase);
  std::vector<UnitPolicy> p = policy;
  for (UnitPolicy& x : p) x.sync_grads = x.sync_grads && before != StepPhase::kAccumulating;
  StepScheduler s(units, p, options);
  // A silent step first: the steady state (the previous forward order known to
  // forward prefetch; what a policy keeps across steps).
  std::vector<Event> warmup, out;
  simulate_step(s, units, calls, before, warmup);
  for (int u = 0; u < s.size(); ++u) {
    s.policy(u).sync_grads = policy[size_t(u)].sync_grads && phase != StepPhase::kAccumulating;
  }
  if (gathered_at_start != nullptr) {
    gathered_at_start->assign(units.size(), false);
    for (int u = 0; u < s.size(); ++u) (*gathered_at_start)[size_t(u)] = s.gather_state(u) != StepScheduler::Gather::kSharded;
  }
  simulate_step(s, units, calls, phase, out);
  return out;
}

}  // namespace fsdp::detail

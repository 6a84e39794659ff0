// The step-time model (fsdp/estimate.h): the plan's units, what each costs,
// and the engine's schedule replayed against a cluster's links.
#include "fsdp/estimate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/plan.h"

namespace fsdp {

namespace {

// ---- units ------------------------------------------------------------------------

// A unit of the plan with its entries merged (Note [Frozen parameters] in unit.cpp: a
// unit with frozen and trainable parameters has two entries, gathered together).
struct PlannedCost {
  std::vector<UnitInfo> entries;
  UnitInfo info;             // params of every entry; numel the sum
  int64_t gather_elems = 0;  // padded elements gathered (all entries)
  int64_t reduce_elems = 0;  // padded elements reduced (trainable entries)
  int64_t shard_elems = 0;   // trainable shard elements (the optimizer's)
  UnitCompute compute;
};

std::vector<PlannedCost> merge_units(const ShardingPlan& plan) {
  std::vector<PlannedCost> out;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const UnitInfo& e = plan.units[i];
    if (i == 0 || e.name != plan.units[i - 1].name) {
      PlannedCost c;
      c.info = e;
      c.info.params.clear();
      c.info.numel = 0;
      c.info.trainable = false;
      out.push_back(std::move(c));
    }
    PlannedCost& c = out.back();
    c.entries.push_back(e);
    c.info.params.insert(c.info.params.end(), e.params.begin(), e.params.end());
    c.info.numel += e.numel;
    c.info.trainable = c.info.trainable || e.trainable;
    c.gather_elems += e.padded_numel;
    if (e.trainable) {
      c.reduce_elems += e.padded_numel;
      c.shard_elems += e.shard_numel;
    }
  }
  return out;
}

// ---- collectives ---------------------------------------------------------------------

// The ranks of one process group as the cluster places them.
struct GroupShape {
  int size = 1;     // W
  int nodes = 1;    // nodes it spans
  int per_node = 1; // its ranks on one node (g)
  int sharing = 1;  // groups of its kind with ranks on one node: they use the node's link at once
};

// The group holding rank 0 whose members are 0, stride, 2 stride, ... (size of them).
GroupShape group_shape(int size, int stride, int procs_per_node) {
  GroupShape g;
  g.size = size;
  std::set<int> nodes;
  int on_first = 0;
  for (int k = 0; k < size; ++k) {
    const int node = k * stride / procs_per_node;
    nodes.insert(node);
    on_first += node == 0 ? 1 : 0;
  }
  g.nodes = static_cast<int>(nodes.size());
  g.per_node = on_first;
  // Groups of this kind with ranks on node 0: its ranks there not in this group
  // belong to the others, per_node of them each.
  g.sharing = std::max(1, procs_per_node / std::max(1, on_first));
  return g;
}

enum class Collective { kAllGather, kReduceScatter, kAllReduce };

// Note [Collective volumes]
// A collective of S bytes (the unsharded size) over W ranks spanning n nodes with
// g ranks on each, `sharing` such groups on a node at once:
//  - mesh (our TCP group: each rank sends its piece straight to every peer):
//    all-gather and reduce-scatter move pieces of S/W; a rank sends (W - 1) of
//    them, W - g of those off its node. A node's link carries sharing x g x
//    (S/W) x (W - g); a rank's loopback (g - 1) x S/W. all-reduce is a
//    reduce-scatter then an all-gather (Note [TCP lanes]): twice the bytes.
//  - ring (NCCL; rings over all of a node's NICs): each rank forwards
//    S (W - 1) / W to its neighbour inside the node; a node's link carries
//    sharing x S (W - 1) / W in total when the ring leaves it (n > 1).
//    all-reduce: twice. Latency: one hop per ring step, W - 1 of them.
// The time is the slower of the node's link and a process's intra-node link,
// plus the latency: both run at once (pipelined), the slower one paces it.
double collective_s(Collective op, double bytes, const GroupShape& g, const ClusterSpec& c) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double W = g.size, n = g.nodes, per = g.per_node;
  double inter = 0, intra = 0, latency = 0;
  if (c.algorithm == CollectiveAlgorithm::kMesh) {
    const double piece = bytes / W;
    inter = n > 1 ? g.sharing * per * piece * (W - per) : 0;
    intra = piece * (per - 1);
    latency = n > 1 ? c.inter.latency_s : c.intra.latency_s;
  } else {
    const double along = bytes * (W - 1) / W;
    inter = n > 1 ? g.sharing * along : 0;
    intra = along;
    latency = (W - 1) * (n > 1 ? c.inter.latency_s : c.intra.latency_s);
  }
  double t = std::max(inter > 0 ? inter / c.inter.bytes_per_s : 0.0, intra > 0 ? intra / c.intra.bytes_per_s : 0.0);
  if (op == Collective::kAllReduce) {
    t *= 2;
    latency *= c.algorithm == CollectiveAlgorithm::kRing ? 2 : 1;
  }
  return t + latency;
}

// Bytes one process sends plus receives in a collective of `bytes` (Note [Collective volumes]).
double process_bytes(Collective op, double bytes, const GroupShape& g, const ClusterSpec& c) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double W = g.size;
  const double sent = c.algorithm == CollectiveAlgorithm::kMesh ? bytes / W * (W - 1) : bytes * (W - 1) / W;
  return 2 * sent * (op == Collective::kAllReduce ? 2 : 1);
}

// ---- the network: lanes sharing one link ------------------------------------------------

// Collectives wait in their lane's queue (a lane runs one at a time, in order);
// the heads of the lanes that have started share the network equally (each
// progresses at 1/k of its full rate while k are active). A collective's
// latency is a delay before its bytes flow.
class Network {
 public:
  enum Lane { kGather = 0, kReduce = 1, kReplica = 2, kLanes = 3 };

  // Returns the op's id. `work_s`: its duration alone on the network (latency included).
  int issue(Lane lane, double now, double work_s, double latency_s, std::string what) {
    advance(now);
    Op op;
    op.lane = lane;
    op.issued = std::max(now, now_);
    op.latency = std::min(latency_s, work_s);
    op.remaining = work_s - op.latency;
    op.what = std::move(what);
    ops_.push_back(op);
    const int id = static_cast<int>(ops_.size()) - 1;
    queue_[lane].push_back(id);
    if (queue_[lane].size() == 1) start_head(lane, op.issued);
    return id;
  }

  bool done(int id) const { return ops_[static_cast<size_t>(id)].done_at >= 0; }
  double done_at(int id) const { return ops_[static_cast<size_t>(id)].done_at; }

  // Progresses every op up to `t`.
  void advance(double t) {
    while (now_ < t) {
      if (!step(t)) now_ = t;
    }
  }

  // Runs until op `id` completes; returns its completion time (>= now).
  double run_until(int id, double now) {
    advance(now);
    while (!done(id)) {
      if (!step(std::numeric_limits<double>::infinity())) break;
    }
    FSDP_ASSERT(done(id), "the estimate's network stalled on ", ops_[static_cast<size_t>(id)].what);
    return std::max(now, done_at(id));
  }

  // Time some op was transferring or in its latency (the union), up to now.
  double busy_s() const { return busy_; }
  // Every op with its start and end, for the timeline.
  struct Record {
    int lane;
    std::string what;
    double start, end;
  };
  std::vector<Record> records() const {
    std::vector<Record> out;
    for (const Op& o : ops_) {
      if (o.done_at >= 0) out.push_back({o.lane, o.what, o.started, o.done_at});
    }
    return out;
  }

 private:
  struct Op {
    int lane = 0;
    double issued = 0;
    double started = -1;    // head of its lane from here (latency runs first)
    double latency = 0;
    double remaining = 0;   // seconds of transfer alone on the network
    double done_at = -1;
    std::string what;
  };

  void start_head(int lane, double t) {
    if (queue_[lane].empty()) return;
    Op& o = ops_[static_cast<size_t>(queue_[lane].front())];
    o.started = std::max(t, o.issued);
  }

  // One event step towards `limit`: false when nothing is in progress before it.
  bool step(double limit) {
    // Active: lane heads whose latency has passed; pending: heads still in latency.
    std::vector<int> active;
    double next = limit;
    for (int l = 0; l < kLanes; ++l) {
      if (queue_[l].empty()) continue;
      const int id = queue_[l].front();
      const Op& o = ops_[static_cast<size_t>(id)];
      const double flows_at = o.started + o.latency;
      if (flows_at <= now_ + tolerance(now_)) {
        active.push_back(id);
      } else {
        next = std::min(next, flows_at);
      }
    }
    bool any_head = false;
    for (int l = 0; l < kLanes; ++l) any_head = any_head || !queue_[l].empty();
    if (!any_head) return false;
    const double k = static_cast<double>(active.size());
    for (int id : active) next = std::min(next, now_ + ops_[static_cast<size_t>(id)].remaining * k);
    if (!std::isfinite(next)) return false;
    // A step short of `limit` ends a latency or a transfer (Note [Replay
    // tolerance]): at most two per op. Past a bound the replay is stuck, a bug.
    if (next < limit) {
      FSDP_ASSERT(++steps_ <= kStepsPerOp * (static_cast<int64_t>(ops_.size()) + 1), "the estimate's network replay "
                  "did not converge (", steps_, " events for ", ops_.size(), " collectives at t = ", now_, " s)");
    }
    const double dt = next - now_;
    busy_ += dt;  // a head is in latency or transferring
    for (int id : active) ops_[static_cast<size_t>(id)].remaining -= dt / std::max(k, 1.0);
    now_ = next;
    for (int l = 0; l < kLanes; ++l) {
      if (queue_[l].empty()) continue;
      Op& o = ops_[static_cast<size_t>(queue_[l].front())];
      if (o.started + o.latency <= now_ + tolerance(now_) && o.remaining <= tolerance(now_)) {
        o.done_at = now_;
        queue_[l].pop_front();
        start_head(l, now_);
      }
    }
    return true;
  }

  // Note [Replay tolerance]. Times are doubles; far into a long step (past
  // ~8000 s of simulated time) an absolute 1e-12 s is below a double's
  // resolution, the next event rounds to `now` and the loop never ended
  // (issue 39). Comparisons use a tolerance relative to the clock instead:
  // well above its rounding (1e-12 of it), far below any collective's duration.
  static double tolerance(double t) { return 1e-12 * std::max(1.0, std::abs(t)); }
  static constexpr int64_t kStepsPerOp = 8;

  std::vector<Op> ops_;
  std::deque<int> queue_[kLanes];
  double now_ = 0;
  double busy_ = 0;
  int64_t steps_ = 0;  // events replayed so far (bounded: kStepsPerOp per op)
};

// ---- the schedule, timed ------------------------------------------------------------------

// Note [Estimated schedule]
// The step's events come from the engine's own schedule (detail::step_events,
// Note [Step schedule] in src/fsdp/schedule.cpp): the same gathers, prefetches,
// waits, reshards, reductions and finishes, in the same order, for the model's
// call order and options. This interpreter gives them durations:
//  kUnshard, kPrefetch  an all-gather on the gather lane (over the post-forward
//                       group for hpZ), plus the host CPU it costs (below)
//  kWait                the training thread waits for that all-gather
//  kForward             a unit's forward (its time split over its calls); the
//                       root's own forward is timed at its kPostForward (its
//                       code runs around the others')
//  kPreBackward         the root's own backward (it runs first)
//  kRecompute           activation checkpointing's second forward
//  kPostBackward        a unit's backward (its gradients are complete)
//  kReduce              a reduce-scatter (NO_SHARD: all-reduce) on the reduce lane
//  kFinishReduce        waits for it; HYBRID: then the all-reduce across replicas
//                       on its lane, waited for (collectives.cpp: finish_reduction)
//  step                 gradient norm (one scalar all-reduce), AdamW on the local
//                       shards, the loss all-reduce (after the schedule).
// Micro-batches before the last (--grad-accum) run the accumulating schedule.
// Execution::kHost: the CPU a collective costs this process (host_cpu_s_per_byte x
// the bytes it sends and receives) is spent on the training thread when the
// collective is issued: the cores are taken to be busy with compute, so the
// lanes' copies and the kernel's TCP work come out of it.
// Execution::kDevice (CUDA): the host runs ahead of the compute stream, so the
// all-gathers of the next limit_all_gathers units are issued while a unit computes,
// in forward and (BACKWARD_PRE) in backward: at a unit's kForward (kPreBackward)
// the next gather events of the schedule are issued early, at most that many
// outstanding. Waits order the compute stream after the collective (NCCL), which
// for the model is the same as the host waiting.
class Schedule {
 public:
  // The *_s vectors: each unit's collectives alone on the network; *_cpu_s: the host
  // CPU they cost this process (ClusterSpec::host_cpu_s_per_byte). Gathers from a
  // post-forward group: by group size.
  struct PerUnit {
    std::vector<double> gather_s, reduce_s, replica_s, latency_s, gather_cpu_s, reduce_cpu_s, replica_cpu_s;
    // The engine's casts on the device (ClusterSpec::memory_bytes_per_s): a gather's
    // copy of the shard into the unsharded parameters' dtype, a reduction's copy
    // of the gradient into the master gradient shard.
    std::vector<double> gather_cast_s, reduce_cast_s;
    std::vector<std::map<int, double>> group_gather_s, group_gather_cpu_s;
    std::vector<int> calls;  // forward calls per step
  };
  Schedule(const std::vector<PlannedCost>& units, const FsdpOptions& o, const ClusterSpec& c, const PerUnit& p)
      : u_(units), o_(o), c_(c), gather_s_(p.gather_s), reduce_s_(p.reduce_s), replica_s_(p.replica_s),
        latency_s_(p.latency_s), p_(p) {}

  void micro_batch(const std::vector<detail::Event>& events, bool last) {
    using detail::EventKind;
    const bool device = c_.execution == Execution::kDevice;
    gathered_.assign(u_.size(), -1);
    early_.assign(events.size(), false);
    ahead_.assign(u_.size(), false);
    ahead_count_ = 0;
    pending_.clear();
    record_ = last;
    for (size_t i = 0; i < events.size(); ++i) {
      const detail::Event& e = events[i];
      const size_t k = size_t(e.unit);
      switch (e.kind) {
        case EventKind::kUnshard:
        case EventKind::kPrefetch:
          if (early_[i]) break;  // issued while an earlier unit computed
          gather(k, e.group);
          if (e.kind == EventKind::kPrefetch) mark_ahead(k);
          break;
        case EventKind::kWait:
          if (ahead_[k]) {  // consumed by its own hook
            ahead_[k] = false;
            --ahead_count_;
          }
          wait_gather(k);
          break;
        case EventKind::kForward:
          if (k == 0) break;
          if (device) run_ahead(events, i);
          compute("forward", k, u_[k].compute.forward_s / calls(k), &u_[k].compute.forward, 1 / calls(k));
          break;
        case EventKind::kPostForward:
          if (k == 0) compute("forward", 0, u_[0].compute.forward_s, &u_[0].compute.forward);
          break;
        case EventKind::kReshard: gathered_[k] = -1; break;
        case EventKind::kPreBackward:
          if (k == 0) {
            compute("backward", 0, u_[0].compute.backward_s, &u_[0].compute.backward);
          } else if (device && o_.backward_prefetch == BackwardPrefetch::kPre) {
            run_ahead(events, i);
          }
          break;
        case EventKind::kRecompute: {
          const bool own = u_[k].compute.recompute_s >= 0;
          const double r = own ? u_[k].compute.recompute_s : u_[k].compute.forward_s;
          compute("recompute", k, r / calls(k), own ? &u_[k].compute.recompute : &u_[k].compute.forward, 1 / calls(k));
          break;
        }
        case EventKind::kPostBackward:
          if (k != 0) compute("backward", k, u_[k].compute.backward_s, &u_[k].compute.backward);
          break;
        case EventKind::kReduce: reduce(k); break;
        case EventKind::kKeepGrads: break;
        case EventKind::kFinishReduce: finish(k, e.replicas); break;
      }
    }
  }

  void optimizer(int64_t shard_elems) {
    const double scalar = latency_s_[0];
    wait_comm(net_.issue(Network::kReduce, now_, scalar, scalar, "all_reduce grad norm"), "grad norm");
    compute("optimizer", 0, static_cast<double>(shard_elems) * c_.optimizer_s_per_element);
    wait_comm(net_.issue(Network::kReduce, now_, scalar, scalar, "all_reduce loss"), "loss");
  }

  double now() const { return now_; }
  double compute_s() const { return compute_s_; }
  const ComputeClasses& compute_classes() const { return classes_; }
  double comm_cpu_s() const { return comm_cpu_s_; }
  double optimizer_s() const { return optimizer_s_; }
  double exposed_s() const { return exposed_s_; }
  const Network& network() const { return net_; }
  std::vector<EstimateSpan> timeline() const {
    std::vector<EstimateSpan> out = spans_;
    static const char* kLaneNames[] = {"all_gather", "reduce", "replica"};
    for (const auto& r : net_.records()) {
      if (r.end >= timeline_begin_) out.push_back({kLaneNames[r.lane], r.what, r.start, r.end});
    }
    std::sort(out.begin(), out.end(), [](const EstimateSpan& a, const EstimateSpan& b) { return a.begin_s < b.begin_s; });
    return out;
  }
  void start_timeline() {
    spans_.clear();
    timeline_begin_ = now_;
  }

 private:
  std::string label(size_t k) const { return u_[k].info.name.empty() ? "<root>" : u_[k].info.name; }
  double calls(size_t k) const { return std::max(1, p_.calls[k]); }

  // `split`: the time's classes (of the unit's whole pass), `share` of them spent here.
  void compute(const char* what, size_t k, double s, const ComputeClasses* split = nullptr, double share = 1) {
    if (s <= 0) return;
    if (record_) spans_.push_back({"compute", std::string(what) + " " + label(k), now_, now_ + s});
    now_ += s;
    if (std::string(what) == "optimizer") {
      optimizer_s_ += s;
    } else if (std::string(what) == "comm cpu") {
      comm_cpu_s_ += s;
    } else {
      compute_s_ += s;
      if (std::string(what) == "cast") classes_.memory_s += s;
      if (split != nullptr) classes_ += split->scaled(share);
    }
  }

  void wait_comm(int id, const std::string& what) {
    const double t = net_.run_until(id, now_);
    if (t > now_) {
      if (record_) spans_.push_back({"wait", what, now_, t});
      exposed_s_ += t - now_;
      now_ = t;
    }
  }

  // Issues unit k's all-gather (from a post-forward group of `group` ranks when > 0).
  void gather(size_t k, int group) {
    compute("cast", k, group > 0 ? 0.0 : p_.gather_cast_s[k]);
    double s = gather_s_[k], cpu = p_.gather_cpu_s[k];
    if (group > 0) {
      const auto it = p_.group_gather_s[k].find(group);
      s = it != p_.group_gather_s[k].end() ? it->second : 0;
      cpu = p_.group_gather_cpu_s[k].count(group) > 0 ? p_.group_gather_cpu_s[k].at(group) : 0;
    }
    if (s <= 0) {
      gathered_[k] = -2;  // nothing to move: resident, or a one-rank group
      return;
    }
    gathered_[k] = net_.issue(Network::kGather, now_, s, latency_s_[k], "all_gather " + label(k));
    compute("comm cpu", k, cpu);
  }

  // Execution::kDevice: the host issues the next gathers of the schedule while
  // unit `events[i]` computes, at most limit_all_gathers outstanding.
  void run_ahead(const std::vector<detail::Event>& events, size_t i) {
    using detail::EventKind;
    for (size_t j = i + 1; j < events.size() && ahead_count_ < o_.limit_all_gathers; ++j) {
      const detail::Event& e = events[j];
      if (e.kind == EventKind::kPreBackward && events[i].kind == EventKind::kForward) break;  // forward's end
      if ((e.kind != EventKind::kUnshard && e.kind != EventKind::kPrefetch) || early_[j] || e.unit == 0) continue;
      gather(size_t(e.unit), e.group);
      early_[j] = true;
      mark_ahead(size_t(e.unit));
    }
  }

  void mark_ahead(size_t k) {
    if (ahead_[k]) return;
    ahead_[k] = true;
    ++ahead_count_;
  }

  void wait_gather(size_t k) {
    if (gathered_[k] < 0) return;
    wait_comm(gathered_[k], "wait all_gather " + label(k));
    gathered_[k] = -2;  // gathered: nothing in flight
  }

  void reduce(size_t k) {
    compute("cast", k, p_.reduce_cast_s[k]);
    Pending p;
    p.unit = k;
    if (reduce_s_[k] > 0) p.op = net_.issue(Network::kReduce, now_, reduce_s_[k], latency_s_[k], "reduce " + label(k));
    compute("comm cpu", k, p_.reduce_cpu_s[k]);
    pending_.push_back(p);
  }

  // Waits for unit k's reduction; HYBRID: then its all-reduce across replicas,
  // waited for at once (collectives.cpp: finish_reduction). On CUDA these waits
  // order the compute stream after the collective: compute waits the same way.
  void finish(size_t k, bool replicas) {
    auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.unit == k; });
    if (it == pending_.end()) return;
    const Pending p = *it;
    pending_.erase(it);
    if (p.op >= 0) wait_comm(p.op, "wait reduce " + label(p.unit));
    if (replicas && replica_s_[p.unit] > 0) {
      const int r = net_.issue(Network::kReplica, now_, replica_s_[p.unit], latency_s_[p.unit],
                               "all_reduce (replicas) " + label(p.unit));
      compute("comm cpu", p.unit, p_.replica_cpu_s[p.unit]);
      wait_comm(r, "all_reduce (replicas) " + label(p.unit));
    }
  }

  struct Pending {
    size_t unit = 0;
    int op = -1;
  };

  const std::vector<PlannedCost>& u_;
  const FsdpOptions& o_;
  const ClusterSpec& c_;
  const std::vector<double>& gather_s_;
  const std::vector<double>& reduce_s_;
  const std::vector<double>& replica_s_;
  const std::vector<double>& latency_s_;
  const PerUnit& p_;
  Network net_;
  double now_ = 0;
  double compute_s_ = 0;
  ComputeClasses classes_;
  double comm_cpu_s_ = 0;
  double optimizer_s_ = 0;
  double exposed_s_ = 0;
  std::vector<int> gathered_;  // op id in flight, -1: sharded, -2: gathered
  std::vector<bool> early_;    // events issued ahead (Execution::kDevice)
  std::vector<bool> ahead_;    // units gathered ahead of their own hook, not yet waited for
  int ahead_count_ = 0;
  std::deque<Pending> pending_;
  bool record_ = false;
  std::vector<EstimateSpan> spans_;
  double timeline_begin_ = 0;
};

void check_cluster(const ClusterSpec& c) {
  FSDP_CHECK(c.nodes >= 1, "cluster '", c.name, "': nodes must be >= 1, got ", c.nodes);
  FSDP_CHECK(c.procs_per_node >= 1, "cluster '", c.name, "': procs_per_node (ClusterSpec::procs_per_node) must be "
             ">= 1, got ", c.procs_per_node);
  const int world = c.nodes * c.procs_per_node;
  FSDP_CHECK(world == 1 || c.procs_per_node == 1 || c.intra.bytes_per_s > 0, "cluster '", c.name,
             "': the intra-node rate must be > 0 (intra.gbit_per_s), got ", c.intra.bytes_per_s * 8 / 1e9, " Gbit/s");
  FSDP_CHECK(c.nodes == 1 || c.inter.bytes_per_s > 0, "cluster '", c.name,
             "': the inter-node rate must be > 0 (inter.gbit_per_s), got ", c.inter.bytes_per_s * 8 / 1e9, " Gbit/s");
  FSDP_CHECK(c.intra.latency_s >= 0 && c.inter.latency_s >= 0 && c.optimizer_s_per_element >= 0 &&
                 c.host_cpu_s_per_byte >= 0 &&
                 c.peak_flops >= 0 && c.compute_efficiency >= 0 && c.compute_efficiency <= 1 &&
                 c.matmul_flops >= 0 && c.attention_flops >= 0 && c.memory_bytes_per_s >= 0,
             "cluster '", c.name, "': latencies, the optimizer rate, the peak and the roofline's rates "
             "(matmul_tflops, attention_tflops, memory_gbyte_per_s) must be >= 0 and the compute efficiency in [0, 1]");
}

// The engine's own view of the units: each one's options and the schedule.
struct EngineView {
  std::vector<detail::PlannedUnit> planned;
  std::vector<detail::ScheduleUnit> sched_units;
  std::vector<detail::UnitPolicy> policies;
  std::vector<detail::Event> sync_events;   // a micro-batch that reduces (the last)
  std::vector<detail::Event> accum_events;  // one that accumulates (the others; none without grad_accum > 1)
};

EngineView engine_view(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& o, const ShardingPlan& plan,
                       size_t plan_units, int64_t grad_accum) {
  EngineView v;
  v.planned = detail::plan_units(root, o, plan.shard_size);
  FSDP_ASSERT(v.planned.size() == plan_units, "the plan's units and the schedule's differ");
  const std::vector<int> calls = detail::call_sequence(root, v.planned);
  v.sched_units = detail::schedule_units(v.planned, o, plan.shard_size, plan.replicas);
  v.policies = detail::schedule_policies(v.planned);
  const detail::ScheduleOptions sched_options = detail::schedule_options(o);
  v.sync_events =
      detail::step_events(v.sched_units, v.policies, calls, sched_options, detail::StepPhase::kSynchronized);
  if (grad_accum > 1) {
    v.accum_events =
        detail::step_events(v.sched_units, v.policies, calls, sched_options, detail::StepPhase::kAccumulating);
  }
  return v;
}

// Each unit's compute and collectives as the schedule reads them
// (Schedule::PerUnit: their times alone, and the host's CPU time under
// Execution::kHost) and its UnitEstimate in `est`; returns the shard elements
// the optimizer steps.
int64_t cost_units(std::vector<PlannedCost>& units, const EngineView& view, const ShardingPlan& plan,
                   const FsdpOptions& o, const ClusterSpec& cluster, const StepWorkload& workload,
                   const UnitCostFn& cost, Schedule::PerUnit& per, StepEstimate& est) {
  // Bytes per element on the wire: the compressed formats' (docs/compression.md) where the
  // shard group's collectives use them, the dtypes' elsewhere (NO_SHARD, HYBRID's replicas).
  const auto wire = [&](WireFormat f, at::ScalarType native) {
    return f == WireFormat::kBf16 ? 2.0
           : f == WireFormat::kInt8 ? 1.0 + 4.0 / static_cast<double>(o.compression.block_size)
                                    : static_cast<double>(c10::elementSize(native));
  };
  const int world = cluster.nodes * cluster.procs_per_node;
  const bool no_shard = o.strategy == ShardingStrategy::kNoShard;
  const GroupShape shard = group_shape(plan.shard_size, 1, cluster.procs_per_node);
  const GroupShape replicas = group_shape(plan.replicas, plan.shard_size, cluster.procs_per_node);
  const GroupShape everyone = group_shape(world, 1, cluster.procs_per_node);
  const std::vector<detail::PlannedUnit>& planned = view.planned;
  const std::vector<detail::ScheduleUnit>& sched_units = view.sched_units;
  const std::vector<detail::UnitPolicy>& policies = view.policies;

  const size_t n = units.size();
  for (auto* v : {&per.gather_s, &per.reduce_s, &per.replica_s, &per.latency_s, &per.gather_cpu_s, &per.reduce_cpu_s,
                  &per.replica_cpu_s, &per.gather_cast_s, &per.reduce_cast_s}) {
    v->assign(n, 0.0);
  }
  per.group_gather_s.assign(n, {});
  per.group_gather_cpu_s.assign(n, {});
  per.calls.assign(n, 0);
  for (const detail::Event& e : view.sync_events) {
    if (e.kind == detail::EventKind::kForward) ++per.calls[size_t(e.unit)];
  }
  std::vector<double>& gather_s = per.gather_s;
  std::vector<double>& reduce_s = per.reduce_s;
  std::vector<double>& replica_s = per.replica_s;
  std::vector<double>& latency_s = per.latency_s;
  const bool host = cluster.execution == Execution::kHost;
  const double cpu = host ? cluster.host_cpu_s_per_byte : 0.0;
  int64_t shard_elems = 0;
  for (size_t k = 0; k < n; ++k) {
    PlannedCost& u = units[k];
    const MixedPrecision& mp = planned[k].mixed_precision;
    const double pbytes = wire(o.compression.all_gather, mp.param_dtype);
    const double rbytes = static_cast<double>(c10::elementSize(mp.reduce_dtype));
    const double rs_bytes = wire(o.compression.reduce_scatter, mp.reduce_dtype);
    const bool replicated = sched_units[k].replicated;
    u.compute = cost(u.entries);
    FSDP_CHECK(u.compute.forward_s >= 0 && u.compute.backward_s >= 0, "the compute cost of unit '", u.info.name,
               "' is negative");
    UnitEstimate& ue = est.units.emplace_back();
    ue.name = u.info.name;
    const double m = static_cast<double>(workload.grad_accum);
    ue.forward_s = u.compute.forward_s * m;
    ue.backward_s = u.compute.backward_s * m;
    ue.recompute_s = u.info.checkpointed ? (u.compute.recompute_s >= 0 ? u.compute.recompute_s : u.compute.forward_s) * m
                                         : 0;
    shard_elems += no_shard ? u.reduce_elems : u.shard_elems;
    if (!replicated && plan.shard_size > 1) {
      ue.gather_bytes = static_cast<int64_t>(static_cast<double>(u.gather_elems) * pbytes);
      const double gb = static_cast<double>(ue.gather_bytes);
      gather_s[k] = collective_s(Collective::kAllGather, gb, shard, cluster);
      per.gather_cpu_s[k] = cpu * process_bytes(Collective::kAllGather, gb, shard, cluster);
      const int g = policies[k].post_forward_group;
      if (g > 1) {  // hpZ: backward gathers over groups of g consecutive ranks
        // The post-forward shards hold the gathered values in the param dtype
        // (Note [Post-forward shards]): that gather is never compressed.
        const double native = static_cast<double>(u.gather_elems) * static_cast<double>(c10::elementSize(mp.param_dtype));
        const GroupShape small = group_shape(g, 1, cluster.procs_per_node);
        per.group_gather_s[k][g] = collective_s(Collective::kAllGather, native, small, cluster);
        per.group_gather_cpu_s[k][g] = cpu * process_bytes(Collective::kAllGather, native, small, cluster);
      }
    }
    if (u.reduce_elems > 0) {
      ue.reduce_bytes = static_cast<int64_t>(static_cast<double>(u.reduce_elems) * (no_shard ? rbytes : rs_bytes));
      const double rb = static_cast<double>(u.reduce_elems) * rbytes;
      if (no_shard) {
        reduce_s[k] = collective_s(Collective::kAllReduce, rb, everyone, cluster);
        per.reduce_cpu_s[k] = cpu * process_bytes(Collective::kAllReduce, rb, everyone, cluster);
      } else {
        const double wb = static_cast<double>(ue.reduce_bytes);
        reduce_s[k] = collective_s(Collective::kReduceScatter, wb, shard, cluster);
        per.reduce_cpu_s[k] = cpu * process_bytes(Collective::kReduceScatter, wb, shard, cluster);
        if (plan.replicas > 1) {
          replica_s[k] = collective_s(Collective::kAllReduce, rb / plan.shard_size, replicas, cluster);
          per.replica_cpu_s[k] = cpu * process_bytes(Collective::kAllReduce, rb / plan.shard_size, replicas, cluster);
        }
      }
    }
    if (cluster.memory_bytes_per_s > 0) {
      // Note [Device roofline]: a one-rank group's gather is the cast alone, none
      // where the shard is the parameter itself (fp32 throughout).
      const double shard = static_cast<double>(plan.shard_size);
      const double master = static_cast<double>(c10::elementSize(mp.master_dtype));
      const double param = static_cast<double>(c10::elementSize(mp.param_dtype));
      if (plan.shard_size > 1 || mp.param_dtype != mp.master_dtype) {
        per.gather_cast_s[k] = static_cast<double>(u.gather_elems) / shard * (master + param) / cluster.memory_bytes_per_s;
      }
      if (u.reduce_elems > 0 && (plan.shard_size > 1 || mp.reduce_dtype != mp.master_dtype)) {
        per.reduce_cast_s[k] = static_cast<double>(u.reduce_elems) / shard * (rbytes + master) / cluster.memory_bytes_per_s;
      }
    }
    latency_s[k] = cluster.nodes > 1 ? cluster.inter.latency_s : cluster.intra.latency_s;
    ue.all_gather_s = gather_s[k];
    ue.reduce_s = reduce_s[k];
    ue.replica_all_reduce_s = replica_s[k];
  }
  return shard_elems;
}

// All-gathers per step: what the schedules issue, `times` times.
void count_gathers(const std::vector<detail::Event>& events, int64_t times, const Schedule::PerUnit& per,
                   StepEstimate& est) {
  for (const detail::Event& e : events) {
    const size_t k = size_t(e.unit);
    if ((e.kind == detail::EventKind::kUnshard || e.kind == detail::EventKind::kPrefetch) &&
        (e.group > 0 ? per.group_gather_s[k].count(e.group) > 0 : per.gather_s[k] > 0)) {
      est.units[k].gathers += static_cast<int>(times);
    }
  }
}

// Replays the step's micro-batches and the optimizer on the time model, and
// fills `est`'s times and throughput.
void run_schedule(const std::vector<PlannedCost>& units, const EngineView& view, const FsdpOptions& o,
                  const ClusterSpec& cluster, const StepWorkload& workload, const Schedule::PerUnit& per,
                  int64_t shard_elems, StepEstimate& est) {
  Schedule s(units, o, cluster, per);
  for (int64_t m = 0; m < workload.grad_accum; ++m) {
    const bool last = m + 1 == workload.grad_accum;
    if (last) s.start_timeline();
    s.micro_batch(last ? view.sync_events : view.accum_events, last);
  }
  s.optimizer(shard_elems);
  est.compute_s = s.compute_s();
  est.compute_classes = s.compute_classes();
  est.comm_cpu_s = s.comm_cpu_s();
  est.optimizer_s = s.optimizer_s();
  est.exposed_comm_s = s.exposed_s();
  est.comm_s = s.network().busy_s();
  est.step_time_s = s.now();
  est.timeline = s.timeline();
  const double tokens = static_cast<double>(workload.batch_size * workload.seq_len * workload.grad_accum);
  est.tokens_per_s_per_process = est.step_time_s > 0 ? tokens / est.step_time_s : 0;
  est.tokens_per_s = est.tokens_per_s_per_process * est.world_size;
  if (cluster.peak_flops > 0 && workload.model_flops_per_token > 0) {
    est.mfu = est.tokens_per_s_per_process * workload.model_flops_per_token / cluster.peak_flops;
  }
}

}  // namespace

StepEstimate estimate_step(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                           const ClusterSpec& cluster, const StepWorkload& workload, const UnitCostFn& cost) {
  check_cluster(cluster);
  FSDP_CHECK(workload.batch_size >= 1 && workload.seq_len >= 1 && workload.grad_accum >= 1,
             "the estimate needs StepWorkload::batch_size, StepWorkload::seq_len and StepWorkload::grad_accum >= 1, "
             "got ", workload.batch_size, ", ", workload.seq_len, ", ", workload.grad_accum);
  const int world = cluster.nodes * cluster.procs_per_node;
  FsdpOptions o = options;
  if (o.hybrid_shard_size == 0) o.hybrid_shard_size = cluster.procs_per_node;  // one node, as fsdp-train
  check_options(o, world);
  const ShardingPlan plan = plan_sharding(root, world, 0, o);
  std::vector<PlannedCost> units = merge_units(plan);
  FSDP_ASSERT(!units.empty() && units[0].info.name.empty(), "the plan's first unit must be the root");
  const EngineView view = engine_view(root, o, plan, units.size(), workload.grad_accum);

  StepEstimate est;
  est.world_size = world;
  est.shard_size = plan.shard_size;
  est.replicas = plan.replicas;
  Schedule::PerUnit per;
  const int64_t shard_elems = cost_units(units, view, plan, o, cluster, workload, cost, per, est);
  count_gathers(view.sync_events, 1, per, est);
  count_gathers(view.accum_events, workload.grad_accum - 1, per, est);
  if (world == 1) std::fill(per.latency_s.begin(), per.latency_s.end(), 0.0);
  run_schedule(units, view, o, cluster, workload, per, shard_elems, est);
  return est;
}

StepEstimate estimate_scaling(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                              const ClusterSpec& cluster, const StepWorkload& workload, const UnitCostFn& cost) {
  StepEstimate est = estimate_step(root, options, cluster, workload, cost);
  if (cluster.nodes == 1) return est;
  ClusterSpec one = cluster;
  one.nodes = 1;
  FsdpOptions o = options;
  if (o.strategy == ShardingStrategy::kHybridShard && o.hybrid_shard_size > one.procs_per_node) {
    o.hybrid_shard_size = one.procs_per_node;  // a shard group spanning nodes, cut to the one node
  }
  const StepEstimate base = estimate_step(root, o, one, workload, cost);
  est.scaling_efficiency = base.tokens_per_s_per_process > 0 ? est.tokens_per_s_per_process / base.tokens_per_s_per_process
                                                             : 0;
  return est;
}

}  // namespace fsdp

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
#include "fsdp/common/json_input.h"

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

  // Note [Replay tolerance]: times are doubles; far into a long step (past
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

// ---- the schedule ------------------------------------------------------------------------

// Note [Estimated schedule]
// The engine's order (state.h, Note [Unit lifecycle]; model.cpp), for units that
// run forward once each in the plan's order, the root enclosing the others and
// its own code running after them in forward and before them in backward:
//  forward   root: all-gathered once (kept through backward). Unit k: all-gather
//            issued at its pre-forward unless prefetched; forward prefetch issues
//            unit k+1's; wait; forward. FULL_SHARD/HYBRID reshard after it.
//  backward  the root's own backward; then units in reverse: FULL_SHARD/HYBRID
//            all-gather again (SHARD_GRAD_OP kept them), BACKWARD_PRE prefetches
//            the unit before (never the root), at most limit_all_gathers
//            prefetches outstanding; wait; recompute (checkpointed); backward;
//            its reduction is issued (reduce-scatter; NO_SHARD all-reduce), and
//            once more than two are in flight the oldest is finished: waited for,
//            and under HYBRID all-reduced across replicas on the training thread
//            (collectives.cpp: finish_reduction), which the step waits for;
//            BACKWARD_POST prefetches after the reduction is issued. The root's
//            gradients complete last; end of backward finishes every reduction.
//  step      gradient norm (one scalar all-reduce), AdamW on the local shards,
//            the loss all-reduce.
// Micro-batches before the last (--grad-accum) skip the reductions.
// Execution::kHost: the CPU a collective costs this process (host_cpu_s_per_byte x
// the bytes it sends and receives) is spent on the training thread when the
// collective is issued: the cores are taken to be busy with compute, so the
// lanes' copies and the kernel's TCP work come out of it.
// Execution::kDevice (CUDA): the host runs ahead of the compute stream, so the
// all-gathers of the next limit_all_gathers units are issued while a unit computes,
// in forward and (BACKWARD_PRE) in backward. Waits order the compute stream after
// the collective (NCCL), which for the model is the same as the host waiting.
class Schedule {
 public:
  // The *_s vectors: each unit's collectives alone on the network; *_cpu_s: the host
  // CPU they cost this process (ClusterSpec::host_cpu_s_per_byte).
  struct PerUnit {
    std::vector<double> gather_s, reduce_s, replica_s, latency_s, gather_cpu_s, reduce_cpu_s, replica_cpu_s;
  };
  Schedule(const std::vector<PlannedCost>& units, const FsdpOptions& o, const ClusterSpec& c, const PerUnit& p)
      : u_(units), o_(o), c_(c), gather_s_(p.gather_s), reduce_s_(p.reduce_s), replica_s_(p.replica_s),
        latency_s_(p.latency_s), p_(p) {}

  void micro_batch(bool sync, bool last) {
    const bool device = c_.execution == Execution::kDevice;
    const bool regather = o_.strategy == ShardingStrategy::kFullShard ||
                          o_.strategy == ShardingStrategy::kHybridShard;
    const size_t n = u_.size();
    gathered_.assign(n, -1);
    prefetched_pending_ = 0;
    prefetched_.assign(n, false);
    record_ = last;
    // forward
    gather(0);
    wait_gather(0);
    for (size_t k = 1; k < n; ++k) {
      gather(k);
      consume(k);
      if (device) {
        for (size_t j = k + 1; j < n && j <= k + static_cast<size_t>(o_.limit_all_gathers); ++j) prefetch(j);
      } else if (o_.forward_prefetch && k + 1 < n) {
        prefetch(k + 1);
      }
      wait_gather(k);
      compute("forward", k, u_[k].compute.forward_s);
      if (regather) gathered_[k] = -1;  // resharded
    }
    compute("forward", 0, u_[0].compute.forward_s);
    // backward
    compute("backward", 0, u_[0].compute.backward_s);
    for (size_t k = n - 1; k >= 1; --k) {
      gather(k);
      consume(k);
      if (o_.backward_prefetch == BackwardPrefetch::kPre && k > 1) {
        const size_t ahead = device ? static_cast<size_t>(o_.limit_all_gathers) : 1;
        for (size_t j = k - 1; j >= 1 && k - j <= ahead; --j) prefetch(j);
      }
      wait_gather(k);
      if (u_[k].info.checkpointed) {
        const double r = u_[k].compute.recompute_s >= 0 ? u_[k].compute.recompute_s : u_[k].compute.forward_s;
        compute("recompute", k, r);
      }
      compute("backward", k, u_[k].compute.backward_s);
      if (regather) gathered_[k] = -1;
      if (sync) reduce(k);
      if (o_.backward_prefetch == BackwardPrefetch::kPost && k > 1) prefetch(k - 1);
    }
    if (sync) {
      reduce(0);
      while (!pending_.empty()) finish_oldest();
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

  void compute(const char* what, size_t k, double s) {
    if (s <= 0) return;
    if (record_) spans_.push_back({"compute", std::string(what) + " " + label(k), now_, now_ + s});
    now_ += s;
    if (std::string(what) == "optimizer") {
      optimizer_s_ += s;
    } else if (std::string(what) == "comm cpu") {
      comm_cpu_s_ += s;
    } else {
      compute_s_ += s;
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

  // Issues unit k's all-gather unless it is gathered or in flight.
  void gather(size_t k) {
    if (gathered_[k] != -1 || gather_s_[k] <= 0) return;
    gathered_[k] = net_.issue(Network::kGather, now_, gather_s_[k], latency_s_[k], "all_gather " + label(k));
    compute("comm cpu", k, p_.gather_cpu_s[k]);
  }
  void prefetch(size_t k) {
    if (k == 0 || gathered_[k] != -1 || gather_s_[k] <= 0) return;
    if (prefetched_pending_ >= o_.limit_all_gathers) return;
    gather(k);
    prefetched_[k] = true;
    ++prefetched_pending_;
  }
  void consume(size_t k) {
    if (prefetched_[k]) {
      prefetched_[k] = false;
      --prefetched_pending_;
    }
  }
  void wait_gather(size_t k) {
    if (gathered_[k] < 0) return;
    wait_comm(gathered_[k], "wait all_gather " + label(k));
    gathered_[k] = -2;  // gathered: nothing in flight
  }

  void reduce(size_t k) {
    if (reduce_s_[k] <= 0 && replica_s_[k] <= 0) return;
    Pending p;
    p.unit = k;
    if (reduce_s_[k] > 0) p.op = net_.issue(Network::kReduce, now_, reduce_s_[k], latency_s_[k], "reduce " + label(k));
    compute("comm cpu", k, p_.reduce_cpu_s[k]);
    pending_.push_back(p);
    while (pending_.size() > kMaxInFlight) finish_oldest();
  }

  // Waits for the oldest reduction; HYBRID: then its all-reduce across replicas,
  // waited for at once (collectives.cpp: finish_reduction). On CUDA these waits
  // order the compute stream after the collective: compute waits the same way.
  void finish_oldest() {
    const Pending p = pending_.front();
    pending_.pop_front();
    if (p.op >= 0) wait_comm(p.op, "wait reduce " + label(p.unit));
    if (replica_s_[p.unit] > 0) {
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
  static constexpr size_t kMaxInFlight = 2;  // detail::kMaxInflightReduces

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
  double comm_cpu_s_ = 0;
  double optimizer_s_ = 0;
  double exposed_s_ = 0;
  std::vector<int> gathered_;  // op id in flight, -1: sharded, -2: gathered
  std::vector<bool> prefetched_;
  int prefetched_pending_ = 0;
  std::deque<Pending> pending_;
  bool record_ = false;
  std::vector<EstimateSpan> spans_;
  double timeline_begin_ = 0;
};

void check_cluster(const ClusterSpec& c) {
  FSDP_CHECK(c.nodes >= 1, "cluster '", c.name, "': nodes must be >= 1, got ", c.nodes);
  FSDP_CHECK(c.procs_per_node >= 1, "cluster '", c.name, "': procs_per_node (--nproc-per-node) must be >= 1, got ",
             c.procs_per_node);
  const int world = c.nodes * c.procs_per_node;
  FSDP_CHECK(world == 1 || c.procs_per_node == 1 || c.intra.bytes_per_s > 0, "cluster '", c.name,
             "': the intra-node rate must be > 0 (intra.gbit_per_s), got ", c.intra.bytes_per_s * 8 / 1e9, " Gbit/s");
  FSDP_CHECK(c.nodes == 1 || c.inter.bytes_per_s > 0, "cluster '", c.name,
             "': the inter-node rate must be > 0 (inter.gbit_per_s), got ", c.inter.bytes_per_s * 8 / 1e9, " Gbit/s");
  FSDP_CHECK(c.intra.latency_s >= 0 && c.inter.latency_s >= 0 && c.optimizer_s_per_element >= 0 &&
                 c.host_cpu_s_per_byte >= 0 &&
                 c.peak_flops >= 0 && c.compute_efficiency >= 0 && c.compute_efficiency <= 1,
             "cluster '", c.name, "': latencies, the optimizer rate and the peak must be >= 0 and the compute "
             "efficiency in [0, 1]");
}

}  // namespace

StepEstimate estimate_step(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                           const ClusterSpec& cluster, const StepWorkload& workload, const UnitCostFn& cost) {
  check_cluster(cluster);
  FSDP_CHECK(workload.batch_size >= 1 && workload.seq_len >= 1 && workload.grad_accum >= 1,
             "the estimate needs --batch-size, --seq-len and --grad-accum >= 1, got ", workload.batch_size, ", ",
             workload.seq_len, ", ", workload.grad_accum);
  const int world = cluster.nodes * cluster.procs_per_node;
  FsdpOptions o = options;
  if (o.hybrid_shard_size == 0) o.hybrid_shard_size = cluster.procs_per_node;  // one node, as fsdp-train
  check_options(o, world);
  const ShardingPlan plan = plan_sharding(root, world, 0, o);
  std::vector<PlannedCost> units = merge_units(plan);
  FSDP_ASSERT(!units.empty() && units[0].info.name.empty(), "the plan's first unit must be the root");

  const MixedPrecision& mp = o.mixed_precision;
  // Bytes per element on the wire: the compressed formats' (docs/compression.md) where the
  // shard group's collectives use them, the dtypes' elsewhere (NO_SHARD, HYBRID's replicas).
  const auto wire = [&](WireFormat f, at::ScalarType native) {
    return f == WireFormat::kBf16 ? 2.0
           : f == WireFormat::kInt8 ? 1.0 + 4.0 / static_cast<double>(o.compression.block_size)
                                    : static_cast<double>(c10::elementSize(native));
  };
  const double pbytes = wire(o.compression.all_gather, mp.param_dtype);
  const double rbytes = static_cast<double>(c10::elementSize(mp.reduce_dtype));
  const double rs_bytes = wire(o.compression.reduce_scatter, mp.reduce_dtype);
  const bool no_shard = o.strategy == ShardingStrategy::kNoShard;
  // Nothing is gathered when every unit is its own single copy (detail::keeps_single_copy).
  const bool single_copy = plan.shard_size == 1 && mp.param_dtype == mp.master_dtype &&
                           (!o.cpu_offload || o.device.is_cpu());
  const GroupShape shard = group_shape(plan.shard_size, 1, cluster.procs_per_node);
  const GroupShape replicas = group_shape(plan.replicas, plan.shard_size, cluster.procs_per_node);
  const GroupShape everyone = group_shape(world, 1, cluster.procs_per_node);

  StepEstimate est;
  est.world_size = world;
  est.shard_size = plan.shard_size;
  est.replicas = plan.replicas;
  const size_t n = units.size();
  Schedule::PerUnit per;
  for (auto* v : {&per.gather_s, &per.reduce_s, &per.replica_s, &per.latency_s, &per.gather_cpu_s, &per.reduce_cpu_s,
                  &per.replica_cpu_s}) {
    v->assign(n, 0.0);
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
    if (!no_shard && !single_copy && plan.shard_size > 1) {
      ue.gather_bytes = static_cast<int64_t>(static_cast<double>(u.gather_elems) * pbytes);
      gather_s[k] = collective_s(Collective::kAllGather, static_cast<double>(ue.gather_bytes), shard, cluster);
      per.gather_cpu_s[k] = cpu * process_bytes(Collective::kAllGather, static_cast<double>(ue.gather_bytes), shard,
                                                cluster);
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
    latency_s[k] = cluster.nodes > 1 ? cluster.inter.latency_s : cluster.intra.latency_s;
    ue.all_gather_s = gather_s[k];
    ue.reduce_s = reduce_s[k];
    ue.replica_all_reduce_s = replica_s[k];
  }
  const bool regather = o.strategy == ShardingStrategy::kFullShard || o.strategy == ShardingStrategy::kHybridShard;
  for (size_t k = 0; k < n; ++k) {
    if (gather_s[k] > 0) est.units[k].gathers = static_cast<int>(workload.grad_accum) * (regather && k > 0 ? 2 : 1);
  }
  if (world == 1) std::fill(latency_s.begin(), latency_s.end(), 0.0);

  Schedule s(units, o, cluster, per);
  for (int64_t m = 0; m < workload.grad_accum; ++m) {
    const bool last = m + 1 == workload.grad_accum;
    if (last) s.start_timeline();
    s.micro_batch(/*sync=*/last, last);
  }
  s.optimizer(shard_elems);
  est.compute_s = s.compute_s();
  est.comm_cpu_s = s.comm_cpu_s();
  est.optimizer_s = s.optimizer_s();
  est.exposed_comm_s = s.exposed_s();
  est.comm_s = s.network().busy_s();
  est.step_time_s = s.now();
  est.timeline = s.timeline();
  const double tokens = static_cast<double>(workload.batch_size * workload.seq_len * workload.grad_accum);
  est.tokens_per_s_per_process = est.step_time_s > 0 ? tokens / est.step_time_s : 0;
  est.tokens_per_s = est.tokens_per_s_per_process * world;
  if (cluster.peak_flops > 0 && workload.model_flops_per_token > 0) {
    est.mfu = est.tokens_per_s_per_process * workload.model_flops_per_token / cluster.peak_flops;
  }
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

// ---- presets -------------------------------------------------------------------------------

namespace {

struct Preset {
  const char* name;
  const char* alias;
  const char* gpu;             // device.cpp's peak table key
  int gpus;
  double nvlink_gbyte_s;       // per GPU, one direction, data sheet
  double nic_gbit_s;           // per node, all NICs, one direction, data sheet
  double hbm_tbyte_s;
  const char* what;
};

// Data sheets: NVIDIA H100 SXM5 / H200 SXM / A100 SXM4 80GB; AWS p5.48xlarge
// (3200 Gbit/s EFAv2), p5en.48xlarge (3200 Gbit/s EFAv3), p4de.24xlarge (400 Gbit/s EFA).
const Preset kPresets[] = {
    {"p5.48xlarge", "h100", "H100", 8, 450, 3200, 3.35, "8 x H100 SXM5 80GB, NVLink4 900 GB/s (450 each way), 3200 Gbit/s EFA"},
    {"p5en.48xlarge", "h200", "H200", 8, 450, 3200, 4.8, "8 x H200 141GB, NVLink4 900 GB/s (450 each way), 3200 Gbit/s EFA"},
    {"p4de.24xlarge", "a100", "A100", 8, 300, 400, 2.04, "8 x A100 SXM4 80GB, NVLink3 600 GB/s (300 each way), 400 Gbit/s EFA"},
};

// Stated efficiencies (what fraction of a data-sheet rate is assumed reached).
constexpr double kComputeEfficiency = 0.6;  // a decoder block's FLOPs, eager bf16 kernels (GEMMs ~0.7-0.8 of peak)
constexpr double kNvlinkEfficiency = 0.8;   // NCCL all-gather / reduce-scatter bus bandwidth over NVLink
constexpr double kEfaEfficiency = 0.7;      // NCCL over EFA (libfabric), large messages
constexpr double kHbmEfficiency = 0.8;      // AdamW streaming its state
constexpr double kAdamBytesPerElement = 28; // fp32 param, grad, m, v read; param, m, v written
constexpr double kIntraLatency = 10e-6;     // per ring hop
constexpr double kInterLatency = 20e-6;

}  // namespace

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(detail::cat(p.name, " (", p.alias, ")"));
  return out;
}

ClusterSpec cluster_preset(const std::string& name, at::ScalarType compute_dtype) {
  for (const Preset& p : kPresets) {
    if (name != p.name && name != p.alias) continue;
    ClusterSpec c;
    c.name = p.name;
    c.nodes = 1;
    c.procs_per_node = p.gpus;
    c.intra = {p.nvlink_gbyte_s * 1e9 * kNvlinkEfficiency, kIntraLatency};
    c.inter = {p.nic_gbit_s * 1e9 / 8 * kEfaEfficiency, kInterLatency};
    c.algorithm = CollectiveAlgorithm::kRing;
    c.execution = Execution::kDevice;
    c.peak_flops = peak_flops(p.gpu, compute_dtype);
    c.compute_efficiency = kComputeEfficiency;
    c.optimizer_s_per_element = kAdamBytesPerElement / (p.hbm_tbyte_s * 1e12 * kHbmEfficiency);
    c.notes = detail::cat(p.what, "; assumed: units reach ", kComputeEfficiency, " of the dense ",
                          c10::toString(compute_dtype), " peak (", c.peak_flops / 1e12, " TFLOP/s), NCCL rings at ",
                          kNvlinkEfficiency, " of NVLink and ", kEfaEfficiency, " of EFA, AdamW at ", kHbmEfficiency,
                          " of HBM (", kAdamBytesPerElement, " bytes per element)");
    return c;
  }
  std::string names;
  for (const auto& s : cluster_preset_names()) names += (names.empty() ? "" : ", ") + s;
  FSDP_CHECK(false, "--cluster '", name, "' is neither a preset (", names,
             ") nor a readable JSON file; give a preset or the file fsdp-inspect --calibrate wrote");
  return {};
}

// ---- JSON ------------------------------------------------------------------------------

ClusterSpec cluster_from_json(const std::string& text, const ClusterSpec& base, const std::string& source) {
  std::string why;
  const std::optional<nlohmann::json> parsed = parse_json_input(text, why);
  FSDP_CHECK(parsed.has_value(), source, ": not valid JSON (", why, "); fsdp-inspect --calibrate writes this file");
  const nlohmann::json& j = *parsed;
  FSDP_CHECK(j.is_object(), source, ": a cluster description is a JSON object, got ", j.type_name());
  static const std::set<std::string> kKnown = {"name", "nodes", "procs_per_node", "intra", "inter", "algorithm",
                                               "execution", "peak_tflops", "compute_efficiency",
                                               "optimizer_ns_per_element", "host_cpu_ns_per_byte", "notes",
                                               "calibration"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    FSDP_CHECK(kKnown.count(it.key()) > 0, source, ": unknown field '", it.key(), "' (fields: name, nodes, "
               "procs_per_node, intra, inter, algorithm, execution, peak_tflops, compute_efficiency, "
               "optimizer_ns_per_element, host_cpu_ns_per_byte, notes, calibration)");
  }
  ClusterSpec c = base;
  auto number = [&](const nlohmann::json& v, const std::string& field, double lo, double hi = 1e300) {
    FSDP_CHECK(v.is_number(), source, ": '", field, "' must be a number, got ", v.dump());
    const double x = v.get<double>();
    FSDP_CHECK(std::isfinite(x) && x >= lo && x <= hi, source, ": '", field, "' must be in [", lo, ", ", hi,
               "], got ", x);
    return x;
  };
  auto integer = [&](const char* field, int& out) {
    if (!j.contains(field)) return;
    const double x = number(j[field], field, 1);
    FSDP_CHECK(x == std::floor(x) && x <= 1e6, source, ": '", field, "' must be a whole number >= 1, got ", x);
    out = static_cast<int>(x);
  };
  auto link = [&](const char* field, LinkSpec& out) {
    if (!j.contains(field)) return;
    const nlohmann::json& l = j[field];
    FSDP_CHECK(l.is_object(), source, ": '", field, "' must be an object {\"gbit_per_s\", \"latency_us\"}");
    for (auto it = l.begin(); it != l.end(); ++it) {
      FSDP_CHECK(it.key() == "gbit_per_s" || it.key() == "latency_us", source, ": unknown field '", field, ".",
                 it.key(), "' (gbit_per_s, latency_us)");
    }
    if (l.contains("gbit_per_s")) {
      const double gbps = number(l["gbit_per_s"], detail::cat(field, ".gbit_per_s"), 0, kMaxLinkGbps);
      FSDP_CHECK(gbps == 0 || gbps >= kMinLinkGbps, source, ": '", field, ".gbit_per_s' must be 0 (none) or in [",
                 kMinLinkGbps, ", ", kMaxLinkGbps, "], got ", gbps);
      out.bytes_per_s = gbps * 1e9 / 8;
    }
    if (l.contains("latency_us")) {
      out.latency_s = number(l["latency_us"], detail::cat(field, ".latency_us"), 0, kMaxLatencyUs) * 1e-6;
    }
  };
  auto word = [&](const char* field, std::initializer_list<const char*> allowed) -> std::string {
    if (!j.contains(field)) return "";
    FSDP_CHECK(j[field].is_string(), source, ": '", field, "' must be a string");
    const std::string v = j[field].get<std::string>();
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return v;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    FSDP_CHECK(false, source, ": '", field, "' is '", v, "', not one of: ", list);
    return "";
  };
  if (j.contains("name")) {
    FSDP_CHECK(j["name"].is_string(), source, ": 'name' must be a string");
    c.name = j["name"].get<std::string>();
  }
  if (j.contains("notes")) {
    FSDP_CHECK(j["notes"].is_string(), source, ": 'notes' must be a string");
    c.notes = j["notes"].get<std::string>();
  }
  integer("nodes", c.nodes);
  integer("procs_per_node", c.procs_per_node);
  link("intra", c.intra);
  link("inter", c.inter);
  const std::string alg = word("algorithm", {"mesh", "ring"});
  if (!alg.empty()) c.algorithm = alg == "mesh" ? CollectiveAlgorithm::kMesh : CollectiveAlgorithm::kRing;
  const std::string ex = word("execution", {"host", "device"});
  if (!ex.empty()) c.execution = ex == "host" ? Execution::kHost : Execution::kDevice;
  if (j.contains("peak_tflops")) {
    c.peak_flops = j["peak_tflops"].is_null() ? 0 : number(j["peak_tflops"], "peak_tflops", 0, kMaxPeakTflops) * 1e12;
  }
  if (j.contains("compute_efficiency")) {
    c.compute_efficiency = number(j["compute_efficiency"], "compute_efficiency", 0);
    FSDP_CHECK(c.compute_efficiency <= 1, source, ": 'compute_efficiency' must be in [0, 1], got ", c.compute_efficiency);
  }
  if (j.contains("optimizer_ns_per_element")) {
    c.optimizer_s_per_element =
        number(j["optimizer_ns_per_element"], "optimizer_ns_per_element", 0, kMaxNsPerUnit) * 1e-9;
  }
  if (j.contains("host_cpu_ns_per_byte")) {
    c.host_cpu_s_per_byte = number(j["host_cpu_ns_per_byte"], "host_cpu_ns_per_byte", 0, kMaxNsPerUnit) * 1e-9;
  }
  return c;
}

std::string cluster_to_json(const ClusterSpec& c) {
  nlohmann::json j;
  j["name"] = c.name;
  j["nodes"] = c.nodes;
  j["procs_per_node"] = c.procs_per_node;
  j["intra"] = {{"gbit_per_s", c.intra.bytes_per_s * 8 / 1e9}, {"latency_us", c.intra.latency_s * 1e6}};
  j["inter"] = {{"gbit_per_s", c.inter.bytes_per_s * 8 / 1e9}, {"latency_us", c.inter.latency_s * 1e6}};
  j["algorithm"] = c.algorithm == CollectiveAlgorithm::kMesh ? "mesh" : "ring";
  j["execution"] = c.execution == Execution::kHost ? "host" : "device";
  j["peak_tflops"] = c.peak_flops > 0 ? nlohmann::json(c.peak_flops / 1e12) : nlohmann::json(nullptr);
  j["compute_efficiency"] = c.compute_efficiency;
  j["optimizer_ns_per_element"] = c.optimizer_s_per_element * 1e9;
  j["host_cpu_ns_per_byte"] = c.host_cpu_s_per_byte * 1e9;
  j["notes"] = c.notes;
  return j.dump(2);
}

}  // namespace fsdp

// Step-time model: how long one training step of a sharded model takes on a
// cluster, and how much of its communication is exposed — without running it.
//
// estimate_step() takes what plan_sharding takes (the model's structure, the
// options) plus a cluster description and what each unit costs to compute,
// and times the engine's own step schedule (src/fsdp/schedule.h: the events
// the engine executes, for the model's call order and options; Note
// [Estimated schedule] in src/plan/estimate.cpp): the root gathered once,
// FULL_SHARD / HYBRID re-gathering each unit in backward, SHARD_GRAD_OP not,
// NO_SHARD all-reducing instead, forward and backward prefetch within
// limit_all_gathers, at most two reductions in flight, HYBRID's replica
// all-reduce after each unit's reduce-scatter, the optimizer on the local
// shards. Communication runs on the engine's two lanes (all-gathers; reductions)
// which share the network fairly while both are busy. Library fsdp::plan (the
// planning layer above the engine; fsdp-train does not link it).
//
// What it does not know: activations' memory, data loading, stragglers,
// interference of communication with compute on the same cores or memory,
// congestion beyond one node's link, kernel-level effects (a unit's time is
// what UnitCompute says). Its inputs carry the rest: a calibrated cluster
// (fsdp-inspect --calibrate) measures a unit's time on this machine; a preset
// states data-sheet rates and the efficiencies assumed (ClusterSpec::notes).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"

namespace fsdp {

// One link's achievable rate (bytes per second in each direction, already
// multiplied by any efficiency) and the fixed cost of one collective on it.
struct LinkSpec {
  double bytes_per_s = 0;
  double latency_s = 0;
};

// Sane ranges of the numbers a user gives the estimate (flags and cluster
// files): beyond them no machine exists, and the replay's times leave the
// range where its sums are exact (issue 39). Refused with the flag or field named.
inline constexpr double kMinLinkGbps = 1e-3;        // 1 Mbit/s
inline constexpr double kMaxLinkGbps = 1e7;         // 10 Pbit/s
inline constexpr double kMaxLatencyUs = 1e7;        // 10 s per collective
inline constexpr double kMaxPeakTflops = 1e7;       // 10 exaflop/s per process
inline constexpr double kMaxMemoryGbytePerS = 1e7;  // 10 PB/s per process
inline constexpr double kMaxNsPerUnit = 1e9;        // 1 s per element or byte

// Bytes the optimizer step moves per fp32 shard element on a device (Note
// [Device roofline] in src/plan/cluster.cpp): fused AdamW reads parameter,
// gradient and both moments and writes three (28), the gradient norm reads the
// gradient (4), clipping reads and writes it (kClipBytesPerElement) — none
// where the AdamW kernel clips as it reads (StepOptions::kernels kFused).
inline constexpr double kOptimizerBytesPerElement = 40;
inline constexpr double kClipBytesPerElement = 8;

// How a backend moves a collective's bytes (Note [Collective volumes] in src/plan/estimate.cpp).
enum class CollectiveAlgorithm {
  kMesh,  // every rank sends to every peer directly: our TCP group (CPU)
  kRing,  // rings over all of a node's NICs: NCCL (GPU)
};

// Who waits for what (Note [Estimated schedule]).
enum class Execution {
  kHost,    // compute runs on the training thread; a wait blocks it (CPU)
  kDevice,  // the host runs ahead: collectives are issued limit_all_gathers
            // units ahead of compute and waited for by the compute stream (CUDA)
};

struct ClusterSpec {
  std::string name;              // "p5.48xlarge", "calibrated: <host>", ...
  int nodes = 1;
  int procs_per_node = 1;        // processes (GPUs) per node
  LinkSpec intra;                // between two processes of one node, per process
  LinkSpec inter;                // one node's link to the others, shared by its processes
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kMesh;
  Execution execution = Execution::kHost;
  double peak_flops = 0;         // per process, dense, at the run's compute dtype; 0: unknown (no MFU)
  // The fraction of peak_flops a unit's counted FLOPs reach (presets' stated
  // assumption, used by their UnitCostFn); 0 where unit times are measured.
  double compute_efficiency = 0;
  // The roofline of a device (Note [Device roofline] in src/plan/cluster.cpp):
  // achievable rates per process, each already what kernels reach (measured,
  // or a data sheet's number times a stated fraction). With a product rate and
  // a memory bandwidth, a model family that counts its work (models/op_work.h)
  // is timed by operation class instead of at compute_efficiency of the peak,
  // and the engine's casts of parameters and gradients (per gather and
  // reduction) are timed as memory traffic. 0: unknown.
  double matmul_flops = 0;          // dense matrix products at the compute dtype
  // Rowwise-scaled e4m3 products (at::_scaled_mm: --fp8-linear rowwise); 0:
  // unknown (fsdp-inspect then times them at matmul_flops and says so).
  double fp8_matmul_flops = 0;
  double attention_flops = 0;       // flash attention; 0: matmul_flops
  double memory_bytes_per_s = 0;    // device memory, read + written
  double optimizer_s_per_element = 0;  // AdamW on one element of a shard (master dtype)
  // CPU time a process spends per byte it sends or receives (copies, the
  // kernel's TCP stack) — with Execution::kHost, where its cores also compute,
  // added to its compute when a collective starts (the cores are assumed busy
  // computing, as in a CPU run). 0 on GPUs (the NICs and NVLink move bytes).
  double host_cpu_s_per_byte = 0;
  std::string notes;             // the assumptions behind the numbers, for people
};

// Where compute time goes, by operation class (the roofline's; all 0 where
// unit times come from FLOPs at one efficiency or from a calibration).
struct ComputeClasses {
  double products_s = 0;      // matrix products at ClusterSpec::matmul_flops
  double attention_s = 0;     // attention at ClusterSpec::attention_flops
  double memory_s = 0;        // memory-bound kernels at ClusterSpec::memory_bytes_per_s
  double fp8_products_s = 0;  // FP8 products at ClusterSpec::fp8_matmul_flops
  double total() const { return products_s + attention_s + memory_s + fp8_products_s; }
  ComputeClasses& operator+=(const ComputeClasses& o) {
    products_s += o.products_s;
    attention_s += o.attention_s;
    memory_s += o.memory_s;
    fp8_products_s += o.fp8_products_s;
    return *this;
  }
  ComputeClasses scaled(double f) const {
    return {products_s * f, attention_s * f, memory_s * f, fp8_products_s * f};
  }
};

// What one unit's own code costs on one process for one micro-batch (its
// nested units not included).
struct UnitCompute {
  double forward_s = 0;
  double backward_s = 0;    // gradients of its inputs and parameters
  double recompute_s = -1;  // activation checkpointing's second forward; < 0: forward_s
  // The same times by class where the cost knows them (their totals equal the times above).
  ComputeClasses forward, backward, recompute;
};

// The run's shape, as fsdp-train's flags give it.
struct StepWorkload {
  int64_t batch_size = 1;   // samples per process per micro-batch (--batch-size)
  int64_t seq_len = 1;      // tokens per sample (--seq-len)
  int64_t grad_accum = 1;   // micro-batches per step (--grad-accum), the last one synchronized
  double model_flops_per_token = 0;  // forward + backward, no recomputation (for MFU); 0: no MFU
};

// One unit's share of the step (all micro-batches of it).
struct UnitEstimate {
  std::string name;           // "" for the root
  double forward_s = 0;
  double backward_s = 0;
  double recompute_s = 0;     // activation checkpointing's second forward
  int64_t gather_bytes = 0;   // its unsharded parameters, as the wire carries them (0: never gathered)
  int64_t reduce_bytes = 0;   // its unsharded gradients, as the wire carries them (0: nothing reduced)
  double all_gather_s = 0;    // one all-gather of it, alone on the network
  double reduce_s = 0;        // one reduce-scatter (NO_SHARD: all-reduce) of it, alone on the network
  double replica_all_reduce_s = 0;  // HYBRID: one all-reduce of its gradient shard across replicas
  int gathers = 0;            // all-gathers of it per step
};

// One interval of the replayed schedule (Chrome-trace-like, for people and tests).
struct EstimateSpan {
  std::string lane;  // "compute", "all_gather", "reduce", "wait"
  std::string what;  // "forward layers.3", "all_gather layers.4", ...
  double begin_s = 0;
  double end_s = 0;
};

struct StepEstimate {
  std::vector<UnitEstimate> units;  // the plan's units (a unit's trainable and frozen entries as one)
  int world_size = 1;
  int shard_size = 1;
  int replicas = 1;
  double compute_s = 0;       // forward + backward + recomputation, all micro-batches
  // compute_s by operation class, with the engine's casts (memory-bound) —
  // where the cost is a roofline (UnitCompute's classes); otherwise all 0.
  ComputeClasses compute_classes;
  double comm_cpu_s = 0;      // host CPU spent moving bytes (ClusterSpec::host_cpu_s_per_byte)
  double optimizer_s = 0;
  double comm_s = 0;          // time some collective was on the network
  double exposed_comm_s = 0;  // time compute waited for communication
  double step_time_s = 0;
  double tokens_per_s = 0;    // the whole job's
  double tokens_per_s_per_process = 0;
  double mfu = -1;            // model FLOPs per second over peak; < 0: no known peak
  double scaling_efficiency = 1;  // tokens/s per process here over the same on one node (filled by estimate_scaling)
  std::vector<EstimateSpan> timeline;  // the last micro-batch's schedule and the optimizer
};

// The per-unit compute cost, asked once per unit of the plan with its entries
// (ShardingPlan::units: the trainable one, then the frozen one if any).
using UnitCostFn = std::function<UnitCompute(const std::vector<UnitInfo>& entries)>;

// The estimate for `cluster.nodes * cluster.procs_per_node` processes. Plans
// with plan_sharding (UsageError for options it refuses). Requires:
// cluster rates > 0 (UsageError naming the field).
StepEstimate estimate_step(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                           const ClusterSpec& cluster, const StepWorkload& workload, const UnitCostFn& cost);

// estimate_step at cluster.nodes, with scaling_efficiency against one node of
// the same cluster (same per-process workload; HYBRID with a shard group
// spanning more than one node is compared with one node sharded alone).
StepEstimate estimate_scaling(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& options,
                              const ClusterSpec& cluster, const StepWorkload& workload, const UnitCostFn& cost);

// Presets ("p5.48xlarge" = "h100", "p5en.48xlarge" = "h200", "p4de.24xlarge" = "a100"): data-sheet rates
// times the efficiencies stated in ClusterSpec::notes, one node (set nodes after). `compute_dtype`
// picks the peak. UsageError naming the presets for another name.
ClusterSpec cluster_preset(const std::string& name, at::ScalarType compute_dtype);
std::vector<std::string> cluster_preset_names();

// A cluster description as JSON (what fsdp-inspect --cluster FILE reads and
// --calibrate writes): {"name", "nodes", "procs_per_node", "intra": {"gbit_per_s",
// "latency_us"}, "inter": {...}, "algorithm": "mesh"|"ring", "execution":
// "host"|"device", "peak_tflops" (null: unknown), "compute_efficiency", "matmul_tflops",
// "fp8_matmul_tflops", "attention_tflops", "memory_gbyte_per_s" (0: unknown), "optimizer_ns_per_element",
// "host_cpu_ns_per_byte", "notes"}, every field optional over `base`.
// UsageError naming the field for a wrong type or a value out of range.
ClusterSpec cluster_from_json(const std::string& text, const ClusterSpec& base, const std::string& source);
std::string cluster_to_json(const ClusterSpec& c);

}  // namespace fsdp

// fsdp-inspect --estimate / --calibrate: the step-time model (fsdp/estimate.h)
// for a Llama-family model, with unit costs from FLOPs (presets) or measured
// on this machine (--calibrate).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/estimate.h"
#include "fsdp/models/llama.h"
#include "fsdp/train/model_family.h"

namespace fsdp::cli {

// What --calibrate measured: each unit's compute on this machine for one
// micro-batch of exactly this shape, and AdamW's time per shard element.
struct Calibration {
  std::string model;           // the --model given
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::string mixed_precision; // --mixed-precision
  bool activation_checkpointing = false;
  int threads = 0;             // LibTorch's intra-op threads while measuring
  int steps = 0;               // measured steps (medians over them)
  std::map<std::string, UnitCompute> units;  // by unit name ("" the root)
  double optimizer_s_per_element = 0;
};

// Runs `steps` training steps (after one warm-up) of the model on one process,
// unsharded (a one-rank group: no communication), tracing each unit's forward,
// backward and recomputation; each unit's own time is its span minus the spans
// of the units inside it; medians over the steps.
Calibration calibrate_compute(const std::shared_ptr<models::LlamaForCausalLMImpl>& model,
                              const models::LlamaConfig& cfg, const FsdpOptions& options, int64_t batch_size,
                              int64_t seq_len, int steps, uint64_t seed);

// Measures the link between this process and the others of the job it was
// started in (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; one process per
// node): all-gathers of a small and a large buffer over our TCP group. Returns
// the rate of one node's link (bytes it sent to other nodes per second), the
// latency of a small all-gather, and the CPU time a process spent per byte it
// sent or received (the largest over the ranks). Collective over the job;
// every rank returns the same.
struct LinkCalibration {
  LinkSpec link;
  double host_cpu_s_per_byte = 0;
};
LinkCalibration calibrate_link(double seconds);
// The path between this node's own processes (--calibrate with
// --nproc-per-node > 1, which launches them): all-gathers over `group`, all of
// whose ranks run on this machine. Returns a process's intra-node rate (bytes
// it sent to the others per second), the latency of a small all-gather and the
// CPU per byte sent or received (the largest over the ranks). Collective.
LinkCalibration calibrate_local_link(const comm::ProcessGroupPtr& group, double seconds);
// The unit times and the optimizer's rate averaged over `group`'s ranks, which
// measured them at once (sharing this machine's cores as the run will). Collective.
void average_calibration(Calibration& calibration, comm::ProcessGroup& group);

// The cluster file's JSON (cluster_to_json) with the calibration (when given).
std::string calibration_file_json(const ClusterSpec& cluster, const std::optional<Calibration>& calibration);
// Reads `spec`: a preset name, or a JSON file (cluster_from_json) when a file
// of that name exists, read by the bounded reader (common/files.h: a regular
// file of at most kMaxJsonConfigBytes); the file's calibration, if it has one,
// into *calibration. `flag` names the file in errors. The calibration's unit
// times must be finite seconds in [0, kMaxUnitSeconds].
inline constexpr double kMaxUnitSeconds = 1e6;
ClusterSpec read_cluster(const std::string& spec, at::ScalarType compute_dtype,
                         std::optional<Calibration>* calibration, const std::string& flag = "--cluster");

// Unit costs from FLOPs: forward = forward_flops_per_token x tokens / (peak x
// efficiency); backward twice the forward of the trainable weights and once that
// of frozen ones (no weight gradient); recomputation = forward.
UnitCostFn flops_cost(const train::ModelConfigPtr& cfg, const ClusterSpec& cluster, int64_t tokens, int64_t seq_len);
// Unit costs from the model's counted work (ModelConfig::unit_work) on the
// cluster's roofline (Note [Device roofline] in src/plan/cluster.cpp):
// products / matmul_flops + FP8 products / fp8_matmul_flops (matmul_flops
// where 0) + attention / attention_flops + memory bytes / memory_bytes_per_s,
// each pass's time by class in UnitCompute. `shape`: the
// micro-batch (its checkpointed is set per unit). nullopt when the cluster has
// no product rate or bandwidth, or the family counts no work (flops_cost then).
std::optional<UnitCostFn> roofline_cost(const train::ModelConfigPtr& cfg, const ClusterSpec& cluster,
                                        const models::WorkShape& shape);
// Unit costs measured by --calibrate. UsageError when the run differs from
// the calibrated one (model, batch, sequence, precision, checkpointing) or
// a unit was not measured.
UnitCostFn calibrated_cost(const Calibration& cal, const std::string& model, int64_t batch_size, int64_t seq_len,
                           const std::string& mixed_precision, bool activation_checkpointing);

// The estimate for people (and with `units`, one line per unit), and as JSON
// (step_time_s, tokens_per_s, exposed_comm_s, mfu (null without a peak),
// scaling_efficiency, and the rest).
// `curve`: the same run at 1, 2, 4, ... nodes up to the cluster's (and it), as
// estimate_scaling computes each.
std::string estimate_text(const StepEstimate& e, const ClusterSpec& c, bool units,
                          const std::vector<std::pair<int, StepEstimate>>& curve);
std::string estimate_json(const StepEstimate& e, const ClusterSpec& c, const std::string& run, bool timeline,
                          const std::vector<std::pair<int, StepEstimate>>& curve);

}  // namespace fsdp::cli

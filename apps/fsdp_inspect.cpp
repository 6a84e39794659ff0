// fsdp-inspect: the sharding plan of a model without running it — units,
// flat-parameter sizes and padding, and per-rank memory — for any preset or
// Hugging Face config.json, 70B ones included (built on the meta device: no
// parameter memory is allocated and no process group is needed).
//
//   fsdp-inspect --model llama3.1-70b --world-size 64 --sharding full --mixed-precision bf16
//
// With --estimate, also the step-time model (fsdp/estimate.h) for the run that
// fsdp-train's flags describe, on a cluster (a preset or a JSON file):
//
//   fsdp-inspect --estimate --cluster p5.48xlarge --nnodes 16 --model llama3.1-70b --batch-size 1
//       --seq-len 8192 --mixed-precision bf16 --activation-checkpointing [--json]
//
// --calibrate FILE measures this machine's unit compute times for exactly that
// run and writes a cluster file; --calibrate-link FILE (one process per node,
// under torchrun or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) measures the link
// between nodes into it.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_numbers.h"
#include "config_flags.h"
#include "option_names.h"
#include "estimate_cli.h"
#include "train_options_table.h"
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/main.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/output_file.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/nn/freeze.h"
#include "fsdp/train/family_llama.h"
#include "fsdp/train/model_family.h"

namespace {

// Bounds of --estimate's cluster (far above any job: 100k GPUs), so that
// products of them stay small.
constexpr int kMaxNodes = 1 << 16;
constexpr int kMaxProcsPerNode = 1 << 10;
constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr int64_t kMaxGradAccum = 4096;  // micro-batches per step the estimate replays (70B: ~2 s)

// The command line: fsdp-inspect's own options (the plan's view, --estimate's cluster and calibration), and
// fsdp-train's flags, declared in fsdp-train's option table (apps/train_options_table.cpp): those that change a
// plan or an estimate bound into `t`, where fsdp-inspect reads them, every other accepted and ignored.
struct Args {
  fsdp::cli::TrainTargets t;  // the run: t.o (TrainOptions), t.flags (the words), t.run (launcher)
  int world_size = 8;
  int rank = 0;
  bool units = false;
  std::string hf_config_out;
  // --estimate: the cluster.
  bool estimate = false;
  std::string cluster_spec;
  double inter_gbps = 0, inter_latency_us = 0, intra_gbps = 0, intra_latency_us = 0;  // read when given
  double peak_tflops = 0, compute_efficiency = 0;
  bool json = false, timeline = false;
  std::string calibrate_file, calibrate_link_file;
  int calibrate_steps = 3;
  double calibrate_link_seconds = 4;
  fsdp::cli::IgnoredOptions ignored;  // fsdp-train's flags that change no plan
};

void add_plan_options(CLI::App& app, Args& a) {
  app.add_option("--world-size", a.world_size, "Data-parallel processes")->capture_default_str();
  app.add_option("--rank", a.rank, "Rank whose shard offsets to show")->capture_default_str();
  app.add_flag("--units", a.units, "List every unit");
  app.add_option("--write-hf-config", a.hf_config_out,
                 "Also write the model's Hugging Face config.json to this file (e.g. for a transformers baseline)");
}

void add_estimate_options(CLI::App& app, Args& a) {
  auto* est = app.add_option_group("Estimate", "Step time of the run fsdp-train's flags describe (--estimate)");
  est->add_flag("--estimate", a.estimate, "Predict the step time, tokens/s, exposed communication, MFU and scaling");
  est->add_option("--cluster", a.cluster_spec,
                  "Preset (p5.48xlarge|h100, p5en.48xlarge|h200, p4de.24xlarge|a100) or a cluster JSON file "
                  "(--calibrate writes one)");
  est->add_option("--inter-node-gbps", a.inter_gbps, "Override: one node's link to the others, Gbit/s each way");
  est->add_option("--inter-node-latency-us", a.inter_latency_us, "Override: latency of a collective between nodes");
  est->add_option("--intra-node-gbps", a.intra_gbps, "Override: a process's link inside its node, Gbit/s each way");
  est->add_option("--intra-node-latency-us", a.intra_latency_us, "Override: latency inside a node");
  est->add_option("--peak-tflops", a.peak_tflops, "Override: a process's dense peak at the compute dtype");
  est->add_option("--compute-efficiency", a.compute_efficiency, "Override: fraction of the peak units reach");
  est->add_flag("--json", a.json, "Print the estimate as JSON (step_time_s, tokens_per_s, exposed_comm_s, mfu, ...)");
  est->add_flag("--timeline", a.timeline, "With --json: the replayed schedule of the last micro-batch");
  est->add_option("--calibrate", a.calibrate_file,
                  "Measure this machine's unit compute times for this run (--model, --batch-size, --seq-len, "
                  "precision, checkpointing) and write a cluster file");
  est->add_option("--calibrate-steps", a.calibrate_steps, "Measured steps of --calibrate (medians)")
      ->capture_default_str();
  est->add_option("--calibrate-link", a.calibrate_link_file,
                  "Measure the inter-node link from this job of one process per node and write (or update) the "
                  "cluster file (rank 0)");
  est->add_option("--calibrate-link-seconds", a.calibrate_link_seconds, "About how long --calibrate-link measures")
      ->capture_default_str();
}

// --calibrate-link FILE: one process per node of a job measures, and rank 0 writes the link into the file.
int calibrate_link(const Args& a, at::ScalarType compute_dtype) {
  // Read (when it exists) and rewritten: a regular file or nothing yet.
  if (fsdp::check_output_writable(a.calibrate_link_file, "--calibrate-link") != fsdp::OutputTarget::kNew) {
    fsdp::require_regular_file(a.calibrate_link_file, "--calibrate-link",
                               "give a cluster JSON file to update, or a new file's path");
  }
  const fsdp::cli::LinkCalibration measured = fsdp::cli::calibrate_link(a.calibrate_link_seconds);
  const fsdp::LinkSpec& link = measured.link;
  if (fsdp::comm::detect_world().rank == 0) {
    std::optional<fsdp::cli::Calibration> calibration;
    fsdp::ClusterSpec c;
    c.name = "calibrated";
    if (fsdp::check_output_target(a.calibrate_link_file, "--calibrate-link") != fsdp::OutputTarget::kNew) {
      c = fsdp::cli::read_cluster(a.calibrate_link_file, compute_dtype, &calibration, "--calibrate-link");
    }
    c.inter = link;
    c.host_cpu_s_per_byte = measured.host_cpu_s_per_byte;
    fsdp::write_output_file(a.calibrate_link_file, fsdp::cli::calibration_file_json(c, calibration) + "\n",
                            "--calibrate-link");
    std::cout << fmt::format("Link: {:.4g} Gbit/s per node, latency {:.1f} us, {:.3g} ns of CPU per byte moved -> "
                             "{}\n", link.bytes_per_s * 8 / 1e9, link.latency_s * 1e6,
                             measured.host_cpu_s_per_byte * 1e9, a.calibrate_link_file);
  }
  return 0;
}

// --estimate / --calibrate: the cluster of the run (a preset or file, the flags' overrides); sets a.world_size.
fsdp::ClusterSpec estimate_cluster(const CLI::App& app, Args& a, at::ScalarType compute_dtype,
                                   std::optional<fsdp::cli::Calibration>& calibration) {
  FSDP_CHECK(a.t.run.nnodes >= 1 && a.t.run.nnodes <= kMaxNodes, "--nnodes must be in [1, ", kMaxNodes, "], got ",
             a.t.run.nnodes);
  FSDP_CHECK(app.count("--nproc-per-node") == 0 || (a.t.run.nproc >= 1 && a.t.run.nproc <= kMaxProcsPerNode),
             "--nproc-per-node must be in [1, ", kMaxProcsPerNode, "], got ", a.t.run.nproc);
  // Rates must be positive, latencies and the peak non-negative, all of them
  // within what a machine can be (fsdp/estimate.h: the replay's sane ranges).
  const auto in_range = [&](const char* flag, double v, double lo, bool lo_ok, double hi) {
    FSDP_CHECK(app.count(flag) == 0 || (std::isfinite(v) && (lo_ok ? v >= lo : v > lo) && v <= hi), flag,
               " must be in ", lo_ok ? "[" : "(", lo, ", ", hi, "], got ", v);
  };
  in_range("--inter-node-gbps", a.inter_gbps, fsdp::kMinLinkGbps, true, fsdp::kMaxLinkGbps);
  in_range("--intra-node-gbps", a.intra_gbps, fsdp::kMinLinkGbps, true, fsdp::kMaxLinkGbps);
  in_range("--inter-node-latency-us", a.inter_latency_us, 0, true, fsdp::kMaxLatencyUs);
  in_range("--intra-node-latency-us", a.intra_latency_us, 0, true, fsdp::kMaxLatencyUs);
  in_range("--peak-tflops", a.peak_tflops, 0, true, fsdp::kMaxPeakTflops);
  in_range("--compute-efficiency", a.compute_efficiency, 0, false, 1);
  fsdp::ClusterSpec cluster;
  if (!a.calibrate_file.empty()) {
    cluster.name = "calibrated";
    if (!a.cluster_spec.empty()) cluster = fsdp::cli::read_cluster(a.cluster_spec, compute_dtype, nullptr);
    cluster.algorithm = fsdp::CollectiveAlgorithm::kMesh;
    cluster.execution = fsdp::Execution::kHost;
    // Measured unit times include the engine's casts: no device roofline on top of them.
    cluster.matmul_flops = cluster.attention_flops = cluster.memory_bytes_per_s = 0;
    cluster.procs_per_node = a.t.run.nproc > 0 ? a.t.run.nproc : 1;
  } else {
    FSDP_CHECK(!a.cluster_spec.empty(), "--estimate needs --cluster: a preset (",
               [] {
                 std::string s;
                 for (const auto& n : fsdp::cluster_preset_names()) s += (s.empty() ? "" : ", ") + n;
                 return s;
               }(),
               ") or a cluster JSON file (fsdp-inspect --calibrate FILE measures this machine)");
    cluster = fsdp::cli::read_cluster(a.cluster_spec, compute_dtype, &calibration);
  }
  if (a.t.run.nproc > 0) cluster.procs_per_node = a.t.run.nproc;
  cluster.nodes = a.t.run.nnodes;
  if (app.count("--inter-node-gbps") > 0) cluster.inter.bytes_per_s = a.inter_gbps * 1e9 / 8;
  if (app.count("--inter-node-latency-us") > 0) cluster.inter.latency_s = a.inter_latency_us * 1e-6;
  if (app.count("--intra-node-gbps") > 0) cluster.intra.bytes_per_s = a.intra_gbps * 1e9 / 8;
  if (app.count("--intra-node-latency-us") > 0) cluster.intra.latency_s = a.intra_latency_us * 1e-6;
  if (app.count("--peak-tflops") > 0) cluster.peak_flops = a.peak_tflops * 1e12;
  if (app.count("--compute-efficiency") > 0) cluster.compute_efficiency = a.compute_efficiency;
  FSDP_CHECK(static_cast<int64_t>(cluster.nodes) * cluster.procs_per_node <= kMaxWorld, "--nnodes ", cluster.nodes,
             " x --nproc-per-node ", cluster.procs_per_node, " is more than ", kMaxWorld, " processes");
  const int estimated_world = cluster.nodes * cluster.procs_per_node;
  FSDP_CHECK(app.count("--world-size") == 0 || a.world_size == estimated_world, "--world-size ", a.world_size,
             " differs from --nnodes x --nproc-per-node = ", estimated_world, "; give one or the other");
  a.world_size = estimated_world;
  return cluster;
}

// The run's flags that fsdp-inspect uses, refused where fsdp-train refuses
// them (issue 50): a plan of a run that cannot start is no plan. Values only
// an estimate reads (a cluster's size, --grad-accum's replay) are checked there.
void check_run_shape(const Args& a) {
  const fsdp::train::TrainOptions& o = a.t.o;
  FSDP_CHECK(o.step.batch_size >= 1, "--batch-size must be >= 1, got ", o.step.batch_size);
  FSDP_CHECK(o.step.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.step.grad_accum);
  FSDP_CHECK(o.data.seq_len >= 1, "--seq-len must be >= 1, got ", o.data.seq_len);
  // A plan needs a model's config, not its weights (plan before downloading them): the directory must exist.
  std::error_code ec;
  FSDP_CHECK(o.hf.init_from.empty() || std::filesystem::is_directory(o.hf.init_from, ec), "--init-from ",
             o.hf.init_from, " is not a directory; give a Hugging Face model directory (config.json and "
             "*.safetensors) or a PyTorch distributed checkpoint");
}

// --calibrate measures Llama-family models: refused before anything is
// printed, measured or started (issue 50).
void check_calibratable(const CLI::App& app, const Args& a) {
  if (a.calibrate_file.empty()) return;
  const std::string model = !a.t.o.hf.init_from.empty() && app.count("--model") == 0 ? a.t.o.hf.init_from : a.t.o.model;
  const fsdp::train::ModelConfigPtr cfg = fsdp::train::resolve_model(model);
  FSDP_CHECK(fsdp::train::as_llama(*cfg) != nullptr, "--calibrate measures Llama-family models; model '", cfg->name(),
             "' is a ", cfg->family().name(), " — estimate it from FLOPs with --cluster and --peak-tflops");
}

// The model on the meta device, wrapped and planned as fsdp-train would.
struct Planned {
  fsdp::train::ModelConfigPtr cfg;
  std::shared_ptr<torch::nn::Module> impl;
  fsdp::train::RootedModel root;
  fsdp::FsdpOptions o;
  fsdp::ShardingPlan plan;
  int64_t lora_params = 0;
  // Where the run computes: a cluster that runs on devices (a GPU preset) is CUDA's, else --device.
  at::DeviceType device = at::kCPU;
};

// The engine's options of the run: fsdp-train's own, through the one function
// that turns the trainer's options into the engine's (train::engine_options:
// the units kept after forward, activation checkpointing and its policy, the
// offloads), with the shard group an estimate's cluster implies.
fsdp::FsdpOptions plan_options(const Args& a, const fsdp::train::ModelConfig& cfg, bool estimating,
                               const fsdp::ClusterSpec& cluster) {
  fsdp::train::TrainOptions run = a.t.o;
  const int hybrid = run.fsdp.hybrid_shard_size;
  run.fsdp.hybrid_shard_size = hybrid > 0 ? hybrid : estimating ? cluster.procs_per_node : a.world_size;
  return fsdp::train::engine_options(run, &cfg, a.world_size);
}

Planned plan_model(const CLI::App& app, Args& a, bool estimating, const fsdp::ClusterSpec& cluster) {
  Planned p;
  // As fsdp-train: --init-from DIR without --model plans DIR's config.json.
  if (!a.t.o.hf.init_from.empty() && app.count("--model") == 0) a.t.o.model = a.t.o.hf.init_from;
  p.cfg = fsdp::train::resolve_model(a.t.o.model);
  const std::optional<int64_t> longest = p.cfg->max_seq_len();
  FSDP_CHECK(!longest || a.t.o.data.seq_len <= *longest, "--seq-len ", a.t.o.data.seq_len, " is longer than model '",
             p.cfg->name(), "' supports (max_position_embeddings = ", longest.value_or(0), "); use --seq-len <= ",
             longest.value_or(0));
  // Note [Output targets]: a device or FIFO is written in place, a regular file replaced atomically.
  if (!a.hf_config_out.empty()) {
    fsdp::write_output_file(a.hf_config_out, p.cfg->hf_config_json() + "\n", "--write-hf-config");
  }
  p.impl = p.cfg->make(at::TensorOptions().device(at::kMeta), 0);
  if (a.t.o.lora.rank != 0) {
    fsdp::models::LoraConfig lc;
    lc.rank = a.t.o.lora.rank;
    lc.alpha = 2.0 * static_cast<double>(a.t.o.lora.rank);
    lc.targets = a.t.o.lora.targets;
    fsdp::models::apply_lora(*p.impl, lc, 0);
    for (const auto& param : p.impl->named_parameters(true)) {
      if (fsdp::models::is_lora_parameter(param.key())) p.lora_params += param.value().numel();
    }
  }
  if (!a.t.o.freeze.empty()) fsdp::nn::freeze_matching(*p.impl, a.t.o.freeze);  // after LoRA, as fsdp-train
  p.root = p.cfg->root(p.impl);
  p.o = plan_options(a, *p.cfg, estimating, cluster);
  p.device = estimating && cluster.execution == fsdp::Execution::kDevice ? at::kCUDA
                                                                         : a.t.o.device.type();
  fsdp::check_options(p.o, a.world_size);
  const bool pure = a.t.o.fsdp.mixed_precision.master_dtype == at::kBFloat16;
  p.plan = fsdp::plan_sharding(p.root.root, a.world_size, a.rank, p.o, pure ? at::kBFloat16 : at::kFloat);
  return p;
}

void print_plan(std::ostream& out, const Args& a, const Planned& p, bool estimating) {
  const fsdp::train::ModelConfig& cfg = *p.cfg;
  const fsdp::FsdpOptions& o = p.o;
  const fsdp::ShardingPlan& plan = p.plan;
  out << cfg.summary() << "\n"
      << fmt::format("{} over {} ranks, wrap {}, {} (param {}, reduce {}, master {}){}\n", fsdp::to_string(o.strategy),
                     a.world_size, fsdp::to_string(a.t.o.fsdp.wrap), o.mixed_precision.preset_name(),
                     c10::toString(o.mixed_precision.param_dtype), c10::toString(o.mixed_precision.reduce_dtype),
                     c10::toString(o.mixed_precision.master_dtype), a.t.o.fsdp.cpu_offload ? ", CPU offload" : "")
      << plan.describe();
  if (a.t.o.lora.rank != 0) {
    out << fmt::format("  LoRA rank {} on {}: {} adapter parameters ({:.3f}% of the model's {})\n", a.t.o.lora.rank,
                       fmt::join(a.t.o.lora.targets, ","), p.lora_params, 100.0 * static_cast<double>(p.lora_params) /
                           static_cast<double>(cfg.num_parameters()), cfg.num_parameters());
  }
  const fsdp::models::LlamaConfig* llama = fsdp::train::as_llama(cfg);  // its Llama-only notes
  if (llama != nullptr && llama->moe()) {
    const fsdp::models::LlamaConfig& l = *llama;
    // Every rank holds 1/shard of every expert; a decoder layer gathers all E of
    // them, and each token computes with K.
    out << fmt::format("  mixture of experts: {} experts per layer, {} per token: {} parameters, {} active per "
                       "token ({:.1f}%); per rank {} of them in shards\n",
                       l.num_local_experts, l.num_experts_per_tok, l.num_parameters(), l.active_parameters(),
                       100.0 * static_cast<double>(l.active_parameters()) / static_cast<double>(l.num_parameters()),
                       (l.num_parameters() + plan.shard_size - 1) / plan.shard_size);
  }
  const int64_t resident = plan.param_shard_bytes + plan.grad_shard_bytes + plan.optimizer_bytes;
  out << fmt::format("  total per rank without activations: {} ({} resident{} + {} during a step)\n",
                     fsdp::format_bytes(resident + plan.step_unsharded_bytes), fsdp::format_bytes(resident),
                     a.t.o.fsdp.cpu_offload ? " in host memory" : "",
                     fsdp::format_bytes(plan.step_unsharded_bytes));
  // The loss never holds a micro-batch's whole logits (models/chunked_loss.h):
  // what it takes does not grow with the batch beyond one chunk, the run's chunk on the run's device.
  const int64_t loss_rows = fsdp::models::loss_chunk_rows(a.t.o.step.loss_chunk_rows, cfg.vocab_size(), p.device);
  out << fmt::format("  loss: {} tokens per chunk of logits{}: at most {} during a step (one chunk's logits "
                     "and their gradient, the output head's gradient)\n",
                     loss_rows, a.t.o.step.loss_chunk_rows > 0 ? " (--loss-chunk-rows)"
                                : p.device == at::kCUDA ? " (CUDA's chunk)" : "",
                     fsdp::format_bytes(fsdp::models::chunked_loss_bytes(loss_rows, cfg.vocab_size(),
                                                                         cfg.hidden_size(),
                                                                         o.mixed_precision.param_dtype,
                                                                         a.t.o.step.kernels)));
  // fsdp-inspect plans for any machine (a 70B model over 64 GPUs elsewhere), so a
  // plan beyond this machine is no error; fsdp-train refuses such a run.
  const int64_t here = fsdp::available_host_memory_bytes();
  if (!a.t.o.fsdp.cpu_offload && !estimating && here >= 0 && resident + plan.step_unsharded_bytes > here) {
    std::cerr << fmt::format("fsdp-inspect: note: one rank needs {} without activations, more than the {} of host "
                             "memory available here (fine when planning for GPUs or other machines; fsdp-train "
                             "--device cpu refuses such a run on this machine)\n",
                             fsdp::format_bytes(resident + plan.step_unsharded_bytes), fsdp::format_bytes(here));
  }
}

// --calibrate FILE: this machine's unit compute times for the run, written as a cluster file. Returns
// false on a rank other than 0 of a --nproc-per-node calibration, which has nothing more to do.
bool calibrate_compute(const Args& a, const Planned& p, fsdp::ClusterSpec& cluster,
                       std::optional<fsdp::cli::Calibration>& calibration) {
  const fsdp::models::LlamaConfig* llama = fsdp::train::as_llama(*p.cfg);
  FSDP_ASSERT(llama != nullptr, "check_calibratable let a ", p.cfg->family().name(), " through");
  std::cerr << fmt::format("fsdp-inspect: calibrating: {} steps of {} on this machine, batch {} x {} tokens, {} "
                           "threads\n", a.calibrate_steps + 1, a.t.o.model, a.t.o.step.batch_size, a.t.o.data.seq_len,
                           at::get_num_threads());
  auto real = std::make_shared<fsdp::models::LlamaForCausalLMImpl>(*llama, at::TensorOptions().device(at::kMeta),
                                                                   a.t.o.step.seed);
  fsdp::cli::Calibration cal = fsdp::cli::calibrate_compute(real, *llama, p.o, a.t.o.step.batch_size,
                                                            a.t.o.data.seq_len, a.calibrate_steps, a.t.o.step.seed);
  if (a.t.run.nproc > 1) {
    // Note [Calibrating a node]
    // The --nproc-per-node processes measured their units at the same time,
    // on the cores the run will share; now the path between them (our TCP
    // group, shared memory where it applies) and the CPU it costs. Each
    // unit's time is the mean over the processes; rank 0 writes the file.
    const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(fsdp::comm::detect_world());
    fsdp::cli::average_calibration(cal, *rt.world_group);
    const fsdp::cli::LinkCalibration local = fsdp::cli::calibrate_local_link(rt.world_group, a.calibrate_link_seconds);
    cluster.intra = local.link;
    cluster.host_cpu_s_per_byte = local.host_cpu_s_per_byte;
    rt.world_group->barrier(std::chrono::minutes(1));
    if (rt.world_group->rank() != 0) return false;
    std::cerr << fmt::format("fsdp-inspect: between the {} processes: {:.4g} Gbit/s per process, latency {:.1f} "
                             "us, {:.3g} ns of CPU per byte moved\n", a.t.run.nproc, local.link.bytes_per_s * 8 / 1e9,
                             local.link.latency_s * 1e6, local.host_cpu_s_per_byte * 1e9);
  }
  cal.model = a.t.o.model;
  cal.mixed_precision = a.t.o.fsdp.mixed_precision.preset_name();
  cal.activation_checkpointing = a.t.o.activation_checkpointing;
  cluster.optimizer_s_per_element = cal.optimizer_s_per_element;
  calibration = cal;
  fsdp::write_output_file(a.calibrate_file, fsdp::cli::calibration_file_json(cluster, calibration) + "\n",
                          "--calibrate");
  std::cerr << "fsdp-inspect: wrote " << a.calibrate_file << "\n";
  return true;
}

// The step time of the run on `cluster`, from one node up to its own count, printed (text or --json).
void estimate_step(const Args& a, Planned& p, const fsdp::ClusterSpec& cluster, const fsdp::UnitCostFn& cost) {
  fsdp::StepWorkload w;
  w.batch_size = a.t.o.step.batch_size;
  w.seq_len = a.t.o.data.seq_len;
  w.grad_accum = fsdp::train::at_world_size(a.t.o, a.world_size).step.grad_accum;  // --global-batch-size
  w.model_flops_per_token = p.cfg->training_flops_per_token(a.t.o.data.seq_len);
  fsdp::FsdpOptions& o = p.o;
  o.hybrid_shard_size = a.t.o.fsdp.hybrid_shard_size;  // 0: one node, as fsdp-train
  const fsdp::StepEstimate e = fsdp::estimate_scaling(p.root.root, o, cluster, w, cost);
  // The same run from one node up: 1, 2, 4, ... and the cluster's own count.
  std::vector<std::pair<int, fsdp::StepEstimate>> curve;
  for (int n = 1; n < cluster.nodes; n *= 2) {
    fsdp::ClusterSpec smaller = cluster;
    smaller.nodes = n;
    if (o.strategy == fsdp::ShardingStrategy::kHybridShard && o.hybrid_shard_size > 0 &&
        (n * cluster.procs_per_node) % o.hybrid_shard_size != 0) {
      continue;  // a shard group that does not fit n nodes
    }
    curve.emplace_back(n, fsdp::estimate_scaling(p.root.root, o, smaller, w, cost));
  }
  if (cluster.nodes > 1) curve.emplace_back(cluster.nodes, e);
  const std::string run = fmt::format(
      "{} {} {}{}{}{} batch {} x seq {}{} on {} x {}", a.t.o.model, fsdp::to_string(a.t.o.fsdp.strategy),
      a.t.o.fsdp.mixed_precision.preset_name(),
      a.t.o.activation_checkpointing
          ? fmt::format(" activation-checkpointing {}", fsdp::nn::to_string(a.t.o.fsdp.checkpoint_policy))
          : std::string(),
      a.t.o.step.kernels == fsdp::models::LayerKernels::kFused ? " fused-kernels" : "",
      a.t.o.step.fp8_linear == fsdp::models::Fp8Linear::kRowwise ? " fp8-rowwise" : "", a.t.o.step.batch_size,
      a.t.o.data.seq_len, a.t.o.step.grad_accum > 1 ? fmt::format(" x accum {}", a.t.o.step.grad_accum) : std::string(),
      cluster.nodes, cluster.procs_per_node);
  if (a.json) {
    std::cout << fsdp::cli::estimate_json(e, cluster, run, a.timeline, curve) << "\n";
  } else {
    std::cout << fsdp::cli::estimate_text(e, cluster, a.units, curve);
  }
}

// What the estimate makes of the model's levers (--kernels, --fp8-linear; docs/estimate.md, "The GPU
// roofline"), said in the cluster's notes, which the output prints as its assumptions. With a roofline,
// the optimizer's bytes per element (kOptimizerBytesPerElement) include a clipping pass only where
// fsdp-train runs one: --clip-grad > 0 without --kernels fused (which clips inside the AdamW kernel).
void note_model_levers(const Args& a, const fsdp::models::WorkShape& shape, bool roofline,
                       fsdp::ClusterSpec& cluster) {
  const bool fused = shape.kernels == fsdp::models::LayerKernels::kFused;
  const auto note = [&](const std::string& line) { cluster.notes += (cluster.notes.empty() ? "" : "; ") + line; };
  if (!roofline) {
    if (fused || shape.fp8_linears) {
      note("--kernels and --fp8-linear are not modelled here (no roofline: the unit costs are FLOPs at one "
           "efficiency or a calibration)");
    }
    return;
  }
  if (fused || a.t.o.step.clip_grad <= 0) {
    cluster.optimizer_s_per_element *=
        (fsdp::kOptimizerBytesPerElement - fsdp::kClipBytesPerElement) / fsdp::kOptimizerBytesPerElement;
    note(fmt::format("{}: no clipping pass over the gradients ({} of the optimizer's {} bytes per element)",
                     fused && a.t.o.step.clip_grad > 0 ? "--kernels fused clips inside the AdamW kernel"
                                                       : "--clip-grad 0",
                     fsdp::kClipBytesPerElement, fsdp::kOptimizerBytesPerElement));
  }
  if (shape.fp8_linears && cluster.fp8_matmul_flops <= 0) {
    note(fmt::format("--fp8-linear rowwise: the cluster states no FP8 product rate (fp8_matmul_tflops), so FP8 "
                     "products are timed at the compute dtype's {:.4g} TFLOP/s (no speed-up; their quantization "
                     "still costs memory traffic)", cluster.matmul_flops / 1e12));
  }
}

// --estimate (and --calibrate): checks the run's shape, measures or models the units' costs, estimates.
int estimate(const Args& a, Planned& p, fsdp::ClusterSpec& cluster,
             std::optional<fsdp::cli::Calibration>& calibration) {
  // The run's shape was checked with the plan (check_run_shape); what the replay adds:
  FSDP_CHECK(a.t.o.step.batch_size <= (int64_t{1} << 30), "--batch-size ", a.t.o.step.batch_size,
             " is beyond any run (at most 2^30)");
  // Every micro-batch is replayed: 2^30 of them never returned (issue 39).
  FSDP_CHECK(a.t.o.step.grad_accum <= kMaxGradAccum, "--grad-accum ", a.t.o.step.grad_accum,
             " is beyond any run (at most ", kMaxGradAccum, ")");
  if (!a.calibrate_file.empty() && !calibrate_compute(a, p, cluster, calibration)) return 0;
  fsdp::UnitCostFn cost;
  if (calibration) {
    cluster.memory_bytes_per_s = 0;  // the measured units include the engine's casts
    cluster.optimizer_s_per_element = calibration->optimizer_s_per_element > 0 ? calibration->optimizer_s_per_element
                                                                               : cluster.optimizer_s_per_element;
    cost = fsdp::cli::calibrated_cost(*calibration, a.t.o.model, a.t.o.step.batch_size, a.t.o.data.seq_len,
                                      a.t.o.fsdp.mixed_precision.preset_name(), a.t.o.activation_checkpointing);
  } else {
    fsdp::models::WorkShape shape;
    shape.tokens = a.t.o.step.batch_size * a.t.o.data.seq_len;
    shape.seq_len = a.t.o.data.seq_len;
    shape.activation_bytes = static_cast<int64_t>(c10::elementSize(a.t.o.fsdp.mixed_precision.param_dtype));
    // p.device: the cluster's device when it runs on devices, as the plan's loss chunk.
    shape.loss_chunk_rows = fsdp::models::loss_chunk_rows(a.t.o.step.loss_chunk_rows, p.cfg->vocab_size(), p.device);
    shape.policy = a.t.o.fsdp.checkpoint_policy;
    shape.kernels = a.t.o.step.kernels;
    shape.fp8_linears = a.t.o.step.fp8_linear == fsdp::models::Fp8Linear::kRowwise;
    const std::optional<fsdp::UnitCostFn> roofline = fsdp::cli::roofline_cost(p.cfg, cluster, shape);
    cost = roofline ? *roofline : fsdp::cli::flops_cost(p.cfg, cluster, shape.tokens, shape.seq_len);
    note_model_levers(a, shape, roofline.has_value(), cluster);
  }
  estimate_step(a, p, cluster, cost);
  return 0;
}

// Parses the command line into `a`; an exit code when the program ends here (help, usage error).
std::optional<int> parse_command_line(CLI::App& app, Args& a, int argc, char** argv) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_plan_options(app, a);
  add_estimate_options(app, a);
  // fsdp-train's flags (train_options_table.h), declared there only: those that
  // change a plan or an estimate bound into a.t, every other accepted, so that a
  // run's command line can be pasted after --estimate, and named once below.
  fsdp::cli::register_inspect_train_options(app, a.t, a.ignored);
  fsdp::cli::strict_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "fsdp-inspect: error: " << e.what() << " (see fsdp-inspect --help)\n";
    return fsdp::kExitUsage;
  }
  // --config FILE: fsdp-train's configuration file sets what fsdp-inspect uses,
  // as on fsdp-train's command line (flags given win); its other keys are
  // checked to be fsdp-train's and named in the note below (issue 50).
  std::vector<std::string> ignored_in_config;
  if (app.count("--config") > 0) {
    std::vector<std::string> ignored_names;
    for (const auto& [name, opt] : a.ignored.options) ignored_names.push_back(name);
    fsdp::cli::apply_config_file(app, a.t.run.config_file, ignored_names, &ignored_in_config);
  }
  // --nproc-per-node means fsdp-train's processes per node; not given, an estimate
  // takes the cluster's (its GPUs per node) where fsdp-train would start one: 0 below.
  if (app.count("--nproc-per-node") == 0) a.t.run.nproc = 0;
  // Said once: not again by the workers of --calibrate --nproc-per-node (launch_self marks them
  // FSDP_LAUNCHER=fsdp-train), and by rank 0 alone under another launcher.
  const fsdp::comm::WorldInfo w = fsdp::comm::detect_world();
  std::string given = a.ignored.given();
  if (!ignored_in_config.empty()) {
    std::string keys;
    for (const auto& k : ignored_in_config) keys += (keys.empty() ? "" : ", ") + k;
    given += (given.empty() ? "" : "; ") + keys + " (from --config)";
  }
  if (!given.empty() && w.launcher != "fsdp-train" && w.rank == 0) {
    std::cerr << "fsdp-inspect: note: ignored by fsdp-inspect: " << given << " (no effect on a plan or estimate)\n";
  }
  return std::nullopt;
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"fsdp-inspect: the FSDP sharding plan and per-rank memory of a model, without running it. "
               "fsdp-train's flags that change a plan or an estimate mean what they mean to fsdp-train (their help "
               "below is fsdp-train's; --nproc-per-node not given: the cluster's GPUs per node; --seed also seeds "
               "--calibrate's model and batch); every other fsdp-train flag is accepted and ignored (fsdp-train "
               "--list-options: inspect \"ignores\")."};
  if (const std::optional<int> done = parse_command_line(app, a, argc, argv)) return *done;
  const bool estimating = a.estimate || !a.calibrate_file.empty() || !a.calibrate_link_file.empty();
  check_run_shape(a);
  check_calibratable(app, a);
  std::optional<fsdp::cli::Calibration> calibration;
  fsdp::ClusterSpec cluster;
  const at::ScalarType compute_dtype = a.t.o.fsdp.mixed_precision.param_dtype;
  FSDP_CHECK(a.calibrate_steps >= 1 && a.calibrate_steps <= 1000, "--calibrate-steps must be in [1, 1000], got ",
             a.calibrate_steps);
  FSDP_CHECK(std::isfinite(a.calibrate_link_seconds) && a.calibrate_link_seconds > 0 && a.calibrate_link_seconds <= 600,
             "--calibrate-link-seconds must be in (0, 600], got ", a.calibrate_link_seconds);
  // Where a measurement goes is checked before measuring: a FIFO, a device or a
  // missing directory is refused at once, not after minutes (issue 39).
  if (!a.calibrate_file.empty()) fsdp::check_output_writable(a.calibrate_file, "--calibrate");
  if (!a.calibrate_file.empty() && a.t.run.nproc > 1) {
    // Note [Calibrating a node]: the run's processes measure at once, then the
    // path between them; started here as a local job, as fsdp-train's --nproc-per-node.
    const fsdp::comm::WorldInfo w = fsdp::comm::detect_world();
    if (w.launcher == "single") {
      fsdp::comm::LaunchOptions lo;
      lo.nproc = a.t.run.nproc;
      return fsdp::comm::launch_self("fsdp-inspect", argc, argv, lo);
    }
    FSDP_CHECK(w.world_size == a.t.run.nproc && w.local_world_size == a.t.run.nproc,
               "--calibrate with --nproc-per-node ", a.t.run.nproc, " starts its own ", a.t.run.nproc,
               " processes on this machine; this process is rank ", w.rank, " of ", w.world_size,
               " started by another launcher: run fsdp-inspect --calibrate directly");
  }
  if (!a.calibrate_link_file.empty()) return calibrate_link(a, compute_dtype);
  if (estimating) cluster = estimate_cluster(app, a, compute_dtype, calibration);
  FSDP_CHECK(a.world_size >= 1, "--world-size must be >= 1 (the number of processes), got ", a.world_size);
  FSDP_CHECK(a.rank >= 0 && a.rank < a.world_size, "--rank ", a.rank, " is outside [0, --world-size ", a.world_size,
             ") — give a rank below the world size");
  FSDP_CHECK(a.t.o.fsdp.hybrid_shard_size >= 0, "--hybrid-shard-size must be >= 1 (or 0: the world size), got ",
             a.t.o.fsdp.hybrid_shard_size);
  Planned p = plan_model(app, a, estimating, cluster);
  std::ostringstream discarded;  // --estimate --json prints the JSON alone
  print_plan(estimating && a.json ? static_cast<std::ostream&>(discarded) : std::cout, a, p, estimating);
  if (estimating) return estimate(a, p, cluster, calibration);
  if (a.units) {
    for (const auto& u : p.plan.units) {
      std::cout << fmt::format("  unit {:<24} {:>4} params {:>14} elements  padded {:>14}  shard {:>12} at {}{}{}\n",
                               u.name.empty() ? "<root>" : u.name, u.params.size(), u.numel, u.padded_numel,
                               u.shard_numel, u.shard_offset, u.checkpointed ? "  checkpointed" : "",
                               u.trainable ? "" : "  frozen");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fsdp::run_main("fsdp-inspect", [&] { return fsdp::cli::with_flag_names([&] { return run(argc, argv); }); });
}

// Cluster descriptions for the step-time model (fsdp/estimate.h): the presets
// (data-sheet rates times stated efficiencies) and the JSON file that
// fsdp-inspect --calibrate writes and --cluster reads.
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/estimate.h"

namespace fsdp {

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

// Note [Device roofline]
// On a GPU a step's compute is timed by operation class (the model's own
// count of its work, models/op_work.h, Note [Counted work] for Llama):
// matrix products at the card's product rate, attention at flash attention's,
// and every other kernel (norms, rotary, SwiGLU, residual sums, casts, the
// loss's softmax over the vocabulary) at the memory bandwidth, by the bytes it
// moves; the optimizer streams its state at the same bandwidth. The rates:
//  - products: kMatmulFraction of the data sheet's dense peak at the compute
//    dtype. Measured, not assumed: 791.6 TFLOP/s of bf16 products of two
//    8192 x 8192 matrices on an H200 (989.4 dense), bench/gpu/matmul_peak.py in
//    the run of bench/RESULTS.md, "First GPU run". The H100 SXM5 has the same
//    chip and clocks; the A100 is given the same fraction (not measured).
//  - FP8 products (--fp8-linear rowwise): kMatmulFraction of the data sheet's
//    dense FP8 peak (H100 / H200: 1978.9 TFLOP/s), the bf16 fraction assumed
//    for rowwise-scaled _scaled_mm, not measured (bench/gpu/matmul_peak.py
//    measures it where a run has a card: fp8_matmul_tflops). The A100 has no
//    FP8 tensor cores: 0, and fsdp-inspect times FP8 products at the bf16 rate.
//  - attention: kAttentionFraction of the dense peak: FlashAttention-2 (which
//    PyTorch's scaled_dot_product_attention runs on these cards) reaches about
//    35% of an H100's peak (FlashAttention-3, Shah et al. 2024, section 1).
//  - memory: kHbmEfficiency of the data sheet's HBM bandwidth, what streaming
//    kernels (a copy, an add) reach on these cards.
// A kernel's own launch and tail, the host's dispatch, and a product's shape
// (the measured rate is of large square ones) are not modelled: the estimate
// is the step the kernels' work allows. Where a run measured its card, the
// cluster file carries its own rates (matmul_tflops, fp8_matmul_tflops,
// attention_tflops, memory_gbyte_per_s) in place of these.
// Stated efficiencies (what fraction of a data-sheet rate is assumed reached).
constexpr double kComputeEfficiency = 0.6;  // without a roofline (a family that counts no work): FLOPs at this of peak
constexpr double kMatmulFraction = 791.6 / 989.4;  // measured on an H200 (above)
constexpr double kAttentionFraction = 0.35;  // FlashAttention-2 on an H100 (above)
constexpr double kNvlinkEfficiency = 0.8;   // NCCL all-gather / reduce-scatter bus bandwidth over NVLink
constexpr double kEfaEfficiency = 0.7;      // NCCL over EFA (libfabric), large messages
constexpr double kHbmEfficiency = 0.8;      // streaming kernels: the optimizer, elementwise operations
// The optimizer: kOptimizerBytesPerElement (fsdp/estimate.h) with clipping at fsdp-train's default 1.0.
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
    c.matmul_flops = c.peak_flops * kMatmulFraction;
    const double fp8_peak = peak_flops(p.gpu, at::kFloat8_e4m3fn);
    c.fp8_matmul_flops = fp8_peak * kMatmulFraction;
    c.attention_flops = c.peak_flops * kAttentionFraction;
    c.memory_bytes_per_s = p.hbm_tbyte_s * 1e12 * kHbmEfficiency;
    c.optimizer_s_per_element = kOptimizerBytesPerElement / c.memory_bytes_per_s;
    c.notes = detail::cat(p.what, "; assumed: products at ", c.matmul_flops / 1e12, " TFLOP/s (",
                          std::round(kMatmulFraction * 100) / 100, " of the dense ", c10::toString(compute_dtype), " peak ", c.peak_flops / 1e12,
                          ", as measured on an H200), ",
                          fp8_peak > 0 ? detail::cat("FP8 products at ", c.fp8_matmul_flops / 1e12,
                                                     " TFLOP/s (the same fraction of the dense FP8 peak ",
                                                     fp8_peak / 1e12, ", not measured), ")
                                       : std::string("no FP8 products (the card has none), "),
                          "attention at ", kAttentionFraction, " of the peak, other kernels "
                          "and the optimizer (", kOptimizerBytesPerElement, " bytes per element) at ", kHbmEfficiency,
                          " of HBM (", c.memory_bytes_per_s / 1e9, " GB/s); a model without counted work at ",
                          kComputeEfficiency, " of the peak; NCCL rings at ", kNvlinkEfficiency, " of NVLink and ",
                          kEfaEfficiency, " of EFA");
    return c;
  }
  std::string names;
  for (const auto& s : cluster_preset_names()) names += (names.empty() ? "" : ", ") + s;
  FSDP_CHECK(false, "cluster_preset: name '", name, "' is neither a preset (", names,
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
                                               "execution", "peak_tflops", "compute_efficiency", "matmul_tflops",
                                               "fp8_matmul_tflops", "attention_tflops", "memory_gbyte_per_s",
                                               "optimizer_ns_per_element", "host_cpu_ns_per_byte", "notes",
                                               "calibration"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    FSDP_CHECK(kKnown.count(it.key()) > 0, source, ": unknown field '", it.key(), "' (fields: name, nodes, "
               "procs_per_node, intra, inter, algorithm, execution, peak_tflops, compute_efficiency, matmul_tflops, "
               "fp8_matmul_tflops, attention_tflops, memory_gbyte_per_s, optimizer_ns_per_element, "
               "host_cpu_ns_per_byte, notes, calibration)");
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
  if (j.contains("matmul_tflops")) c.matmul_flops = number(j["matmul_tflops"], "matmul_tflops", 0, kMaxPeakTflops) * 1e12;
  if (j.contains("fp8_matmul_tflops")) {
    c.fp8_matmul_flops = number(j["fp8_matmul_tflops"], "fp8_matmul_tflops", 0, kMaxPeakTflops) * 1e12;
  }
  if (j.contains("attention_tflops")) {
    c.attention_flops = number(j["attention_tflops"], "attention_tflops", 0, kMaxPeakTflops) * 1e12;
  }
  if (j.contains("memory_gbyte_per_s")) {
    c.memory_bytes_per_s = number(j["memory_gbyte_per_s"], "memory_gbyte_per_s", 0, kMaxMemoryGbytePerS) * 1e9;
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
  j["matmul_tflops"] = c.matmul_flops / 1e12;
  j["fp8_matmul_tflops"] = c.fp8_matmul_flops / 1e12;
  j["attention_tflops"] = c.attention_flops / 1e12;
  j["memory_gbyte_per_s"] = c.memory_bytes_per_s / 1e9;
  j["optimizer_ns_per_element"] = c.optimizer_s_per_element * 1e9;
  j["host_cpu_ns_per_byte"] = c.host_cpu_s_per_byte * 1e9;
  j["notes"] = c.notes;
  return j.dump(2);
}

}  // namespace fsdp


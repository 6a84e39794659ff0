#include "estimate_cli.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include <sys/stat.h>
#include <time.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/json_input.h"
#include "fsdp/common/trace.h"
#include "fsdp/optim/adamw.h"

namespace fsdp::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

bool inside(const trace::Event& inner, const trace::Event& outer) {
  return &inner != &outer && inner.begin_us >= outer.begin_us &&
         inner.begin_us + inner.dur_us <= outer.begin_us + outer.dur_us;
}

// Each unit's own time in one traced step: its spans of `name` minus the spans
// of that name directly inside them (the units it encloses).
std::map<std::string, double> own_time(const std::vector<const trace::Event*>& spans) {
  std::map<std::string, double> out;
  for (const trace::Event* s : spans) {
    std::vector<const trace::Event*> inner;
    for (const trace::Event* c : spans) {
      if (inside(*c, *s)) inner.push_back(c);
    }
    double own = static_cast<double>(s->dur_us);
    for (const trace::Event* c : inner) {
      bool direct = true;
      for (const trace::Event* d : inner) direct = direct && !inside(*c, *d);
      if (direct) own -= static_cast<double>(c->dur_us);
    }
    out[s->detail] += std::max(0.0, own) * 1e-6;
  }
  return out;
}

std::map<std::string, UnitCompute> unit_times(const std::vector<trace::Event>& events, int thread) {
  std::vector<const trace::Event*> fwd, bwd, rec;
  for (const trace::Event& e : events) {
    if (e.thread != thread || e.cat != "compute") continue;
    if (e.name == "forward") fwd.push_back(&e);
    if (e.name == "backward") bwd.push_back(&e);
    if (e.name == "recompute") rec.push_back(&e);
  }
  std::map<std::string, UnitCompute> out;
  for (const auto& [unit, s] : own_time(fwd)) out[unit].forward_s = s;
  for (const auto& [unit, s] : own_time(bwd)) out[unit].backward_s = s;
  // A recomputation runs inside its unit's backward span: the innermost one holding it.
  for (const trace::Event* r : rec) {
    const trace::Event* owner = nullptr;
    for (const trace::Event* b : bwd) {
      if (inside(*r, *b) && (owner == nullptr || inside(*b, *owner))) owner = b;
    }
    if (owner == nullptr) continue;
    UnitCompute& u = out[owner->detail];
    u.recompute_s = std::max(0.0, u.recompute_s) + static_cast<double>(r->dur_us) * 1e-6;
    u.backward_s = std::max(0.0, u.backward_s - static_cast<double>(r->dur_us) * 1e-6);
  }
  return out;
}

nlohmann::json unit_json(const UnitCompute& u) {
  nlohmann::json j = {{"forward_s", u.forward_s}, {"backward_s", u.backward_s}};
  if (u.recompute_s >= 0) j["recompute_s"] = u.recompute_s;
  return j;
}

}  // namespace

Calibration calibrate_compute(const std::shared_ptr<models::LlamaForCausalLMImpl>& model,
                              const models::LlamaConfig& cfg, const FsdpOptions& options, int64_t batch_size,
                              int64_t seq_len, int steps, uint64_t seed) {
  FSDP_CHECK(steps >= 1, "--calibrate-steps must be >= 1, got ", steps);
  FSDP_CHECK(seq_len <= cfg.max_position_embeddings, "--seq-len ", seq_len, " exceeds the model's ",
             cfg.max_position_embeddings, " positions");
  // One process, no network: every unit is gathered locally (a cast under
  // mixed precision), so what remains is each unit's compute and the engine's
  // own bookkeeping around it.
  const comm::Runtime rt = comm::init_process_group(comm::WorldInfo{});
  FsdpOptions o = options;
  o.hybrid_shard_size = 1;
  o.device = at::kCPU;
  o.cpu_offload = false;
  o.init_rule = models::llama_init_rule(cfg);
  o.seed = seed;
  nn::Unit<models::LlamaForCausalLMImpl> root(model);
  const std::shared_ptr<ShardedModel> sharded = fully_shard(root.ptr(), rt.world_group, o);
  optim::AdamWOptions ao;
  if (o.mixed_precision.master_dtype == at::kBFloat16) {
    ao.state_dtype = at::kBFloat16;  // the trainer's AnyPrecision AdamW for pure bf16
    ao.kahan_summation = true;
  }
  optim::AdamW opt(ao);
  opt.add_shards(sharded->shards());
  int64_t shard_elems = 0;
  for (const ShardRef& s : sharded->shards()) shard_elems += s.trainable ? s.param.numel() : 0;

  at::manual_seed(static_cast<int64_t>(seed));
  const at::Tensor tokens = at::randint(0, cfg.vocab_size, {batch_size, seq_len}, at::kLong);
  const at::Tensor targets = at::randint(0, cfg.vocab_size, {batch_size, seq_len}, at::kLong);
  std::map<std::string, std::vector<double>> fwd, bwd, rec;
  std::vector<double> opt_s;
  const int me = trace::this_thread();
  for (int s = 0; s <= steps; ++s) {  // step 0 warms up (allocations, first-touch)
    trace::start();
    at::Tensor loss = root(tokens, targets);
    loss.backward();
    const std::vector<trace::Event> events = trace::stop();
    const auto t0 = Clock::now();
    opt.step();
    sharded->zero_grad();
    const double t_opt = seconds_since(t0);
    if (s == 0) continue;
    opt_s.push_back(t_opt);
    for (const auto& [unit, u] : unit_times(events, me)) {
      fwd[unit].push_back(u.forward_s);
      bwd[unit].push_back(u.backward_s);
      if (u.recompute_s >= 0) rec[unit].push_back(u.recompute_s);
    }
  }
  Calibration cal;
  cal.batch_size = batch_size;
  cal.seq_len = seq_len;
  cal.threads = at::get_num_threads();
  cal.steps = steps;
  for (const auto& [unit, v] : fwd) {
    UnitCompute& u = cal.units[unit];
    u.forward_s = median(v);
    u.backward_s = median(bwd[unit]);
    if (rec.count(unit) > 0) u.recompute_s = median(rec[unit]);
  }
  for (const auto& [unit, v] : bwd) {
    if (cal.units.count(unit) == 0) cal.units[unit].backward_s = median(v);
  }
  cal.optimizer_s_per_element = shard_elems > 0 ? median(opt_s) / static_cast<double>(shard_elems) : 0;
  return cal;
}

namespace {

// All-gathers over `g` (every rank alike): the median of small ones, then
// pieces grown until one takes about seconds / 4, three of them timed.
struct AllGatherTimes {
  double latency = 0;      // median small all-gather, s
  double big = 0;          // median large all-gather, the slowest rank's, s
  int64_t piece = 0;       // floats per rank of the large ones
  double cpu_per_byte = 0; // this process's CPU per byte sent and received, the largest over the ranks
};
AllGatherTimes time_all_gathers(const comm::ProcessGroupPtr& g, double seconds) {
  const int W = g->size();
  AllGatherTimes out;
  std::vector<double> small;
  {
    const at::Tensor in = at::zeros({1});
    const at::Tensor gathered = at::empty({W});
    for (int i = 0; i < 30; ++i) {
      const auto t0 = Clock::now();
      g->all_gather(gathered, in)->wait();
      small.push_back(seconds_since(t0));
    }
  }
  out.latency = median(small);
  int64_t piece = int64_t{1} << 18;  // floats per rank (1 MiB)
  for (;;) {
    const at::Tensor in = at::ones({piece});
    const at::Tensor gathered = at::empty({piece * W});
    const auto t0 = Clock::now();
    g->all_gather(gathered, in)->wait();
    const double t = seconds_since(t0);
    at::Tensor go = at::tensor({t >= seconds / 4 || piece >= (int64_t{1} << 28) ? 1.0 : 0.0});
    g->all_reduce(go, comm::ReduceOp::kMax)->wait();  // every rank grows alike
    if (go.item<double>() > 0) break;
    piece *= 4;
  }
  std::vector<double> big;
  const at::Tensor in = at::ones({piece});
  const at::Tensor gathered = at::empty({piece * W});
  const double cpu0 = process_cpu_s();
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    g->all_gather(gathered, in)->wait();
    big.push_back(seconds_since(t0));
  }
  // The CPU this process spent moving them (its lanes' copies, the kernel's TCP
  // work on its behalf): per byte sent and received.
  const double moved = 3 * 2 * static_cast<double>(piece) * 4 * (static_cast<double>(W) - 1);
  at::Tensor cpu = at::tensor({(process_cpu_s() - cpu0) / moved}, at::kDouble);
  g->all_reduce(cpu, comm::ReduceOp::kMax)->wait();
  at::Tensor worst = at::tensor({median(big)}, at::kDouble);
  g->all_reduce(worst, comm::ReduceOp::kMax)->wait();
  out.big = worst.item<double>();
  out.piece = piece;
  out.cpu_per_byte = cpu.item<double>();
  return out;
}

}  // namespace

LinkCalibration calibrate_link(double seconds) {
  const comm::WorldInfo w = comm::detect_world();
  FSDP_CHECK(w.world_size >= 2, "--calibrate-link measures the link between nodes: start it on each node as a "
             "job of >= 2 processes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun or a plain "
             "environment sets them; one process per node); this process sees WORLD_SIZE=", w.world_size);
  const comm::Runtime rt = comm::init_process_group(w);
  const comm::ProcessGroupPtr& g = rt.world_group;
  const int W = g->size();
  const AllGatherTimes t = time_all_gathers(g, seconds);
  // A node's link carries, per all-gather, its processes' pieces to every rank off the node.
  const double lws = static_cast<double>(w.local_world_size);
  const double bytes = lws * static_cast<double>(t.piece) * 4 * (static_cast<double>(W) - lws);
  LinkCalibration result;
  result.link.latency_s = t.latency;
  result.link.bytes_per_s = bytes / std::max(1e-9, t.big - t.latency);
  result.host_cpu_s_per_byte = t.cpu_per_byte;
  g->barrier(std::chrono::minutes(1));
  return result;
}

LinkCalibration calibrate_local_link(const comm::ProcessGroupPtr& group, double seconds) {
  const int W = group->size();
  FSDP_CHECK(W >= 2, "calibrate_local_link needs >= 2 processes, got ", W);
  const AllGatherTimes t = time_all_gathers(group, seconds);
  // A process sends its piece to each of the others (Note [Collective volumes]: mesh).
  const double bytes = static_cast<double>(t.piece) * 4 * (static_cast<double>(W) - 1);
  LinkCalibration result;
  result.link.latency_s = t.latency;
  result.link.bytes_per_s = bytes / std::max(1e-9, t.big - t.latency);
  result.host_cpu_s_per_byte = t.cpu_per_byte;
  return result;
}

void average_calibration(Calibration& cal, comm::ProcessGroup& group) {
  // Every rank measured the same units (one model, one run): names in map order.
  std::vector<double> v;
  for (const auto& [name, u] : cal.units) {
    v.push_back(u.forward_s);
    v.push_back(u.backward_s);
    v.push_back(u.recompute_s);
  }
  v.push_back(cal.optimizer_s_per_element);
  at::Tensor t = at::tensor(v, at::kDouble);
  group.all_reduce(t, comm::ReduceOp::kSum)->wait();
  const double n = static_cast<double>(group.size());
  size_t k = 0;
  for (auto& [name, u] : cal.units) {
    u.forward_s = t[int64_t(k++)].item<double>() / n;
    u.backward_s = t[int64_t(k++)].item<double>() / n;
    const double r = t[int64_t(k++)].item<double>() / n;
    u.recompute_s = u.recompute_s >= 0 ? r : -1;
  }
  cal.optimizer_s_per_element = t[int64_t(k)].item<double>() / n;
}

std::string calibration_file_json(const ClusterSpec& cluster, const std::optional<Calibration>& cal) {
  nlohmann::json j = nlohmann::json::parse(cluster_to_json(cluster));
  if (cal) {
    nlohmann::json units = nlohmann::json::object();
    for (const auto& [name, u] : cal->units) units[name] = unit_json(u);
    j["calibration"] = {{"model", cal->model},
                        {"batch_size", cal->batch_size},
                        {"seq_len", cal->seq_len},
                        {"mixed_precision", cal->mixed_precision},
                        {"activation_checkpointing", cal->activation_checkpointing},
                        {"threads", cal->threads},
                        {"steps", cal->steps},
                        {"units", units}};
  }
  return j.dump(2);
}

ClusterSpec read_cluster(const std::string& spec, at::ScalarType compute_dtype, std::optional<Calibration>* cal,
                         const std::string& flag) {
  struct stat st {};
  if (::lstat(spec.c_str(), &st) != 0) return cluster_preset(spec, compute_dtype);
  const std::string text = read_input_file(spec, flag, kMaxJsonConfigBytes,
                                           "give a cluster JSON file (fsdp-inspect --calibrate writes one) or a preset");
  ClusterSpec base;
  base.name = spec;
  ClusterSpec c = cluster_from_json(text, base, spec);
  std::string why;
  const nlohmann::json j = *parse_json_input(text, why);  // cluster_from_json parsed it already
  if (cal != nullptr && j.contains("calibration")) {
    const nlohmann::json& k = j["calibration"];
    try {
      Calibration out;
      out.model = k.at("model").get<std::string>();
      out.batch_size = k.at("batch_size").get<int64_t>();
      out.seq_len = k.at("seq_len").get<int64_t>();
      out.mixed_precision = k.at("mixed_precision").get<std::string>();
      out.activation_checkpointing = k.at("activation_checkpointing").get<bool>();
      out.threads = k.value("threads", 0);
      out.steps = k.value("steps", 0);
      for (auto it = k.at("units").begin(); it != k.at("units").end(); ++it) {
        UnitCompute u;
        u.forward_s = it.value().at("forward_s").get<double>();
        u.backward_s = it.value().at("backward_s").get<double>();
        u.recompute_s = it.value().value("recompute_s", -1.0);
        // Times beyond any step would stall the event replay (issue 39): refused by name.
        for (const auto& [field, v] : {std::pair<const char*, double>{"forward_s", u.forward_s},
                                       {"backward_s", u.backward_s}, {"recompute_s", u.recompute_s}}) {
          FSDP_CHECK(std::isfinite(v) && v <= kMaxUnitSeconds && (v >= 0 || (v == -1.0 && field[0] == 'r')),
                     flag, " ", spec, ": calibration unit '", it.key(), "' has ", field, " = ", v,
                     ", outside [0, ", kMaxUnitSeconds, "] seconds; write it again with fsdp-inspect --calibrate");
        }
        out.units[it.key()] = u;
      }
      out.optimizer_s_per_element = c.optimizer_s_per_element;
      *cal = out;
    } catch (const nlohmann::json::exception& e) {
      FSDP_CHECK(false, flag, " ", spec, ": its 'calibration' is malformed (", e.what(),
                 "); write it again with fsdp-inspect --calibrate");
    }
  }
  return c;
}

UnitCostFn flops_cost(const train::ModelConfigPtr& cfg, const ClusterSpec& cluster, int64_t tokens, int64_t seq_len) {
  FSDP_CHECK(cluster.peak_flops > 0 && cluster.compute_efficiency > 0, "cluster '", cluster.name,
             "' states no compute rate (peak_tflops and compute_efficiency): give --peak-tflops and "
             "--compute-efficiency, a preset, or measure this machine with --calibrate");
  const double rate = cluster.peak_flops * cluster.compute_efficiency;
  return [cfg, rate, tokens, seq_len](const std::vector<UnitInfo>& entries) {
    UnitCompute u;
    for (const UnitInfo& e : entries) {
      std::vector<std::pair<std::string, std::vector<int64_t>>> params;
      for (const ParamPlacement& p : e.params) params.emplace_back(p.name, p.shape);
      const double s = cfg->forward_flops_per_token(params, seq_len) * static_cast<double>(tokens) / rate;
      u.forward_s += s;
      u.backward_s += (e.trainable ? 2 : 1) * s;  // frozen weights: input gradients only
    }
    return u;
  };
}

std::optional<UnitCostFn> roofline_cost(const train::ModelConfigPtr& cfg, const ClusterSpec& cluster,
                                        const models::WorkShape& shape) {
  if (cluster.matmul_flops <= 0 || cluster.memory_bytes_per_s <= 0 || !cfg->unit_work({}, true, shape)) {
    return std::nullopt;
  }
  const double attention = cluster.attention_flops > 0 ? cluster.attention_flops : cluster.matmul_flops;
  const double fp8 = cluster.fp8_matmul_flops > 0 ? cluster.fp8_matmul_flops : cluster.matmul_flops;
  const auto timed = [&cluster, attention, fp8](const models::OpWork& w) {
    return ComputeClasses{w.product_flops / cluster.matmul_flops, w.attention_flops / attention,
                          w.memory_bytes / cluster.memory_bytes_per_s, w.fp8_product_flops / fp8};
  };
  return [cfg, shape, timed](const std::vector<UnitInfo>& entries) {
    UnitCompute u;
    bool checkpointed = false;
    for (const UnitInfo& e : entries) {
      train::ParamShapes params;
      for (const ParamPlacement& p : e.params) params.emplace_back(p.name, p.shape);
      models::WorkShape s = shape;
      s.checkpointed = e.checkpointed;
      checkpointed = checkpointed || e.checkpointed;
      const std::optional<models::UnitWork> w = cfg->unit_work(params, e.trainable, s);
      FSDP_ASSERT(w.has_value(), "model '", cfg->name(), "' counted no work for unit '", e.name, "'");
      u.forward += timed(w->forward);
      u.backward += timed(w->backward);
      u.recompute += timed(w->recompute);
    }
    u.forward_s = u.forward.total();
    u.backward_s = u.backward.total();
    if (checkpointed) u.recompute_s = u.recompute.total();
    return u;
  };
}

UnitCostFn calibrated_cost(const Calibration& cal, const std::string& model, int64_t batch_size, int64_t seq_len,
                           const std::string& mixed_precision, bool activation_checkpointing) {
  auto same = [&](bool ok, const std::string& what, const std::string& calibrated, const std::string& asked) {
    FSDP_CHECK(ok, "the cluster file was calibrated for ", what, " ", calibrated, ", this estimate asks for ", asked,
               ": a calibration measures exactly one run's units — run fsdp-inspect --calibrate with this run's "
               "flags");
  };
  same(cal.model == model, "--model", cal.model, model);
  same(cal.batch_size == batch_size, "--batch-size", std::to_string(cal.batch_size), std::to_string(batch_size));
  same(cal.seq_len == seq_len, "--seq-len", std::to_string(cal.seq_len), std::to_string(seq_len));
  same(cal.mixed_precision == mixed_precision, "--mixed-precision", cal.mixed_precision, mixed_precision);
  same(cal.activation_checkpointing == activation_checkpointing, "--activation-checkpointing",
       cal.activation_checkpointing ? "on" : "off", activation_checkpointing ? "on" : "off");
  return [cal](const std::vector<UnitInfo>& entries) {
    const std::string& name = entries.front().name;
    const auto it = cal.units.find(name);
    FSDP_CHECK(it != cal.units.end(), "the calibration measured no unit '", name,
               "' (another --wrap?); run fsdp-inspect --calibrate with this run's flags");
    return it->second;
  };
}

std::string estimate_text(const StepEstimate& e, const ClusterSpec& c, bool units,
                          const std::vector<std::pair<int, StepEstimate>>& curve) {
  std::ostringstream os;
  const double step = e.step_time_s;
  os << fmt::format("Estimate on {} ({} node{} x {} process{}): step {:.4g} s — compute {:.4g} s{}, optimizer {:.3g} "
                    "s; communication {:.4g} s on the network, exposed {:.4g} s ({:.0f}% of the step)\n",
                    c.name, c.nodes, c.nodes == 1 ? "" : "s", c.procs_per_node, c.procs_per_node == 1 ? "" : "es",
                    step, e.compute_s,
                    e.comm_cpu_s > 0 ? fmt::format(" (+ {:.3g} s moving bytes)", e.comm_cpu_s) : std::string(),
                    e.optimizer_s, e.comm_s, e.exposed_comm_s, step > 0 ? 100 * e.exposed_comm_s / step : 0.0);
  os << fmt::format("  {:.0f} tokens/s ({:.0f} per process){}, scaling efficiency {:.3f} (tokens/s per process vs "
                    "one node)\n",
                    e.tokens_per_s, e.tokens_per_s_per_process,
                    e.mfu >= 0 ? fmt::format(", MFU {:.1f}%", 100 * e.mfu) : std::string(", MFU unknown (no peak)"),
                    e.scaling_efficiency);
  if (curve.size() > 1) {
    os << "  scaling:";
    for (const auto& [nodes, x] : curve) {
      os << fmt::format(" {} node{} {:.0f} tokens/s ({:.2f}){}", nodes, nodes == 1 ? "" : "s", x.tokens_per_s,
                        x.scaling_efficiency, nodes == curve.back().first ? "" : ";");
    }
    os << "\n";
  }
  const ComputeClasses& k = e.compute_classes;
  if (k.total() > 0) {
    const double all = k.total() + e.optimizer_s;
    os << fmt::format("  where the time goes: products {:.4g} s ({:.0f}%), {}attention {:.4g} s ({:.0f}%), "
                      "memory-bound {:.4g} s ({:.0f}%), optimizer {:.4g} s ({:.0f}%)\n",
                      k.products_s, 100 * k.products_s / all,
                      k.fp8_products_s > 0 ? fmt::format("FP8 products {:.4g} s ({:.0f}%), ", k.fp8_products_s,
                                                         100 * k.fp8_products_s / all)
                                           : std::string(),
                      k.attention_s, 100 * k.attention_s / all, k.memory_s, 100 * k.memory_s / all, e.optimizer_s,
                      100 * e.optimizer_s / all);
  }
  if (!c.notes.empty()) os << "  assumptions: " << c.notes << "\n";
  if (units) {
    for (const UnitEstimate& u : e.units) {
      os << fmt::format("  unit {:<20} forward {:9.4g} s  backward {:9.4g} s  recompute {:9.4g} s  all-gather {:9.4g} s "
                        "x{}  reduce {:9.4g} s{}\n",
                        u.name.empty() ? "<root>" : u.name, u.forward_s, u.backward_s, u.recompute_s, u.all_gather_s,
                        u.gathers, u.reduce_s,
                        u.replica_all_reduce_s > 0 ? fmt::format("  replica all-reduce {:.4g} s", u.replica_all_reduce_s)
                                                   : std::string());
    }
  }
  return os.str();
}

std::string estimate_json(const StepEstimate& e, const ClusterSpec& c, const std::string& run, bool timeline,
                          const std::vector<std::pair<int, StepEstimate>>& curve) {
  nlohmann::json j;
  j["run"] = run;
  j["cluster"] = nlohmann::json::parse(cluster_to_json(c));
  j["world_size"] = e.world_size;
  j["shard_size"] = e.shard_size;
  j["replicas"] = e.replicas;
  j["step_time_s"] = e.step_time_s;
  j["tokens_per_s"] = e.tokens_per_s;
  j["tokens_per_s_per_process"] = e.tokens_per_s_per_process;
  j["compute_s"] = e.compute_s;
  j["comm_cpu_s"] = e.comm_cpu_s;
  j["optimizer_s"] = e.optimizer_s;
  j["compute_classes"] = {{"products_s", e.compute_classes.products_s},
                          {"attention_s", e.compute_classes.attention_s},
                          {"memory_s", e.compute_classes.memory_s},
                          {"fp8_products_s", e.compute_classes.fp8_products_s}};
  j["comm_s"] = e.comm_s;
  j["exposed_comm_s"] = e.exposed_comm_s;
  j["mfu"] = e.mfu >= 0 ? nlohmann::json(e.mfu) : nlohmann::json(nullptr);
  j["scaling_efficiency"] = e.scaling_efficiency;
  nlohmann::json units = nlohmann::json::array();
  for (const UnitEstimate& u : e.units) {
    units.push_back({{"name", u.name},
                     {"forward_s", u.forward_s},
                     {"backward_s", u.backward_s},
                     {"recompute_s", u.recompute_s},
                     {"gather_bytes", u.gather_bytes},
                     {"reduce_bytes", u.reduce_bytes},
                     {"all_gather_s", u.all_gather_s},
                     {"gathers", u.gathers},
                     {"reduce_s", u.reduce_s},
                     {"replica_all_reduce_s", u.replica_all_reduce_s}});
  }
  j["units"] = units;
  nlohmann::json scaling = nlohmann::json::array();
  for (const auto& [nodes, x] : curve) {
    scaling.push_back({{"nodes", nodes},
                       {"step_time_s", x.step_time_s},
                       {"tokens_per_s", x.tokens_per_s},
                       {"exposed_comm_s", x.exposed_comm_s},
                       {"scaling_efficiency", x.scaling_efficiency}});
  }
  j["scaling"] = scaling;
  if (timeline) {
    nlohmann::json t = nlohmann::json::array();
    for (const EstimateSpan& s : e.timeline) {
      t.push_back({{"lane", s.lane}, {"what", s.what}, {"begin_s", s.begin_s}, {"end_s", s.end_s}});
    }
    j["timeline"] = t;
  }
  return j.dump(2);
}

}  // namespace fsdp::cli

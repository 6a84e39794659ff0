// Sweep of FSDP's memory and precision options for a small Llama on N CPU
// processes (default: the `small` preset, 25.7M parameters, 2 processes).
// Every configuration runs in fresh processes; the table gives samples/s,
// peak resident memory per rank and bytes communicated per step, each also
// as a ratio to the FULL_SHARD fp32 run measured in the same invocation.
//
//   bench_options [--model small] [--nproc 2] [--seq-len 128] [--batch-size 2]
//                 [--steps 4] [--warmup 1] [--only name,name]
//
// samples/s: global samples per second over the measured steps (after the
// warm-up steps). peak RSS: the largest VmHWM over the ranks at the end.
// bytes/step: all-gather + reduce-scatter + all-reduce bytes of rank 0 per
// step, as the process groups count them.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fsdp/comm/launcher.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/common/memory.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"
#include "fsdp/optim/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "small";
  int nproc = 2;
  int64_t seq_len = 128;
  int64_t batch_size = 2;
  int steps = 4;
  int warmup = 1;
  std::vector<std::string> only;
  // worker mode
  std::string config;
  std::string out;
};

struct Config {
  std::string name;
  std::function<void(fsdp::FsdpOptions&, fsdp::optim::AdamWOptions&)> apply;
};

std::vector<Config> configs() {
  using fsdp::BackwardPrefetch;
  using fsdp::MixedPrecision;
  using fsdp::ShardingStrategy;
  return {
      {"full fp32", [](auto&, auto&) {}},
      {"full bf16", [](auto& f, auto&) { f.mixed_precision = MixedPrecision::preset("bf16"); }},
      {"full bf16-pure", [](auto& f, auto& a) {
         f.mixed_precision = MixedPrecision::preset("bf16-pure");
         a.state_dtype = at::kBFloat16;
         a.kahan_summation = true;
       }},
      {"grad-op fp32", [](auto& f, auto&) { f.strategy = ShardingStrategy::kShardGradOp; }},
      {"none fp32", [](auto& f, auto&) { f.strategy = ShardingStrategy::kNoShard; }},
      {"hybrid 1x2 fp32", [](auto& f, auto&) {
         f.strategy = ShardingStrategy::kHybridShard;
         f.hybrid_shard_size = 1;
       }},
      {"full +ckpt", [](auto& f, auto&) { f.checkpoint_all_units = true; }},
      {"full +offload", [](auto& f, auto&) { f.cpu_offload = true; }},
      {"full prefetch=post", [](auto& f, auto&) { f.backward_prefetch = BackwardPrefetch::kPost; }},
      {"full prefetch=none", [](auto& f, auto&) { f.backward_prefetch = BackwardPrefetch::kNone; }},
      {"full +fwd-prefetch", [](auto& f, auto&) { f.forward_prefetch = true; }},
      {"full limit=1", [](auto& f, auto&) { f.limit_all_gathers = 1; }},
      {"full bf16 +ckpt", [](auto& f, auto&) {
         f.mixed_precision = MixedPrecision::preset("bf16");
         f.checkpoint_all_units = true;
       }},
  };
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) out.push_back(x);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    FSDP_CHECK(i + 1 < argc, k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--nproc") a.nproc = std::stoi(v);
    else if (k == "--seq-len") a.seq_len = std::stoll(v);
    else if (k == "--batch-size") a.batch_size = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--only") a.only = split(v);
    else if (k == "--config") a.config = v;
    else if (k == "--out") a.out = v;
    else FSDP_CHECK(false, "unknown flag ", k, "; flags: --model --nproc --seq-len --batch-size --steps --warmup --only");
  }
  return a;
}

// One configuration on this rank; rank 0 appends its numbers to `out`.
void worker(const Args& a) {
  const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(fsdp::comm::detect_world());
  const auto& world = rt.world_group;
  const fsdp::models::LlamaConfig cfg = fsdp::models::resolve_model_config(a.model);
  auto impl = std::make_shared<fsdp::models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 1);
  fsdp::nn::Unit<fsdp::models::LlamaForCausalLMImpl> root(impl);
  fsdp::FsdpOptions fo;
  fo.wrap = fsdp::WrapPolicy::by_type({fsdp::models::llama_block_type()});
  fo.init_rule = fsdp::models::llama_init_rule(cfg);
  fsdp::optim::AdamWOptions ao;
  for (const auto& c : configs()) {
    if (c.name == a.config) c.apply(fo, ao);
  }
  auto sharded = fsdp::fully_shard(root.ptr(), world, fo);
  fsdp::optim::AdamW opt(ao);
  opt.add_shards(sharded->shards());
  // Random tokens: throughput and memory do not depend on the text.
  auto tokens = at::randint(0, cfg.vocab_size, {a.batch_size, a.seq_len}, at::kLong);
  double seconds = 0;
  fsdp::StepCounters bytes;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    world->barrier(std::chrono::minutes(5));
    const auto t0 = Clock::now();
    sharded->zero_grad();
    root(tokens, tokens).backward();
    sharded->clip_grad_norm(1.0);
    opt.step();
    const fsdp::StepCounters c = sharded->take_step_counters();
    world->barrier(std::chrono::minutes(5));
    if (s >= a.warmup) {
      seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      bytes.allgather_bytes += c.allgather_bytes;
      bytes.reduce_scatter_bytes += c.reduce_scatter_bytes;
      bytes.allreduce_bytes += c.allreduce_bytes;
    }
  }
  at::Tensor peak = at::full({1}, static_cast<double>(fsdp::peak_rss_bytes()), at::kDouble);
  world->all_reduce(peak, fsdp::comm::ReduceOp::kMax)->wait();
  if (world->rank() == 0) {
    const double samples = static_cast<double>(a.steps * a.batch_size * world->size());
    std::ofstream(a.out, std::ios::app) << a.config << "\t" << samples / seconds << "\t" << peak.item<double>()
                                        << "\t"
                                        << (bytes.allgather_bytes + bytes.reduce_scatter_bytes +
                                            bytes.allreduce_bytes) / a.steps
                                        << "\n";
  }
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "bench_options";
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.config.empty()) {
    worker(a);
    return 0;
  }
  const auto out = std::filesystem::temp_directory_path() / ("bench_options_" + std::to_string(getpid()) + ".tsv");
  std::filesystem::remove(out);
  const fsdp::models::LlamaConfig cfg = fsdp::models::resolve_model_config(a.model);
  std::cout << fmt::format("bench_options: model {} ({} parameters), {} processes, seq {} x batch {} per rank, "
                           "{} measured steps after {} warm-up\n",
                           cfg.name, cfg.num_parameters(), a.nproc, a.seq_len, a.batch_size, a.steps, a.warmup)
            << std::flush;
  for (const auto& c : configs()) {
    if (!a.only.empty() && std::find(a.only.begin(), a.only.end(), c.name) == a.only.end() && c.name != "full fp32") {
      continue;
    }
    fsdp::comm::LaunchOptions lo;
    lo.argv = {self_exe(), "--model", a.model, "--seq-len", std::to_string(a.seq_len), "--batch-size",
               std::to_string(a.batch_size), "--steps", std::to_string(a.steps), "--warmup", std::to_string(a.warmup),
               "--config", c.name, "--out", out.string()};
    lo.nproc = a.nproc;
    const auto r = fsdp::comm::launch_local(lo);
    FSDP_CHECK(r.ok, "configuration '", c.name, "' failed: ", r.message);
  }
  struct Row {
    std::string name;
    double sps, peak, bytes;
  };
  std::vector<Row> rows;
  std::ifstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    Row r;
    std::getline(ss, r.name, '\t');
    ss >> r.sps >> r.peak >> r.bytes;
    rows.push_back(r);
  }
  std::filesystem::remove(out);
  FSDP_CHECK(!rows.empty() && rows[0].name == "full fp32", "the reference run (full fp32) produced no result");
  const Row ref = rows[0];
  std::cout << fmt::format("| {:<20} | {:>10} | {:>6} | {:>14} | {:>6} | {:>14} | {:>6} |\n", "configuration",
                           "samples/s", "x", "peak RSS/rank", "x", "bytes/step", "x");
  std::cout << "|" << std::string(22, '-') << "|" << std::string(12, '-') << "|" << std::string(8, '-') << "|"
            << std::string(16, '-') << "|" << std::string(8, '-') << "|" << std::string(16, '-') << "|"
            << std::string(8, '-') << "|\n";
  for (const auto& r : rows) {
    std::cout << fmt::format("| {:<20} | {:>10.2f} | {:>6.2f} | {:>10.0f} MiB | {:>6.2f} | {:>10.1f} MiB | {:>6.2f} |\n",
                             r.name, r.sps, r.sps / ref.sps, r.peak / (1 << 20), r.peak / ref.peak,
                             r.bytes / (1 << 20), ref.bytes > 0 ? r.bytes / ref.bytes : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("bench_options", [&] { return run(argc, argv); }); }

// The FSDP tutorial's MLP (8 x Linear W->W, ReLU) under FULL_SHARD, with or
// without CPU offload: one configuration per process, one JSON line out.
//
//   bench_mlp [--device cpu|cuda] [--width 20480] [--layers 8] [--batch-size 8]
//             [--precision fp32|bf16] [--cpu-offload] [--steps 5] [--warmup 2]
//
// Every Linear is its own unit (the tutorial's ModuleWrapPolicy({nn.Linear})).
// The step is forward, an fp32 mean-squared-error against a fixed target,
// backward and AdamW. Prints
//   {"config": ..., "step_time_s": mean over the measured steps,
//    "peak_mem_bytes": peak_memory_bytes(device) (device.h) from the end of the
//    setup (model, shards, optimizer, batch) to the end of the run, as the
//    peers of bench/gpu/run.sh count it, "parameters": ...}
// World size: whatever the launcher says (1 when started by hand). The
// collective timeout is FSDP_TIMEOUT's when set (as fsdp-train's), else 600 s.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/mlp.h"
#include "fsdp/optim/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cpu";
  int64_t width = 20480;
  int64_t layers = 8;
  int64_t batch_size = 8;
  std::string precision = "fp32";
  bool cpu_offload = false;
  int steps = 5;
  int warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--cpu-offload") {
      a.cpu_offload = true;
      continue;
    }
    FSDP_CHECK(i + 1 < argc, k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--device") a.device = v;
    else if (k == "--width") a.width = std::stoll(v);
    else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--batch-size") a.batch_size = std::stoll(v);
    else if (k == "--precision") a.precision = v;
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else FSDP_CHECK(false, "unknown flag ", k, "; flags: --device --width --layers --batch-size --precision "
                    "--cpu-offload --steps --warmup");
  }
  FSDP_CHECK(a.steps >= 1 && a.warmup >= 0, "--steps must be >= 1 and --warmup >= 0, got ", a.steps, " and ",
             a.warmup);
  FSDP_CHECK(a.batch_size >= 1, "--batch-size must be >= 1, got ", a.batch_size);
  return a;
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const fsdp::comm::WorldInfo world_info = fsdp::comm::detect_world();
  const c10::Device device = fsdp::worker_device(a.device, world_info.local_rank);
  fsdp::set_current_device(device);
  fsdp::comm::InitOptions init;
  if (device.is_cuda()) init.backend = "nccl";
  if (const char* env = std::getenv("FSDP_TIMEOUT"); env != nullptr && *env != '\0') {
    init.timeout = init.store_timeout = fsdp::comm::parse_timeout(env, "FSDP_TIMEOUT");
  }
  const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(world_info, init);

  fsdp::models::MlpConfig cfg;
  cfg.width = a.width;
  cfg.layers = a.layers;
  cfg.validate();
  auto impl = std::make_shared<fsdp::models::MlpImpl>(cfg, at::TensorOptions().device(at::kMeta), 1);
  fsdp::nn::Unit<fsdp::models::MlpImpl> root(impl);

  fsdp::FsdpOptions fo;
  fo.wrap = fsdp::WrapPolicy::by_type({fsdp::models::mlp_block_type()});
  fo.init_rule = fsdp::models::mlp_init_rule(cfg);
  fo.mixed_precision = fsdp::MixedPrecision::preset(a.precision);
  fo.cpu_offload = a.cpu_offload;
  fo.device = device;
  fsdp::check_options(fo, rt.world_group->size());
  auto sharded = fsdp::fully_shard(root.ptr(), rt.world_group, fo);
  fsdp::optim::AdamW opt(fsdp::optim::AdamWOptions{});
  opt.add_shards(sharded->shards());

  const auto opts = at::TensorOptions().device(device).dtype(fo.mixed_precision.param_dtype);
  const at::Tensor x = at::randn({a.batch_size, a.width}, opts);
  const at::Tensor target = at::randn({a.batch_size, a.width}, opts.dtype(at::kFloat));
  // The peak from here: the setup is not counted (at 9fc8542 it was).
  fsdp::synchronize(device);
  fsdp::reset_peak_memory(device);
  double seconds = 0;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) fsdp::synchronize(device);
    const auto t0 = Clock::now();
    sharded->zero_grad();
    const at::Tensor y = root(x);
    (y.to(at::kFloat) - target).pow(2).mean().backward();
    opt.step();
    fsdp::synchronize(device);
    if (s >= a.warmup) seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (rt.world_group->rank() == 0) {
    const std::string config = a.cpu_offload ? "cpu-offload" : "on-device";
    nlohmann::json j = {{"kind", "mlp"},
                        {"row", "MLP " + config},
                        {"config", config},
                        {"device", device.str()},
                        {"world_size", rt.world_group->size()},
                        {"width", a.width},
                        {"layers", a.layers},
                        {"batch_size", a.batch_size},
                        {"precision", a.precision},
                        {"parameters", cfg.num_parameters()},
                        {"step_time_s", seconds / a.steps},
                        {"peak_mem_bytes", fsdp::peak_memory_bytes(device)}};
    std::cout << j.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("bench_mlp", [&] { return run(argc, argv); }); }

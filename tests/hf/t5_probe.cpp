// t5_probe: fsdp-cpp's side of the comparison with transformers' T5
// (tests/hf/test_t5.py drives it and does the comparing).
//
// A model directory is loaded as `fsdp-train --init-from DIR` loads it: the
// model family that reads DIR/config.json (train/model_family.h), the model on
// the meta device under fully_shard (one process, FULL_SHARD, a unit per
// T5Block, the --mixed-precision preset, optionally every block checkpointed),
// checkpoint::import_hf with the family's names.
//
//   t5_probe model DIR BATCH OUT [VARIANTS]
//       BATCH: a safetensors file with "inputs" (B, Ts) and "targets" (B, Tt),
//       I64 (targets -100 where ignored). VARIANTS: comma-separated
//       <precision>[+ckpt] (default fp32,fp32+ckpt). For each variant v, OUT holds
//         v.logits (B, Tt, V), v.loss (1) and v.grad.<HF name> (the loss's gradient
//         of each parameter: the engine's reduced gradient shard at world size 1).
//
//   t5_probe presets OUT
//       OUT: JSON, for every preset of the t5 family: its config.json, its
//       parameter count and its parameters' (HF name, shape), built on the meta device.
//
// Exit status (fsdp::run_main): 0; 2 with "t5_probe: error: <message>" for a UsageError; 1 on failures.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/output_file.h"
#include "fsdp/common/main.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/t5.h"
#include "fsdp/nn/unit.h"
#include "fsdp/train/model_family.h"

namespace {

using namespace fsdp;  // NOLINT: a test program
using models::T5ForConditionalGenerationImpl;

constexpr const char* kUsage = "usage: t5_probe model DIR BATCH OUT [VARIANTS] | t5_probe presets OUT";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The loss's gradient of every parameter, by HF name (world size 1: a shard is the whole flat gradient).
void add_gradients(ShardedModel& sharded, const std::string& prefix,
                   std::vector<std::pair<std::string, at::Tensor>>& out) {
  const std::vector<ShardRef> shards = sharded.shards();
  const auto& units = sharded.units();
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& p : units[u].params) {
      out.emplace_back(prefix + p.name,
                       shards[u].grad.narrow(0, p.flat_offset, p.numel).view(p.shape).to(at::kFloat).clone());
    }
  }
}

int run_model(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 3 || args.size() == 4, kUsage);
  const std::string& dir = args[0];
  const checkpoint::SafetensorsFile batch(args[1]);
  const at::Tensor inputs = batch.tensor("inputs");
  const at::Tensor targets = batch.tensor("targets");
  std::vector<std::pair<std::string, at::Tensor>> out;
  const train::ModelConfigPtr cfg = train::resolve_model(dir);
  FSDP_CHECK(cfg->family().name() == "t5", dir, " is a ", cfg->family().name(), " model, not a t5 one");
  for (const std::string& variant : split(args.size() > 3 ? args[3] : "fp32,fp32+ckpt")) {
    const size_t plus = variant.find('+');
    const std::string precision = variant.substr(0, plus);
    auto impl = std::dynamic_pointer_cast<T5ForConditionalGenerationImpl>(cfg->make(at::TensorOptions().device(at::kMeta), 0));
    nn::Unit<T5ForConditionalGenerationImpl> root(impl);
    FsdpOptions fo;
    fo.strategy = ShardingStrategy::kFullShard;
    fo.wrap = WrapPolicy::by_type(cfg->unit_types());
    fo.mixed_precision = MixedPrecision::preset(precision);
    if (plus != std::string::npos) fo.checkpoint_types = {cfg->block_type()};
    fo.init_rule = cfg->init_rule();
    const std::shared_ptr<ShardedModel> sharded = fully_shard(root.ptr(), world, fo);
    checkpoint::import_hf(dir, *sharded, train::hf_model_info(*cfg), *world);
    const std::string key = variant + ".";
    {
      at::NoGradGuard no_grad;
      out.emplace_back(key + "logits", root(inputs, targets, models::T5Logits{}).to(at::kFloat).clone());
    }
    sharded->zero_grad();
    const at::Tensor loss = root(inputs, targets);
    loss.backward();
    out.emplace_back(key + "loss", loss.detach().reshape({1}));
    add_gradients(*sharded, key + "grad.", out);
  }
  checkpoint::save_safetensors(args[2], out, {{"format", "pt"}, {"config", cfg->hf_config_json()}});
  return 0;
}

int run_presets(const std::vector<std::string>& args) {
  FSDP_CHECK(args.size() == 1, kUsage);
  nlohmann::json out = nlohmann::json::object();
  for (const std::string& name : train::t5_family().presets()) {
    const train::ModelConfigPtr cfg = train::t5_family().preset(name);
    const auto model = cfg->make(at::TensorOptions().device(at::kMeta), 0);
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : model->named_parameters()) params.push_back({p.key(), p.value().sizes().vec()});
    out[name] = {{"config", nlohmann::json::parse(cfg->hf_config_json())},
                 {"num_parameters", cfg->num_parameters()},
                 {"params", params}};
  }
  write_output_file(args[0], out.dump(1) + "\n", "t5_probe presets");
  return 0;
}

int run(int argc, char** argv) {
  FSDP_CHECK(argc >= 2, kUsage);
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "presets") return run_presets(args);
  const comm::Runtime rt = comm::init_process_group(comm::WorldInfo{});
  FSDP_CHECK(command == "model", kUsage);
  return run_model(args, rt.world_group);
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("t5_probe", [&] { return run(argc, argv); }); }

// hf_probe: fsdp-cpp's side of the comparison with transformers
// (tests/hf/test_transformers.py drives it and does the comparing).
//
// A model directory is loaded exactly as `fsdp-train --init-from DIR` loads it:
// models::resolve_model_config(DIR), a meta-device LlamaForCausalLM under
// fully_shard (one process, FULL_SHARD, a unit per decoder layer, the
// --mixed-precision preset), checkpoint::import_hf. Results go to one
// safetensors file (checkpoint::save_safetensors), every tensor F32.
//
//   hf_probe model DIR BATCH OUT [PRECISIONS [KERNELS]]
//       BATCH: a safetensors file with "tokens" and "targets", (B, T) I64,
//       targets already shifted (kIgnoreIndex = -100 leaves a position out).
//       PRECISIONS: comma-separated --mixed-precision presets (fp32,bf16);
//       KERNELS: sdpa,eager (models::AttentionKernel). For each pair <p>.<k>:
//         <p>.<k>.logits              (B, T, V)  the model's logits (bf16 widened exactly)
//         <p>.<k>.loss                (1)        LlamaForCausalLM::loss (mean cross-entropy)
//         <p>.<k>.grad.<HF name>      the loss's gradient of each parameter: the
//                                     engine's reduced gradient shard (world size 1)
//   hf_probe config SPEC OUT
//       SPEC: a preset, a config.json or a directory holding one. No weights.
//       Metadata besides "config": "num_parameters" (LlamaConfig::num_parameters),
//       "planned_parameters" (fsdp::plan_sharding's count of the meta-built
//       model, what fsdp-inspect reports) and "parameters" (JSON {name: shape}
//       of the meta-built model, in registration order).
//   hf_probe export DIR OUTDIR DTYPE
//       import_hf(DIR), then checkpoint::export_hf(OUTDIR) in DTYPE
//       (float32 | bfloat16 | float16): the library path of --export-hf.
//   hf_probe checkpoint CKDIR BATCH OUT
//       The newest checkpoint of CKDIR (fsdp-train --checkpoint-dir), loaded as
//       --resume loads it into the model its manifest names; OUT holds
//       "fp32.sdpa.logits" (B, T, V) for BATCH's tokens.
// Every OUT also holds "inv_freq" (Dh/2) and the metadata "config": the config
// as read, in its export form (LlamaConfig::to_hf_config_json).
//
// Exit status (fsdp::run_main): 0; 2 with "hf_probe: error: <message>" when
// something is refused (a UsageError: e.g. a config key); 1 on failures.
#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/unit.h"

namespace {

using namespace fsdp;  // NOLINT: a test program

constexpr const char* kUsage =
    "usage: hf_probe model DIR BATCH OUT [PRECISIONS [KERNELS]] | hf_probe config SPEC OUT | "
    "hf_probe export DIR OUTDIR DTYPE | hf_probe checkpoint CKDIR BATCH OUT";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

models::AttentionKernel kernel_of(const std::string& name) {
  if (name == "sdpa") return models::AttentionKernel::kSdpa;
  if (name == "eager") return models::AttentionKernel::kEager;
  FSDP_FAIL("attention kernel '", name, "' is not one of: sdpa, eager");
}

// What `fsdp-train --init-from DIR --mixed-precision PRECISION` builds before
// its first step (train/trainer.cpp): the config from DIR, the model on the
// meta device under fully_shard, then the weights from DIR.
struct Loaded {
  models::LlamaConfig cfg;
  std::shared_ptr<models::LlamaForCausalLMImpl> impl;
  std::shared_ptr<nn::UnitImpl<models::LlamaForCausalLMImpl>> root;
  std::shared_ptr<ShardedModel> sharded;
};

Loaded build(const models::LlamaConfig& cfg, const std::string& precision, const comm::ProcessGroupPtr& world) {
  Loaded m;
  m.cfg = cfg;
  m.impl = std::make_shared<models::LlamaForCausalLMImpl>(m.cfg, at::TensorOptions().device(at::kMeta), /*seed=*/0);
  m.root = std::make_shared<nn::UnitImpl<models::LlamaForCausalLMImpl>>(m.impl);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::kFullShard;
  fo.wrap = WrapPolicy::by_type({models::llama_block_type()});
  fo.mixed_precision = MixedPrecision::preset(precision);
  fo.init_rule = models::llama_init_rule(m.cfg);
  m.sharded = fully_shard(m.root, world, fo);
  return m;
}

Loaded load(const std::string& dir, const std::string& precision, const comm::ProcessGroupPtr& world) {
  Loaded m = build(models::resolve_model_config(dir), precision, world);
  checkpoint::import_hf(dir, *m.sharded, m.cfg, *world);
  return m;
}

std::map<std::string, std::string> metadata_of(const models::LlamaConfig& cfg) {
  return {{"format", "pt"}, {"config", cfg.to_hf_config_json()}};
}

// The loss's gradient of every parameter, by HF name, from the reduced
// gradient shards (world size 1: a shard is the whole flat gradient).
std::vector<std::pair<std::string, at::Tensor>> gradients(ShardedModel& sharded, const std::string& prefix) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::vector<ShardRef> shards = sharded.shards();
  const auto& units = sharded.units();
  FSDP_ASSERT(shards.size() == units.size(), "shards ", shards.size(), " vs units ", units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    FSDP_ASSERT(units[u].shard_offset == 0 && units[u].shard_numel >= units[u].numel,
                "world size 1 must hold the whole flat gradient of unit ", u);
    for (const auto& p : units[u].params) {
      // A copy: the next backward reuses the gradient buffer.
      out.emplace_back(prefix + p.name,
                       shards[u].grad.narrow(0, p.flat_offset, p.numel).view(p.shape).to(at::kFloat).clone());
    }
  }
  return out;
}

int run_model(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() >= 3 && args.size() <= 5, kUsage);
  const std::string& dir = args[0];
  const checkpoint::SafetensorsFile batch(args[1]);
  const at::Tensor tokens = batch.tensor("tokens");
  const at::Tensor targets = batch.tensor("targets");
  const std::vector<std::string> precisions = split(args.size() > 3 ? args[3] : "fp32,bf16");
  const std::vector<std::string> kernels = split(args.size() > 4 ? args[4] : "sdpa,eager");

  std::vector<std::pair<std::string, at::Tensor>> out;
  models::LlamaConfig cfg;
  for (const std::string& precision : precisions) {
    Loaded m = load(dir, precision, world);
    cfg = m.cfg;
    for (const std::string& kernel : kernels) {
      m.impl->set_attention_kernel(kernel_of(kernel));
      const std::string key = precision + "." + kernel + ".";
      {
        at::NoGradGuard no_grad;
        out.emplace_back(key + "logits", m.root->forward(tokens).to(at::kFloat).clone());
      }
      m.sharded->zero_grad();
      const at::Tensor loss = m.root->forward(tokens, targets);
      FSDP_ASSERT(loss.scalar_type() == at::kFloat, "the loss is fp32 whatever the precision, got ",
                  loss.scalar_type());
      loss.backward();
      out.emplace_back(key + "loss", loss.detach().reshape({1}));
      for (auto& g : gradients(*m.sharded, key + "grad.")) out.push_back(std::move(g));
    }
  }
  out.emplace_back("inv_freq", models::llama_rope_inv_freq(cfg));
  checkpoint::save_safetensors(args[2], out, metadata_of(cfg));
  return 0;
}

int run_config(const std::vector<std::string>& args) {
  FSDP_CHECK(args.size() == 2, kUsage);
  const models::LlamaConfig cfg = models::resolve_model_config(args[0]);
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);
  FsdpOptions fo;
  fo.wrap = WrapPolicy::by_type({models::llama_block_type()});
  const ShardingPlan plan = plan_sharding(root.ptr(), /*world_size=*/8, /*rank=*/0, fo);
  nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
  for (const auto& p : impl->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
  std::map<std::string, std::string> meta = metadata_of(cfg);
  meta["num_parameters"] = std::to_string(cfg.num_parameters());
  meta["planned_parameters"] = std::to_string(plan.parameters);
  meta["parameters"] = shapes.dump();
  checkpoint::save_safetensors(args[1], {{"inv_freq", models::llama_rope_inv_freq(cfg)}}, meta);
  return 0;
}

int run_checkpoint(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 3, kUsage);
  const auto list = checkpoint::list_checkpoints(args[0]);
  FSDP_CHECK(!list.empty(), "no checkpoint in ", args[0]);
  std::ifstream in(list.front().path + "/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(in);
  Loaded m = build(models::parse_hf_config(manifest.at("model_config").dump(), list.front().path), "fp32", world);
  const checkpoint::LoadResult r = checkpoint::load_latest_checkpoint(args[0], *m.sharded, nullptr, *world);
  FSDP_CHECK(r.loaded && r.path == list.front().path, "checkpoint ", list.front().path, " did not load");
  const checkpoint::SafetensorsFile batch(args[1]);
  at::NoGradGuard no_grad;
  const at::Tensor logits = m.root->forward(batch.tensor("tokens")).to(at::kFloat).clone();
  checkpoint::save_safetensors(
      args[2], {{"fp32.sdpa.logits", logits}, {"inv_freq", models::llama_rope_inv_freq(m.cfg)}}, metadata_of(m.cfg));
  return 0;
}

int run_export(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 3, kUsage);
  Loaded m = load(args[0], "fp32", world);
  checkpoint::HfExportOptions eo;
  eo.dtype = checkpoint::parse_export_dtype(args[2]);
  const checkpoint::HfExportResult r = checkpoint::export_hf(args[1], *m.sharded, m.cfg, *world, eo);
  std::cout << "exported " << r.dir << "\n";
  return 0;
}

int run(int argc, char** argv) {
  FSDP_CHECK(argc >= 2, kUsage);
  const std::string mode = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (mode == "config") return run_config(args);
  // One process, no launcher: rank 0 of 1, no network.
  const comm::Runtime rt = comm::init_process_group(comm::WorldInfo{});
  if (mode == "model") return run_model(args, rt.world_group);
  if (mode == "export") return run_export(args, rt.world_group);
  if (mode == "checkpoint") return run_checkpoint(args, rt.world_group);
  FSDP_CHECK(false, "unknown mode '", mode, "'; ", kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("hf_probe", [&] { return run(argc, argv); }); }

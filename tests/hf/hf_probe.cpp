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
//         <p>.<k>.router_logits.<i>   (B*T, E)   mixtral: layer i's router logits
//         <p>.<k>.aux_loss            (1)        mixtral: the load-balancing loss
//                                     (the loss above includes router_aux_loss_coef x it)
//   hf_probe config SPEC OUT
//       SPEC: a preset, a config.json or a directory holding one. No weights.
//       Metadata besides "config": "num_parameters" (LlamaConfig::num_parameters),
//       "active_parameters" (LlamaConfig::active_parameters),
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
//   hf_probe lora DIR ADAPTER BATCH OUT LAYOUT
//       DIR's weights with the PEFT adapter ADAPTER on top: apply_lora with
//       its adapter_config.json, checkpoint::import_peft_adapter*, fp32, SDPA.
//       LAYOUT: "unsharded" (the module itself on the CPU: import_hf_module)
//       or "sharded" (fully_shard as `model` builds it: a frozen base beside
//       trainable adapters). OUT: "logits" (B, T, V), "loss" (1) and
//       "grad.<name>" of each <linear>.lora_A.weight / lora_B.weight.
//   hf_probe lora-export DIR ADAPTER OUTDIR KIND
//       The sharded model above, exported: KIND "merged" (export_hf with the
//       adapters merged) or "adapter" (export_peft_adapter).
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
#include "fsdp/checkpoint/peft.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/unit.h"
#include "fsdp/train/family_llama.h"

namespace {

using namespace fsdp;  // NOLINT: a test program

constexpr const char* kUsage =
    "usage: hf_probe model DIR BATCH OUT [PRECISIONS [KERNELS]] | hf_probe config SPEC OUT | "
    "hf_probe export DIR OUTDIR DTYPE | hf_probe checkpoint CKDIR BATCH OUT | "
    "hf_probe lora DIR ADAPTER BATCH OUT LAYOUT | hf_probe lora-export DIR ADAPTER OUTDIR KIND";

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
// its first step (src/train/trainer.cpp, model_build.cpp): the config from DIR, the model on the
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
  checkpoint::import_hf(dir, *m.sharded, train::llama_hf_info(m.cfg), *world);
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
        if (m.cfg.moe()) {  // Mixtral: every layer's router logits and the load-balancing loss
          const models::RouterOutputs r =
              models::RouterOutputs::unpack(m.root->forward(tokens, models::WithRouterLogits{}));
          for (size_t i = 0; i < r.router_logits.size(); ++i) {
            out.emplace_back(key + "router_logits." + std::to_string(i), r.router_logits[i].to(at::kFloat).clone());
          }
          out.emplace_back(key + "aux_loss", r.aux_loss.to(at::kFloat).reshape({1}).clone());
        }
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
  meta["active_parameters"] = std::to_string(cfg.active_parameters());
  meta["planned_parameters"] = std::to_string(plan.parameters);
  meta["parameters"] = shapes.dump();
  checkpoint::save_safetensors(args[1], {{"inv_freq", models::llama_rope_inv_freq(cfg)}}, meta);
  return 0;
}

int run_checkpoint(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 3, kUsage);
  const auto list = checkpoint::list_checkpoints(args[0]);
  FSDP_CHECK(!list.empty(), "no checkpoint in ", args[0]);
  const nlohmann::json saved = checkpoint::read_checkpoint_state(list.front().path)->at(checkpoint::kModelKey);
  Loaded m = build(models::parse_hf_config(saved.at("config").dump(), list.front().path), "fp32", world);
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
  const checkpoint::HfExportResult r = checkpoint::export_hf(args[1], *m.sharded, train::llama_hf_info(m.cfg), *world, eo);
  std::cout << "exported " << r.dir << "\n";
  return 0;
}

// DIR's model with ADAPTER's LoRA adapters, sharded as `build` shards a model
// (what `fsdp-train --init-from DIR --init-adapter ADAPTER` builds).
Loaded load_lora(const std::string& dir, const std::string& adapter, const comm::ProcessGroupPtr& world) {
  Loaded m;
  m.cfg = models::resolve_model_config(dir);
  const models::LoraConfig lora = checkpoint::read_peft_adapter_config(adapter);
  m.impl = std::make_shared<models::LlamaForCausalLMImpl>(m.cfg, at::TensorOptions().device(at::kMeta), /*seed=*/0);
  models::apply_lora(*m.impl, lora, /*seed=*/0);
  m.root = std::make_shared<nn::UnitImpl<models::LlamaForCausalLMImpl>>(m.impl);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::kFullShard;
  fo.wrap = WrapPolicy::by_type({models::llama_block_type()});
  fo.init_rule = models::lora_init_rule(*m.impl, models::llama_init_rule(m.cfg));
  m.sharded = fully_shard(m.root, world, fo);
  checkpoint::import_hf(dir, *m.sharded, train::llama_hf_info(m.cfg), *world);
  checkpoint::import_peft_adapter(adapter, *m.sharded);
  return m;
}

int run_lora(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 5 && (args[4] == "sharded" || args[4] == "unsharded"), kUsage);
  const checkpoint::SafetensorsFile batch(args[2]);
  const at::Tensor tokens = batch.tensor("tokens");
  const at::Tensor targets = batch.tensor("targets");
  std::vector<std::pair<std::string, at::Tensor>> out;
  models::LlamaConfig cfg = models::resolve_model_config(args[0]);
  if (args[4] == "unsharded") {
    auto model = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions(), /*seed=*/0);
    models::apply_lora(*model, checkpoint::read_peft_adapter_config(args[1]), /*seed=*/0);
    checkpoint::import_hf_module(args[0], *model, train::llama_hf_info(cfg));
    checkpoint::import_peft_adapter_module(args[1], *model);
    {
      at::NoGradGuard no_grad;
      out.emplace_back("logits", model->forward(tokens).clone());
    }
    const at::Tensor loss = model->loss(tokens, targets);
    loss.backward();
    out.emplace_back("loss", loss.detach().reshape({1}));
    for (const auto& p : model->named_parameters()) {
      FSDP_ASSERT(models::is_lora_parameter(p.key()) == p.value().grad().defined(), "gradient of ", p.key());
      if (p.value().grad().defined()) out.emplace_back("grad." + p.key(), p.value().grad().clone());
    }
  } else {
    Loaded m = load_lora(args[0], args[1], world);
    {
      at::NoGradGuard no_grad;
      out.emplace_back("logits", m.root->forward(tokens).to(at::kFloat).clone());
    }
    m.sharded->zero_grad();
    const at::Tensor loss = m.root->forward(tokens, targets);
    loss.backward();
    out.emplace_back("loss", loss.detach().reshape({1}));
    const std::vector<ShardRef> shards = m.sharded->shards();
    const auto& units = m.sharded->units();
    for (size_t u = 0; u < units.size(); ++u) {
      for (const auto& p : units[u].params) {
        FSDP_ASSERT(models::is_lora_parameter(p.name) == units[u].trainable, "entry of ", p.name);
        if (!units[u].trainable) continue;
        out.emplace_back("grad." + p.name,
                         shards[u].grad.narrow(0, p.flat_offset, p.numel).view(p.shape).to(at::kFloat).clone());
      }
    }
  }
  out.emplace_back("inv_freq", models::llama_rope_inv_freq(cfg));
  checkpoint::save_safetensors(args[3], out, metadata_of(cfg));
  return 0;
}

int run_lora_export(const std::vector<std::string>& args, const comm::ProcessGroupPtr& world) {
  FSDP_CHECK(args.size() == 4 && (args[3] == "merged" || args[3] == "adapter"), kUsage);
  Loaded m = load_lora(args[0], args[1], world);
  const models::LoraConfig lora = checkpoint::read_peft_adapter_config(args[1]);
  if (args[3] == "merged") {
    checkpoint::HfExportOptions eo;
    eo.lora_scaling = lora.alpha / static_cast<double>(lora.rank);
    checkpoint::export_hf(args[2], *m.sharded, train::llama_hf_info(m.cfg), *world, eo);
  } else {
    checkpoint::PeftExportOptions po;
    po.base_model = args[0];
    checkpoint::export_peft_adapter(args[2], *m.sharded, lora, *world, po);
  }
  std::cout << "exported " << args[2] << "\n";
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
  if (mode == "lora") return run_lora(args, rt.world_group);
  if (mode == "lora-export") return run_lora_export(args, rt.world_group);
  FSDP_CHECK(false, "unknown mode '", mode, "'; ", kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("hf_probe", [&] { return run(argc, argv); }); }

// The one place the trainer builds a model: for training, for validating the
// options, for the memory check and for converting a checkpoint (Note
// [Building the model] in model_build.cpp).
//
// A model family says how to build a model of a resolved configuration and
// what the engine needs to know about it (its block type, its
// initialization rule, its loss through the root unit). Adding a family is
// one more entry in model_families(); nothing else in the trainer names a
// model class.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/train/trainer.h"

namespace fsdp::train {

// The loss of (tokens, targets) through the root unit: kMean for training
// (fp32 scalar), kSum for evaluation (sum over the non-ignored targets).
using LossFn = std::function<at::Tensor(const at::Tensor& tokens, const at::Tensor& targets,
                                        models::LossReduction reduction)>;

// A model wrapped in its root unit, which fully_shard takes.
struct RootedModel {
  std::shared_ptr<nn::UnitBase> root;
  LossFn loss;
};

struct ModelFamily {
  std::string name;  // "llama"
  // Whether this family builds models of `cfg` (its model_type).
  std::function<bool(const models::LlamaConfig& cfg)> accepts;
  // The model on options' device: on the meta device shapes only; on a real
  // device every parameter initialized from (seed, name) by init_rule(cfg).
  std::function<std::shared_ptr<torch::nn::Module>(const models::LlamaConfig& cfg, const at::TensorOptions& options,
                                                   uint64_t seed)>
      make;
  // The root unit around a model that `make` built (after LoRA and freezing).
  std::function<RootedModel(const std::shared_ptr<torch::nn::Module>& model)> root;
  // The transformer block: the unit of activation checkpointing.
  std::type_index block_type = std::type_index(typeid(void));
  // The units of WrapChoice::kBlock: the blocks, the embedding and the output head.
  std::vector<std::type_index> unit_types;
  // Rows per chunk of the loss's logits (StepOptions::loss_chunk_rows; 0: the model's choice).
  std::function<void(torch::nn::Module& model, int64_t rows)> set_loss_chunk_rows;
  // How the engine materializes the shards of a model built on the meta device.
  std::function<nn::InitRuleFn(const models::LlamaConfig& cfg)> init_rule;
  // The family owns its configuration (Note [State seam]): how a checkpoint
  // records it, how it is read back from one (`origin` names the checkpoint
  // in errors), and "" when a saved configuration describes the model of
  // `cfg` (else the first difference, "<field> <saved> vs <now>").
  std::function<nlohmann::json(const models::LlamaConfig& cfg)> save_config;
  std::function<models::LlamaConfig(const nlohmann::json& saved, const std::string& origin)> load_config;
  std::function<std::string(const nlohmann::json& saved, const models::LlamaConfig& cfg, const std::string& origin)>
      config_mismatch;
};

// Every family, in the order they are asked.
const std::vector<ModelFamily>& model_families();
// The family that builds `cfg`; UsageError naming its model_type when none does.
const ModelFamily& model_family(const models::LlamaConfig& cfg);

// The model's checkpoint metadata (state "model"): {"family": name, "config": family.save_config(cfg)}.
nlohmann::json model_state(const models::LlamaConfig& cfg);
// The family a checkpoint's model metadata `saved` names; UsageError naming
// `origin` when it names none (a checkpoint of another program version).
const ModelFamily& saved_model_family(const nlohmann::json& saved, const std::string& origin);
// "" when checkpoint `origin`'s model metadata `saved` describes the model of
// `cfg` (the same family and configuration), else the first difference.
std::string saved_model_mismatch(const nlohmann::json& saved, const models::LlamaConfig& cfg,
                                 const std::string& origin);

// The model configuration a run uses, read once (Note [Building the model]):
//   training and evaluation: options.model, which must agree with
//     hf.init_from's config.json when given (whose special token ids win);
//   conversion: the newest checkpoint's manifest, which options.model (when
//     non-empty) must agree with.
// UsageError for a model spec that does not resolve or configs that disagree.
models::LlamaConfig resolve_model_config(const TrainOptions& options);

// Where and how build_model builds.
struct BuildOptions {
  at::Device device = at::kMeta;  // kMeta: shapes only (plans, checks, sharded builds); kCPU: values
  uint64_t seed = 0;               // initialization and LoRA's A matrices
  bool freeze = true;              // apply options.freeze (a conversion loads every parameter as saved)
  // Runs on the model after LoRA and freezing, before the root unit: rank 0
  // reading weights under --sync-module-states.
  std::function<void(torch::nn::Module& model)> before_root;
};

struct BuiltModel {
  const ModelFamily* family = nullptr;
  models::LlamaConfig config;
  std::shared_ptr<torch::nn::Module> model;  // LoRA adapters added, options.freeze applied
  std::shared_ptr<nn::UnitBase> root;        // fully_shard's argument
  LossFn loss;
  nn::InitRuleFn init_rule;  // the family's, and LoRA's for the adapters
};

// The model of `cfg` with the run's LoRA adapters (options.lora) and frozen
// parameters (options.freeze), in its root unit. UsageError for LoRA targets
// the model lacks and a --freeze pattern that freezes nothing or everything.
BuiltModel build_model(const TrainOptions& options, const models::LlamaConfig& cfg, const BuildOptions& build);

// The engine's options for a model of `family`: the trainer's sharding
// choices (hybrid size 0 is left for the caller to fill in with
// LOCAL_WORLD_SIZE), checked against `world_size` (0: unknown).
FsdpOptions engine_options(const TrainOptions& options, const ModelFamily& family, int world_size);

// UsageError unless the trainer's sharding choices fit the engine (any model
// family: the checks do not depend on its block type).
void check_engine_options(const TrainOptions& options, int world_size);

// options.lora as the models layer takes it.
models::LoraConfig lora_config(const TrainOptions& options);

// --device's spelling of a device type ("cpu", "cuda"), as worker_device takes it.
std::string device_name(at::DeviceType type);

}  // namespace fsdp::train

// The one place the trainer builds a model: for training, for validating the
// options, for the memory check and for converting a checkpoint (Note
// [Building the model] in model_build.cpp).
//
// The model is its family's (model_family.h): the trainer names no model
// class and no config type.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/models/lora.h"
#include "fsdp/train/options.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

// The model configuration a run uses, read once (Note [Building the model]):
//   training and evaluation: options.model, which must agree with
//     hf.init_from's config.json when given (whose special token ids win);
//   conversion: the newest checkpoint's manifest, which options.model (when
//     non-empty) must agree with.
// UsageError for a model spec that does not resolve or configs that disagree.
ModelConfigPtr resolve_model_config(const TrainOptions& options);

// Where and how build_model builds.
struct BuildOptions {
  at::Device device = at::kMeta;  // kMeta: shapes only (plans, checks, sharded builds); kCPU: values
  uint64_t seed = 0;               // initialization and LoRA's A matrices
  bool freeze = true;              // apply `freeze` (a conversion loads every parameter as saved)
  // Runs on the model after LoRA and freezing, before the root unit: rank 0
  // reading weights under --sync-module-states.
  std::function<void(torch::nn::Module& model)> before_root;
};

struct BuiltModel {
  ModelConfigPtr config;
  std::shared_ptr<torch::nn::Module> model;  // LoRA adapters added, `freeze` applied
  std::shared_ptr<nn::UnitBase> root;        // fully_shard's argument
  LossFn loss;
  nn::InitRuleFn init_rule;  // the family's, and LoRA's for the adapters
};

// The model of `cfg` with the run's LoRA adapters (`lora`) and, with
// BuildOptions::freeze, its frozen parameters (TrainOptions::freeze) and
// `param_groups`' --lr-scale patterns checked against it, in its root unit;
// its loss chunk and layer kernels are `step`'s. UsageError for LoRA targets
// the model lacks and a --freeze pattern that freezes nothing or everything.
BuiltModel build_model(const StepOptions& step, const LoraOptions& lora, const std::string& freeze,
                       const optim::ParamGroupOptions& param_groups, const ModelConfigPtr& cfg,
                       const BuildOptions& build);

// UsageError unless the trainer's sharding choices fit the engine (any model
// family: the checks do not depend on its block type).
void check_engine_options(const TrainOptions& options, int world_size);

// The run's LoRA options as the models layer takes them.
models::LoraConfig lora_config(const LoraOptions& lora);

}  // namespace fsdp::train

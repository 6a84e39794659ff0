#include "train/model_build.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/freeze.h"
#include "fsdp/optim/adamw.h"

namespace fsdp::train {

// Note [Building the model]
// Every model the trainer uses comes from build_model: the one it trains
// (on the meta device, each rank materializing its own shards; on the CPU
// for rank 0 under --sync-module-states), the one validate_options builds to
// check the LoRA targets and --freeze, the one check_memory plans, and the
// one a conversion loads a checkpoint into. The steps are always the same and
// in this order: the family's model of the resolved config; LoRA adapters
// (models/lora.h), whose init rule extends the family's; --freeze; what the
// caller reads into the whole model (before_root); the root unit, which
// registers the model's parameters as they are then. The configuration is
// resolved by resolve_model_config, once per process and purpose: the
// Trainer resolves it once and hands it to the checks and the build.

namespace {

// The model config of --model `model` for a run from --init-from `init_from`
// ("": none), which must agree when it names another directory (when
// --model was not given the CLI sets it to the directory).
ModelConfigPtr init_config(const std::string& model, const std::string& init_from) {
  ModelConfigPtr cfg = resolve_model(model);
  if (init_from.empty()) return cfg;
  // A PyTorch distributed checkpoint holds weights only: the model is --model's.
  if (checkpoint::is_dcp_dir(init_from) && !std::filesystem::exists(std::filesystem::path(init_from) / "config.json")) {
    return cfg;
  }
  const ModelConfigPtr from = resolve_model(init_from);
  const std::string diff = model_mismatch(*cfg, *from);
  FSDP_CHECK(diff.empty(), "TrainOptions::model ", model, " and HfOptions::init_from ", init_from,
             "/config.json describe different models (", diff, "); leave out TrainOptions::model to take the config "
             "from ", init_from);
  // The special token ids name tokens of the vocabulary the weights were
  // trained with, whatever --model says; --export-hf writes them back.
  return cfg->with_token_ids_of(*from);
}

// The model config of the newest checkpoint in `dir` whose manifest reads
// (checkpoints of one directory hold one model: resume refuses another).
ModelConfigPtr checkpoint_model_config(const std::string& dir) {
  const auto list = checkpoint::list_checkpoints(dir);
  FSDP_CHECK(!list.empty(), "CheckpointOptions::dir ", dir, " holds no checkpoint (step_NNNNNNNN/ with manifest.json) "
             "to convert; converting needs an existing checkpoint — point CheckpointOptions::dir at the run's "
             "directory");
  std::string why;
  for (const auto& c : list) {
    nlohmann::json saved;
    try {
      saved = checkpoint::read_checkpoint_state(c.path)->value(checkpoint::kModelKey, nlohmann::json());
    } catch (const std::exception& e) {
      why += fmt::format("; {}: {}", c.path, e.what());
      continue;
    }
    return saved_model_config(saved, c.path);
  }
  FSDP_FAIL("no checkpoint in ", dir, " has a readable manifest", why);
}

// The config a conversion exports: the checkpoint's, which --model (when
// given: non-empty) must agree with.
ModelConfigPtr conversion_config(const TrainOptions& o) {
  // A Hugging Face directory (convert --init-from): its config.json, which --model (when given) must agree with.
  if (!o.hf.init_from.empty()) return init_config(o.model.empty() ? o.hf.init_from : o.model, o.hf.init_from);
  // A PyTorch distributed checkpoint at the top of the directory (no checkpoint of ours in it):
  // its config.json when it has one (fsdp-train convert --export-dcp writes it), else --model.
  const std::filesystem::path dir(o.checkpoint.dir);
  if (checkpoint::list_checkpoints(o.checkpoint.dir).empty() && checkpoint::is_dcp_dir(o.checkpoint.dir)) {
    if (std::filesystem::exists(dir / "config.json")) return resolve_model(o.checkpoint.dir);
    FSDP_CHECK(!o.model.empty(), "CheckpointOptions::dir ", o.checkpoint.dir, " is a PyTorch distributed checkpoint "
               "without config.json: name its model with TrainOptions::model (a preset, a config.json or a Hugging "
               "Face directory)");
    return resolve_model(o.model);
  }
  ModelConfigPtr cfg = checkpoint_model_config(o.checkpoint.dir);
  if (!o.model.empty()) {
    const ModelConfigPtr named = resolve_model(o.model);
    const std::string diff = model_mismatch(*named, *cfg);
    FSDP_CHECK(diff.empty(), "TrainOptions::model ", o.model, " and the checkpoints in ", o.checkpoint.dir,
               " describe different models (", diff, "); leave out TrainOptions::model to convert the checkpoint's "
               "model");
  }
  return cfg;
}

}  // namespace

ModelConfigPtr resolve_model_config(const TrainOptions& o) {
  return o.mode == Mode::kConvert ? conversion_config(o) : init_config(o.model, o.hf.init_from);
}

models::LoraConfig lora_config(const LoraOptions& lora) {
  models::LoraConfig c;
  c.rank = lora.rank;
  c.alpha = lora.effective_alpha();
  c.dropout = lora.dropout;
  c.targets = lora.targets;
  return c;
}

BuiltModel build_model(const StepOptions& step, const LoraOptions& lora, const std::string& freeze,
                       const optim::ParamGroupOptions& param_groups, const ModelConfigPtr& cfg,
                       const BuildOptions& b) {
  BuiltModel m;
  m.config = cfg;
  m.model = cfg->make(at::TensorOptions().device(b.device), b.seed);
  m.init_rule = cfg->init_rule();
  cfg->set_loss_chunk_rows(*m.model, step.loss_chunk_rows);
  models::set_layer_kernels(*m.model, step.kernels);
  const int64_t fp8_products = models::set_fp8_linears(*m.model, step.fp8_linear);
  if (step.fp8_linear != models::Fp8Linear::kOff) {
    FSDP_CHECK(fp8_products > 0, "StepOptions::fp8_linear ", models::to_string(step.fp8_linear),
               ": this model has no decoder products (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
               "down_proj) to run in FP8; use off");
    // LoRA freezes the base weights, and a frozen weight keeps the plain
    // product (models::LinearImpl::set_fp8): nothing would run in FP8.
    FSDP_CHECK(!lora.enabled(), "StepOptions::fp8_linear ", models::to_string(step.fp8_linear),
               " with LoRA: the frozen base products stay in the compute dtype and the adapters are not FP8; "
               "use off with LoRA");
  }
  if (lora.enabled()) {
    // UsageError for values and targets the model lacks.
    models::apply_lora(*m.model, lora_config(lora), b.seed);
    m.init_rule = models::lora_init_rule(*m.model, m.init_rule);
  }
  // Before fully_shard lays the units out (Note [Frozen parameters] in the engine).
  if (b.freeze && !freeze.empty()) nn::freeze_matching(*m.model, freeze);
  if (b.freeze) optim::check_lr_scales_match(param_groups, *m.model);  // as --freeze: a pattern must select something
  if (b.before_root) b.before_root(*m.model);
  RootedModel r = cfg->root(m.model);
  m.root = std::move(r.root);
  m.loss = std::move(r.loss);
  return m;
}

FsdpOptions engine_options(const TrainOptions& o, const ModelConfig* cfg, int world_size) {
  FSDP_CHECK(o.activation_checkpointing || o.fsdp.checkpoint_policy == nn::RecomputePolicy::kTail,
             "FsdpOptions::checkpoint_policy ", nn::to_string(o.fsdp.checkpoint_policy),
             " chooses what activation checkpointing recomputes: turn on TrainOptions::activation_checkpointing");
  FSDP_CHECK(o.fsdp.hybrid_shard_size >= 0, "FsdpOptions::hybrid_shard_size must be >= 1 (or 0 for "
             "LOCAL_WORLD_SIZE), got ", o.fsdp.hybrid_shard_size);
  FsdpOptions fo = o.fsdp;
  if (fo.wrap.kind == WrapPolicy::Kind::kByType && fo.wrap.types.empty() && cfg != nullptr) {
    fo.wrap.types = cfg->unit_types();  // the model's blocks: the trainer's default
  }
  if (cfg != nullptr) {
    // The head and the last layer first: the caller's overrides come after, so theirs win.
    std::vector<UnitOverride> overrides = last_units_kept(*cfg, fo);
    overrides.insert(overrides.end(), o.fsdp.unit_overrides.begin(), o.fsdp.unit_overrides.end());
    fo.unit_overrides = std::move(overrides);
  }
  if (o.activation_checkpointing) {
    fo.checkpoint_types = {cfg != nullptr ? cfg->block_type() : std::type_index(typeid(void))};
  }
  fo.device = o.device;
  // 0 (LOCAL_WORLD_SIZE) is resolved where the node's size is known (worker_engine_options,
  // check_memory); the other checks hold for any shard-group size.
  FsdpOptions checked = fo;
  if (checked.strategy == ShardingStrategy::kHybridShard && checked.hybrid_shard_size == 0) {
    checked.hybrid_shard_size = 1;
    checked.reshard_after_forward.reset();  // its divisor check waits for the node's size too
  }
  check_options(checked, world_size);
  return fo;
}

void check_engine_options(const TrainOptions& o, int world_size) {
  engine_options(o, nullptr, world_size);  // the units' types are not what the checks look at
}


}  // namespace fsdp::train

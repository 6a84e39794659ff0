// Model families: what the trainer knows of a model, whatever its
// architecture (Note [Model families] in src/train/model_family.cpp).
//
// A family (Llama-style decoders, T5) owns its configuration type: it reads
// its presets and its Hugging Face config.json files into a ModelConfig, and
// that object answers everything the trainer, the checks, the checkpoints,
// the exports and fsdp-inspect ask of the model. Nothing outside a family's
// own file (family_llama.cpp, family_t5.cpp) names a model class or a config
// struct; adding a family is one such file and one entry in model_families().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/chunked_loss.h"
#include "fsdp/models/op_work.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/recompute.h"
#include "fsdp/nn/unit.h"

namespace fsdp::train {

// The loss of (inputs, targets) through the root unit: kMean for training
// (fp32 scalar), kSum for evaluation (sum over the non-ignored targets).
using LossFn = std::function<at::Tensor(const at::Tensor& inputs, const at::Tensor& targets,
                                        models::LossReduction reduction)>;

// A model wrapped in its root unit, which fully_shard takes.
struct RootedModel {
  std::shared_ptr<nn::UnitBase> root;
  LossFn loss;
};

// Parameter names and shapes (forward_flops_per_token's argument).
using ParamShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// What a run trains on: windows of one token stream (a language model), or
// (input, target) pairs (an encoder-decoder; data::PairDataset).
enum class DataKind { kTokenStream, kPairs };

class ModelFamily;

// One model's configuration, as the trainer sees it. Immutable; shared.
class ModelConfig {
 public:
  virtual ~ModelConfig() = default;
  virtual const ModelFamily& family() const = 0;

  // --- facts
  virtual std::string name() const = 0;     // a preset name or the config.json path
  virtual std::string summary() const = 0;  // one line for logs
  virtual int64_t vocab_size() const = 0;   // V
  virtual int64_t hidden_size() const = 0;  // D, the loss's rows' width
  virtual int64_t num_parameters() const = 0;
  virtual double training_flops_per_token(int64_t seq_len) const = 0;
  virtual double forward_flops_per_token(const ParamShapes& params, int64_t seq_len) const = 0;
  // The work of the part of the model owning `params` for one micro-batch, by
  // operation class (models/op_work.h: the GPU roofline of the step-time
  // model); nullopt where the family does not count it (the estimate then
  // times FLOPs at ClusterSpec::compute_efficiency of the peak).
  virtual std::optional<models::UnitWork> unit_work(const ParamShapes& params, bool trainable,
                                                    const models::WorkShape& shape) const {
    (void)params, (void)trainable, (void)shape;
    return std::nullopt;
  }
  // The longest --seq-len the model takes (max_position_embeddings); nullopt: any.
  virtual std::optional<int64_t> max_seq_len() const = 0;
  // Activation elements kept for backward per token of a micro-batch, a lower
  // bound (the memory check's, Note [Memory check]).
  virtual int64_t activation_elements_per_token(bool checkpointing, bool eval_only) const = 0;
  // Bytes activation checkpointing keeps from forward per token beyond the
  // layers' inputs, under `policy` (nn/recompute.h; ShardedModel::checkpoint_kept_bytes):
  // activations of `dtype` on `device` at sequence length `seq_len`. 0 for a
  // family whose layers mark nothing to keep.
  virtual int64_t checkpoint_kept_bytes_per_token(nn::RecomputePolicy policy, at::ScalarType dtype,
                                                  at::DeviceType device, int64_t seq_len) const {
    (void)policy, (void)dtype, (void)device, (void)seq_len;
    return 0;
  }
  virtual DataKind data_kind() const = 0;
  // Special token ids config.json gives (kept for exports and compared with
  // the tokenizer's); nullopt / empty: unknown.
  virtual std::optional<int64_t> bos_token_id() const = 0;
  virtual std::vector<int64_t> eos_token_id() const = 0;
  // The padding of DataKind::kPairs inputs (T5: 0); 0 where the model has none.
  virtual int64_t pad_token_id() const = 0;
  // This configuration with `from`'s special token ids (--init-from's
  // config.json, whose ids belong to the weights' vocabulary). Requires: the same family.
  virtual std::shared_ptr<const ModelConfig> with_token_ids_of(const ModelConfig& from) const = 0;

  // --- the model
  // On options' device: the meta device builds shapes only; a real device
  // initializes every parameter from (seed, name) by init_rule().
  virtual std::shared_ptr<torch::nn::Module> make(const at::TensorOptions& options, uint64_t seed) const = 0;
  // The root unit around a model that make() built (after LoRA and freezing).
  virtual RootedModel root(const std::shared_ptr<torch::nn::Module>& model) const = 0;
  virtual std::type_index block_type() const = 0;                // activation checkpointing's unit
  virtual std::vector<std::type_index> unit_types() const = 0;   // --wrap block's units
  // The units, by name, whose forward runs last when every layer is a unit
  // (--wrap block or all): backward needs their parameters first (Note [Last
  // units kept]). Empty: none named.
  virtual std::vector<std::string> last_forward_units() const { return {}; }
  virtual void set_loss_chunk_rows(torch::nn::Module& model, int64_t rows) const = 0;
  virtual nn::InitRuleFn init_rule() const = 0;

  // --- interchange
  // config.json as an export writes it (no "dtype": the exporter's), also
  // what a checkpoint records of the model (model_state).
  virtual std::string hf_config_json() const = 0;
  // Tensors of a Hugging Face directory that import skips (tied copies, old buffers).
  virtual checkpoint::HfIgnorable hf_ignorable() const = 0;
  // "" when `other` describes the same model (shapes, results, gradients),
  // else the first difference "<field> <this> vs <other>".
  virtual std::string mismatch(const ModelConfig& other) const = 0;
  // The names of torchtitan's DCP layout for this model; nullopt: it has none.
  virtual std::optional<checkpoint::DcpNames> torchtitan_names() const = 0;
  // The file name a SentencePiece tokenizer takes in this family's Hugging
  // Face directories ("tokenizer.model"; T5: "spiece.model").
  virtual std::string sentencepiece_file_name() const = 0;
};

using ModelConfigPtr = std::shared_ptr<const ModelConfig>;

// A family: its name, its presets, and its config.json reader.
class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string name() const = 0;  // "llama", "t5": recorded in checkpoints
  virtual std::vector<std::string> presets() const = 0;
  virtual ModelConfigPtr preset(const std::string& name) const = 0;  // null: none of that name
  // Whether its config.json reader takes model_type `type`.
  virtual bool reads(const std::string& model_type) const = 0;
  // config.json text -> the configuration; UsageError naming `origin` and the key.
  virtual ModelConfigPtr parse(const std::string& json_text, const std::string& origin) const = 0;
};

// Every family, in the order they are asked.
const std::vector<const ModelFamily*>& model_families();
const ModelFamily& llama_family();
const ModelFamily& t5_family();
// Every preset of every family, in that order.
std::vector<std::string> all_model_presets();

// `spec`: a preset of any family, a config.json, or a directory holding one
// (dispatched on its model_type). UsageError: an unknown name (listing the
// presets), a missing or unreadable file, a model_type no family reads, and
// whatever the family's reader refuses.
ModelConfigPtr resolve_model(const std::string& spec);

// The model's checkpoint metadata (state "model"): {"family": name, "config": config.json as JSON}.
nlohmann::json model_state(const ModelConfig& cfg);
// The configuration a checkpoint's model metadata `saved` records; UsageError
// naming `origin` when it names no family of this build.
ModelConfigPtr saved_model_config(const nlohmann::json& saved, const std::string& origin);
// "" when checkpoint `origin`'s model metadata `saved` describes the model of
// `cfg` (the same family and configuration), else the first difference.
std::string saved_model_mismatch(const nlohmann::json& saved, const ModelConfig& cfg, const std::string& origin);
// What Hugging Face import and export need of `cfg` (checkpoint/hf.h).
checkpoint::HfModelInfo hf_model_info(const ModelConfig& cfg);
// "" when `a` and `b` describe the same model; the families first.
std::string model_mismatch(const ModelConfig& a, const ModelConfig& b);

// The override fsdp-train adds to engine options `o` (strategy, wrap and
// reshard_after_forward already set): cfg.last_forward_units() keep their
// parameters after forward under FULL and HYBRID sharding with every layer a
// unit, when reshard_after_forward is left at the strategy's default. Empty
// otherwise. fsdp-train and fsdp-inspect both call it (Note [Last units kept]).
std::vector<UnitOverride> last_units_kept(const ModelConfig& cfg, const FsdpOptions& o);

}  // namespace fsdp::train

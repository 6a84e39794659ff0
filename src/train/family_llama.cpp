// The Llama family: Llama 2/3, Mistral, Mixtral, Qwen2, Qwen3 (one model class
// with per-type switches, models/llama.h; configs models/llama_config.h).
#include "fsdp/train/family_llama.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"

namespace fsdp::train {
namespace {

class LlamaModelConfig final : public ModelConfig {
 public:
  explicit LlamaModelConfig(models::LlamaConfig cfg) : cfg_(std::move(cfg)) {}

  const ModelFamily& family() const override { return llama_family(); }
  const models::LlamaConfig& llama() const { return cfg_; }

  std::string name() const override { return cfg_.name; }
  std::string summary() const override { return cfg_.summary(); }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t hidden_size() const override { return cfg_.hidden_size; }
  int64_t num_parameters() const override { return cfg_.num_parameters(); }
  double training_flops_per_token(int64_t seq_len) const override { return cfg_.training_flops_per_token(seq_len); }
  double forward_flops_per_token(const ParamShapes& params, int64_t seq_len) const override {
    return cfg_.forward_flops_per_token(params, seq_len);
  }
  std::optional<int64_t> max_seq_len() const override { return cfg_.max_position_embeddings; }
  // Per token and decoder layer: the norms, q/k/v/o and residuals (10 x D) and
  // the MLP's gate, up, act and product (4 x F); attention scores are left out
  // (a fused kernel keeps none). Checkpointed: each layer's input, plus one
  // layer while it is recomputed. (Measured on the tiny model: 281 MB over the
  // weights' at B=16, T=256; this says 210 MB.)
  int64_t activation_elements_per_token(bool checkpointing, bool eval_only) const override {
    const int64_t per_layer = 10 * cfg_.hidden_size + 4 * cfg_.intermediate_size;
    return eval_only ? per_layer
           : checkpointing ? cfg_.num_hidden_layers * cfg_.hidden_size + per_layer
                           : cfg_.num_hidden_layers * per_layer;
  }
  DataKind data_kind() const override { return DataKind::kTokenStream; }
  std::optional<int64_t> bos_token_id() const override { return cfg_.bos_token_id; }
  std::vector<int64_t> eos_token_id() const override { return cfg_.eos_token_id; }
  int64_t pad_token_id() const override { return cfg_.pad_token_id.value_or(0); }
  ModelConfigPtr with_token_ids_of(const ModelConfig& from) const override {
    models::LlamaConfig c = cfg_;
    c.bos_token_id = from.bos_token_id();
    c.eos_token_id = from.eos_token_id();
    return std::make_shared<LlamaModelConfig>(std::move(c));
  }

  std::shared_ptr<torch::nn::Module> make(const at::TensorOptions& options, uint64_t seed) const override {
    return std::make_shared<models::LlamaForCausalLMImpl>(cfg_, options, seed);
  }
  RootedModel root(const std::shared_ptr<torch::nn::Module>& model) const override {
    auto impl = std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(model);
    FSDP_ASSERT(impl != nullptr, "the llama family's root needs a LlamaForCausalLMImpl, got ", model->name());
    nn::Unit<models::LlamaForCausalLMImpl> unit(impl);
    RootedModel r;
    r.root = unit.ptr();
    r.loss = [unit](const at::Tensor& tokens, const at::Tensor& targets, models::LossReduction reduction) mutable {
      // The mean through the two-argument call, as the model's own loss() spells it.
      return reduction == models::LossReduction::kMean ? unit(tokens, targets) : unit(tokens, targets, reduction);
    };
    return r;
  }
  std::type_index block_type() const override { return models::llama_block_type(); }
  std::vector<std::type_index> unit_types() const override { return models::llama_unit_types(); }
  void set_loss_chunk_rows(torch::nn::Module& model, int64_t rows) const override {
    auto* impl = dynamic_cast<models::LlamaForCausalLMImpl*>(&model);
    FSDP_ASSERT(impl != nullptr, "the llama family's loss needs a LlamaForCausalLMImpl, got ", model.name());
    impl->set_loss_chunk_rows(rows);
  }
  nn::InitRuleFn init_rule() const override { return models::llama_init_rule(cfg_); }

  std::string hf_config_json() const override { return cfg_.to_hf_config_json(); }
  checkpoint::HfIgnorable hf_ignorable() const override { return checkpoint::hf_model_info(cfg_).ignorable; }
  std::string mismatch(const ModelConfig& other) const override {
    const auto* o = dynamic_cast<const LlamaModelConfig*>(&other);
    FSDP_ASSERT(o != nullptr, "llama config compared with a ", other.family().name(), " one");
    return checkpoint::config_mismatch(cfg_, o->cfg_);
  }
  std::optional<checkpoint::DcpNames> torchtitan_names() const override {
    return checkpoint::torchtitan_llama_names(cfg_.num_attention_heads, cfg_.num_key_value_heads);
  }
  std::string sentencepiece_file_name() const override { return "tokenizer.model"; }

 private:
  models::LlamaConfig cfg_;
};

class LlamaFamily final : public ModelFamily {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> presets() const override { return models::list_model_presets(); }
  ModelConfigPtr preset(const std::string& name) const override {
    std::optional<models::LlamaConfig> c = models::llama_preset(name);
    if (!c) return nullptr;
    c->validate();
    return std::make_shared<LlamaModelConfig>(std::move(*c));
  }
  bool reads(const std::string& type) const override {
    for (const char* t : {"llama", "mistral", "mixtral", "qwen2", "qwen3"}) {
      if (type == t) return true;
    }
    return false;
  }
  ModelConfigPtr parse(const std::string& json_text, const std::string& origin) const override {
    return std::make_shared<LlamaModelConfig>(models::parse_hf_config(json_text, origin));
  }
};

}  // namespace

const ModelFamily& llama_family() {
  static const LlamaFamily family;
  return family;
}

ModelConfigPtr llama_model_config(const models::LlamaConfig& cfg) { return std::make_shared<LlamaModelConfig>(cfg); }

const models::LlamaConfig* as_llama(const ModelConfig& cfg) {
  const auto* l = dynamic_cast<const LlamaModelConfig*>(&cfg);
  return l != nullptr ? &l->llama() : nullptr;
}

}  // namespace fsdp::train

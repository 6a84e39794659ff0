// The Llama family: Llama 2/3, Mistral, Mixtral, Qwen2, Qwen3 (one model class
// with per-type switches, models/llama.h; configs models/llama_config.h).
#include "fsdp/train/family_llama.h"

#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/common/name_pattern.h"
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
  std::optional<models::UnitWork> unit_work(const ParamShapes& params, bool trainable,
                                            const models::WorkShape& shape) const override {
    return cfg_.unit_work(params, trainable, shape);
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
  int64_t checkpoint_kept_bytes_per_token(nn::RecomputePolicy policy, at::ScalarType dtype, at::DeviceType device,
                                          int64_t seq_len) const override {
    int64_t n = 0;
    for (int64_t layer = 0; layer < cfg_.num_hidden_layers; ++layer) {
      n += models::llama_kept_bytes_per_token(cfg_, layer, policy, dtype, device, seq_len);
    }
    return n;
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
  // The head, then the last decoder layer (tied embeddings: the head is the
  // embedding's unit, which also runs first; only the layer is named).
  std::vector<std::string> last_forward_units() const override {
    std::vector<std::string> names;
    if (!cfg_.tie_word_embeddings) names.push_back("lm_head");
    if (cfg_.num_hidden_layers > 0) names.push_back("model.layers." + std::to_string(cfg_.num_hidden_layers - 1));
    return names;
  }
  void set_loss_chunk_rows(torch::nn::Module& model, int64_t rows) const override {
    auto* impl = dynamic_cast<models::LlamaForCausalLMImpl*>(&model);
    FSDP_ASSERT(impl != nullptr, "the llama family's loss needs a LlamaForCausalLMImpl, got ", model.name());
    impl->set_loss_chunk_rows(rows);
  }
  nn::InitRuleFn init_rule() const override { return models::llama_init_rule(cfg_); }

  std::string hf_config_json() const override { return cfg_.to_hf_config_json(); }
  checkpoint::HfIgnorable hf_ignorable() const override {
    const bool tied = cfg_.tie_word_embeddings;
    return [tied](const std::string& name) {
      if (tied && name == "lm_head.weight") return true;  // the tied head: embed_tokens
      // A buffer older transformers versions saved. A file's names are the user's
      // input: matched in linear time (Note [User patterns]), never by std::regex.
      static const NamePattern kInvFreq("^model\\.layers\\.[0-9]+\\.self_attn\\.rotary_emb\\.inv_freq$",
                                        "inv_freq");
      return kInvFreq.found_in(name);
    };
  }
  std::string mismatch(const ModelConfig& other) const override {
    const auto* o = dynamic_cast<const LlamaModelConfig*>(&other);
    FSDP_ASSERT(o != nullptr, "llama config compared with a ", other.family().name(), " one");
    return models::llama_config_mismatch(cfg_, o->cfg_);
  }
  std::optional<checkpoint::DcpNames> torchtitan_names() const override {
    return torchtitan_llama_names(cfg_.num_attention_heads, cfg_.num_key_value_heads);
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

checkpoint::DcpNames torchtitan_llama_names(int64_t heads, int64_t kv_heads) {
  checkpoint::DcpNames n;
  n.name = [](const std::string& ours) -> std::string {
    static const std::vector<std::pair<std::string, std::string>> layer = {
        {"self_attn.q_proj.weight", "attention.wq.weight"},    {"self_attn.k_proj.weight", "attention.wk.weight"},
        {"self_attn.v_proj.weight", "attention.wv.weight"},    {"self_attn.o_proj.weight", "attention.wo.weight"},
        {"mlp.gate_proj.weight", "feed_forward.w1.weight"},   {"mlp.down_proj.weight", "feed_forward.w2.weight"},
        {"mlp.up_proj.weight", "feed_forward.w3.weight"},     {"input_layernorm.weight", "attention_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"}};
    if (ours == "model.embed_tokens.weight") return "tok_embeddings.weight";
    if (ours == "model.norm.weight") return "norm.weight";
    if (ours == "lm_head.weight") return "output.weight";
    const std::string pre = "model.layers.";
    if (ours.rfind(pre, 0) == 0) {
      const size_t dot = ours.find('.', pre.size());
      if (dot != std::string::npos) {
        const std::string tail = ours.substr(dot + 1);
        for (const auto& [h, t] : layer) {
          if (tail == h) return "layers." + ours.substr(pre.size(), dot - pre.size()) + "." + t;
        }
      }
    }
    FSDP_CHECK(false, "parameter '", ours, "' has no name in torchtitan's Llama (it has no biases, q/k norms or "
               "adapters); save with CheckpointOptions::dcp_layout torch");
    return "";
  };
  n.row = [heads, kv_heads](const std::string& ours, int64_t row, int64_t rows) -> int64_t {
    // Hugging Face's q/k rows per head: [real halves | imaginary halves]
    // (rotate_half); Meta's and torchtitan's: interleaved pairs. Our row
    // h*hd + c*hd/2 + j is their row h*hd + 2j + c.
    const bool q = ours.find("self_attn.q_proj.weight") != std::string::npos;
    const bool k = ours.find("self_attn.k_proj.weight") != std::string::npos;
    if (!q && !k) return row;
    const int64_t n_heads = q ? heads : kv_heads;
    FSDP_CHECK(n_heads > 0 && rows % n_heads == 0 && (rows / n_heads) % 2 == 0, "parameter '", ours, "' has ", rows,
               " rows, not ", n_heads, " heads of an even size");
    const int64_t hd = rows / n_heads, half = hd / 2;
    const int64_t head = row / hd, w = row % hd;
    const int64_t c = w / half, j = w % half;
    return head * hd + 2 * j + c;
  };
  return n;
}

checkpoint::HfModelInfo llama_hf_info(const models::LlamaConfig& cfg) { return hf_model_info(*llama_model_config(cfg)); }

}  // namespace fsdp::train

// The T5 family: T5, T5 v1.1 and flan-T5 encoder-decoders (models/t5.h;
// configs models/t5_config.h), trained on (input, target) pairs.
#include <memory>

#include "fsdp/common/error.h"
#include "fsdp/models/t5.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {
namespace {

using models::T5ForConditionalGenerationImpl;

class T5ModelConfig final : public ModelConfig {
 public:
  explicit T5ModelConfig(models::T5Config cfg) : cfg_(std::move(cfg)) {}

  const ModelFamily& family() const override { return t5_family(); }

  std::string name() const override { return cfg_.name; }
  std::string summary() const override { return cfg_.summary(); }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t hidden_size() const override { return cfg_.d_model; }
  int64_t num_parameters() const override { return cfg_.num_parameters(); }
  double training_flops_per_token(int64_t seq_len) const override { return cfg_.training_flops_per_token(seq_len); }
  double forward_flops_per_token(const ParamShapes& params, int64_t seq_len) const override {
    return cfg_.forward_flops_per_token(params, seq_len);
  }
  std::optional<int64_t> max_seq_len() const override { return std::nullopt; }  // relative positions
  // Per token and block, as Llama's count: norms, q/k/v/o and residuals (10 x
  // D; a decoder block's cross-attention 4 x D more) and the feed-forward's
  // (2 or 3) x F; the scores (H x T per token) are left out, as there.
  int64_t activation_elements_per_token(bool checkpointing, bool eval_only) const override {
    const int64_t D = cfg_.d_model, ff = (cfg_.gated() ? 3 : 2) * cfg_.d_ff;
    const int64_t encoder = 10 * D + ff, decoder = 14 * D + ff;
    const int64_t blocks = cfg_.num_layers + cfg_.num_decoder_layers;
    return eval_only ? decoder
           : checkpointing ? blocks * D + decoder
                           : cfg_.num_layers * encoder + cfg_.num_decoder_layers * decoder;
  }
  DataKind data_kind() const override { return DataKind::kPairs; }
  std::optional<int64_t> bos_token_id() const override { return std::nullopt; }  // T5 has none
  std::vector<int64_t> eos_token_id() const override { return cfg_.eos_token_id; }
  int64_t pad_token_id() const override { return cfg_.pad_token_id; }
  ModelConfigPtr with_token_ids_of(const ModelConfig& from) const override {
    models::T5Config c = cfg_;
    c.eos_token_id = from.eos_token_id();
    return std::make_shared<T5ModelConfig>(std::move(c));
  }

  std::shared_ptr<torch::nn::Module> make(const at::TensorOptions& options, uint64_t seed) const override {
    return std::make_shared<T5ForConditionalGenerationImpl>(cfg_, options, seed);
  }
  RootedModel root(const std::shared_ptr<torch::nn::Module>& model) const override {
    auto impl = std::dynamic_pointer_cast<T5ForConditionalGenerationImpl>(model);
    FSDP_ASSERT(impl != nullptr, "the t5 family's root needs a T5ForConditionalGenerationImpl, got ", model->name());
    nn::Unit<T5ForConditionalGenerationImpl> unit(impl);
    RootedModel r;
    r.root = unit.ptr();
    r.loss = [unit](const at::Tensor& inputs, const at::Tensor& targets, models::LossReduction reduction) mutable {
      return reduction == models::LossReduction::kMean ? unit(inputs, targets) : unit(inputs, targets, reduction);
    };
    return r;
  }
  std::type_index block_type() const override { return models::t5_block_type(); }
  // The posts' wrapping: every T5Block; the shared embedding, final norms and
  // lm_head stay with the root.
  std::vector<std::type_index> unit_types() const override { return {models::t5_block_type()}; }
  void set_loss_chunk_rows(torch::nn::Module& model, int64_t rows) const override {
    auto* impl = dynamic_cast<T5ForConditionalGenerationImpl*>(&model);
    FSDP_ASSERT(impl != nullptr, "the t5 family's loss needs a T5ForConditionalGenerationImpl, got ", model.name());
    impl->set_loss_chunk_rows(rows);
  }
  nn::InitRuleFn init_rule() const override { return models::t5_init_rule(cfg_); }

  std::string hf_config_json() const override { return cfg_.to_hf_config_json(); }
  checkpoint::HfIgnorable hf_ignorable() const override {
    const bool tied = cfg_.tie_word_embeddings;
    return [tied](const std::string& name) {
      // The stacks' copies of shared.weight (older files hold them), the tied
      // head, and a bias transformers itself skips on load (_keys_to_ignore_on_load_unexpected).
      return name == "encoder.embed_tokens.weight" || name == "decoder.embed_tokens.weight" ||
             (tied && name == "lm_head.weight") ||
             name == "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight";
    };
  }
  std::string mismatch(const ModelConfig& other) const override {
    const auto* o = dynamic_cast<const T5ModelConfig*>(&other);
    FSDP_ASSERT(o != nullptr, "t5 config compared with a ", other.family().name(), " one");
    return models::t5_config_mismatch(cfg_, o->cfg_);
  }
  std::optional<checkpoint::DcpNames> torchtitan_names() const override { return std::nullopt; }
  std::string sentencepiece_file_name() const override { return "spiece.model"; }

 private:
  models::T5Config cfg_;
};

class T5Family final : public ModelFamily {
 public:
  std::string name() const override { return "t5"; }
  std::vector<std::string> presets() const override { return models::t5_preset_names(); }
  ModelConfigPtr preset(const std::string& name) const override {
    std::optional<models::T5Config> c = models::t5_preset(name);
    if (!c) return nullptr;
    c->validate();
    return std::make_shared<T5ModelConfig>(std::move(*c));
  }
  bool reads(const std::string& type) const override { return type == "t5"; }
  ModelConfigPtr parse(const std::string& json_text, const std::string& origin) const override {
    return std::make_shared<T5ModelConfig>(models::parse_t5_config(json_text, origin));
  }
};

}  // namespace

const ModelFamily& t5_family() {
  static const T5Family family;
  return family;
}

}  // namespace fsdp::train

#include "fsdp/models/llama_config.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

#include "fsdp/common/error.h"

namespace fsdp::models {

int64_t LlamaConfig::num_parameters() const {
  const int64_t D = hidden_size, F = intermediate_size, H = num_attention_heads, Hkv = num_key_value_heads;
  const int64_t Dh = dh(), L = num_hidden_layers, V = vocab_size;
  const int64_t attention = D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D;
  const int64_t mlp = 3 * D * F;
  const int64_t norms = 2 * D;
  return V * D + L * (attention + mlp + norms) + D + (tie_word_embeddings ? 0 : V * D);
}

void LlamaConfig::validate() const {
  const std::string who = "model config '" + name + "': ";
  auto positive = [&](const char* field, int64_t v) {
    FSDP_CHECK(v > 0, who, field, " = ", v, " must be positive — set it in config.json or pick a preset");
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("num_hidden_layers", num_hidden_layers);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  FSDP_CHECK(model_type == "llama" || model_type == "mistral", who, "model_type '", model_type,
             "' is not supported — use \"llama\" or \"mistral\"");
  FSDP_CHECK(head_dim >= 0, who, "head_dim = ", head_dim, " must be positive (or 0 for hidden_size / num_attention_heads)");
  if (head_dim == 0) {
    FSDP_CHECK(hidden_size % num_attention_heads == 0, who, "hidden_size (D=", hidden_size,
               ") is not a multiple of num_attention_heads (H=", num_attention_heads, ") — set head_dim explicitly");
  }
  FSDP_CHECK(dh() % 2 == 0, who, "head_dim (Dh=", dh(), ") must be even for rotary embeddings");
  FSDP_CHECK(num_attention_heads % num_key_value_heads == 0, who, "num_attention_heads (H=", num_attention_heads,
             ") must be a multiple of num_key_value_heads (Hkv=", num_key_value_heads,
             ") — grouped-query attention shares each kv head among H/Hkv query heads");
  FSDP_CHECK(rms_norm_eps > 0, who, "rms_norm_eps = ", rms_norm_eps, " must be positive (Llama uses 1e-5 or 1e-6)");
  FSDP_CHECK(rope_theta > 0, who, "rope_theta = ", rope_theta, " must be positive (Llama 2: 10000, Llama 3: 500000)");
  FSDP_CHECK(initializer_range >= 0, who, "initializer_range = ", initializer_range, " must be >= 0");
  if (rope_scaling) {
    const RopeScaling& s = *rope_scaling;
    FSDP_CHECK(s.factor > 0, who, "rope_scaling.factor = ", s.factor, " must be positive (Llama 3.1: 8)");
    FSDP_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor, who,
               "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor = ", s.low_freq_factor,
               ", high_freq_factor = ", s.high_freq_factor, " (Llama 3.1: 1 and 4)");
    FSDP_CHECK(s.original_max_position_embeddings > 0, who, "rope_scaling.original_max_position_embeddings = ",
               s.original_max_position_embeddings, " must be positive (Llama 3.1: 8192)");
  }
}

std::string LlamaConfig::summary() const {
  char params[32];
  const double n = static_cast<double>(num_parameters());
  if (n >= 1e9) {
    std::snprintf(params, sizeof(params), "%.2fB", n / 1e9);
  } else {
    std::snprintf(params, sizeof(params), "%.2fM", n / 1e6);
  }
  std::ostringstream os;
  os << (name.empty() ? "llama" : name) << ": D=" << hidden_size << " L=" << num_hidden_layers
     << " H=" << num_attention_heads << " Hkv=" << num_key_value_heads << " Dh=" << dh() << " F=" << intermediate_size
     << " V=" << vocab_size << " max_pos=" << max_position_embeddings << " rope_theta=" << rope_theta;
  if (rope_scaling) os << " rope_scaling=llama3(factor=" << rope_scaling->factor << ")";
  if (tie_word_embeddings) os << " tied";
  os << " " << params << " params";
  return os.str();
}

std::string LlamaConfig::to_hf_config_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = dh();
  j["num_hidden_layers"] = num_hidden_layers;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j.dump(2) + "\n";
}

}  // namespace fsdp::models

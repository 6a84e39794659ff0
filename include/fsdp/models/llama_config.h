// Llama-family model configuration (Llama 2, Llama 3.1, Llama 3.2, Mistral v0.1).
//
// Field names and meanings are those of Hugging Face's LlamaConfig / config.json,
// so a config round-trips with the files published next to the checkpoints.
//
// Dimension letters, used in every shape comment under fsdp/models (defined here, once):
//   B    batch: sequences per micro-batch
//   T    sequence length: tokens per sequence, T <= max_position_embeddings
//   D    hidden size (model width)                        hidden_size
//   H    attention (query) heads                          num_attention_heads
//   Hkv  key/value heads; H % Hkv == 0, GQA when Hkv < H  num_key_value_heads
//   Dh   head dimension, even (default D / H)             head_dim  (see dh())
//   L    decoder layers                                   num_hidden_layers
//   V    vocabulary size                                  vocab_size
//   F    MLP intermediate size                            intermediate_size
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {

// Llama 3.1's "llama3" rope_scaling (HF rope_type "llama3"). inv_freq is rescaled
// exactly as transformers' `_compute_llama3_parameters`: wavelengths longer than
// original_max_position_embeddings / low_freq_factor are divided by `factor`,
// shorter than original_max_position_embeddings / high_freq_factor are kept, and
// the band in between is interpolated. The attention scaling factor stays 1.
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  // Where the config came from: a preset name or a config.json path (for logs).
  std::string name;
  // "llama" or "mistral" (HF model_type). Both use the same architecture here.
  std::string model_type = "llama";

  int64_t hidden_size = 0;              // D
  int64_t intermediate_size = 0;        // F
  int64_t num_attention_heads = 0;      // H
  int64_t num_key_value_heads = 0;      // Hkv
  int64_t head_dim = 0;                 // Dh; 0 means D / H (read it through dh())
  int64_t num_hidden_layers = 0;        // L
  int64_t vocab_size = 0;               // V
  int64_t max_position_embeddings = 0;  // longest T accepted by forward
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // nullopt: plain RoPE (rope_type "default")
  // true: the output head is the embedding matrix (lm_head.weight is not a
  // separate parameter; see llama.h).
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // std of the normal init of every Linear and the embedding
  // Mistral's sliding_window. Sliding-window attention is not implemented:
  // attention is fully causal, which equals it exactly while T <= window, so
  // validate() accepts only nullopt (no window) or a window that is at least
  // max_position_embeddings (the longest T forward accepts). Llama has none.
  std::optional<int64_t> sliding_window;

  // Special token ids of the model's vocabulary, as its config.json gives them.
  // They do not change the math; they are kept so that an export describes the
  // vocabulary the weights were trained with. nullopt / empty: unknown
  // (exported as null). eos may be several ids (Llama 3.x instruct models).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;

  // Dh: head_dim if set, else hidden_size / num_attention_heads.
  int64_t dh() const { return head_dim > 0 ? head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0); }

  // Number of parameters of LlamaForCausalLM, counting a tied embedding once:
  //   V*D                                  embed_tokens
  // + L * (D*H*Dh + 2*D*Hkv*Dh + H*Dh*D     q, k, v, o
  //        + 3*D*F                          gate, up, down
  //        + 2*D)                           two RMSNorms
  // + D                                    final norm
  // + (tied ? 0 : V*D)                     lm_head
  int64_t num_parameters() const;

  // Throws UsageError naming the offending field, its value and a fix when the
  // config cannot describe a model (non-positive sizes, H % Hkv != 0, odd Dh,
  // D % H != 0 with head_dim unset, bad rope_scaling, a sliding window shorter
  // than max_position_embeddings, ...).
  void validate() const;

  // One line for logs: "llama3.1-8b: D=4096 L=32 H=32 Hkv=8 Dh=128 F=14336 V=128256 ... 8.03B params".
  std::string summary() const;

  // The config as a Hugging Face config.json text in the form transformers 5
  // writes (keys sorted; rope_theta and the llama3 scaling inside
  // "rope_parameters"; unknown token ids as null; no "dtype": the exporter adds
  // the weights' dtype). registry.h's parse_hf_config reads it back.
  std::string to_hf_config_json() const;
};

}  // namespace fsdp::models

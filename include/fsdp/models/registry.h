// Model registry: named presets and Hugging Face config.json files.
//
// Presets (shapes as in the config.json files published on the Hugging Face Hub;
// parameter counts from LlamaConfig::num_parameters()):
//   llama2-7b, llama2-13b, llama2-70b           meta-llama/Llama-2-*-hf
//   llama3.1-8b, llama3.1-70b                   meta-llama/Llama-3.1-*   (llama3 rope scaling, factor 8)
//   llama3.2-1b, llama3.2-3b                    meta-llama/Llama-3.2-*   (llama3 rope scaling, factor 32, tied)
//   mistral-7b                                  mistralai/Mistral-7B-v0.1 (sliding window 4096)
//   mathstral-7b                                mistralai/Mathstral-7B-v0.1 (Mistral-7B-v0.3 architecture:
//                                               V=32768, rope_theta 1e6, sliding_window null)
//   qwen2.5-0.5b                                Qwen/Qwen2.5-0.5B (q/k/v biases, tied, use_sliding_window false)
//   qwen3-0.6b                                  Qwen/Qwen3-0.6B (q/k norms, head_dim 128, tied)
//   mixtral-8x7b                                mistralai/Mixtral-8x7B-v0.1 (E=8 experts, K=2 per token,
//                                               rope_theta 1e6, sliding_window null, router_aux_loss_coef 0.02;
//                                               46.7B params, 12.9B active per token)
//   tiny   ~0.92M params (D=128, L=4, H=4, Hkv=2, F=384, V=512)   tests, demos
//   small  ~25.7M params (D=512, L=8, H=8, Hkv=4, F=1536, V=512)  demos
//   tiny-mixtral  tiny's shape as a Mixtral: E=4 experts of F=384, K=2 (~2.7M params)  tests
// tiny/small use V=512: room for a byte-level tokenizer's 256 bytes plus special tokens.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdp/models/llama_config.h"

namespace fsdp::models {

// Names accepted by llama_preset / resolve_model_config, in the order above.
std::vector<std::string> list_model_presets();

// The preset of that exact name, or nullopt.
std::optional<LlamaConfig> llama_preset(const std::string& name);

// `spec` is a preset name, a path to a Hugging Face config.json, or a directory
// containing one. The result is validated.
// Throws UsageError: for an unknown name (listing the presets), a directory
// without config.json, unreadable or malformed JSON (with the path), and
// everything parse_hf_config refuses.
LlamaConfig resolve_model_config(const std::string& spec);

// Parses config.json text, as written by transformers 4.x or 5.x for
// model_type "llama", "mistral", "mixtral", "qwen2" or "qwen3". `origin` (a path) is used
// in error messages and as the config's name. Nothing is guessed (Note
// [config.json keys] in registry.cpp): each key is read, listed there as
// harmless, or refused.
//
// Required: model_type, hidden_size, intermediate_size, num_attention_heads,
// num_hidden_layers, vocab_size, max_position_embeddings, rms_norm_eps.
// Optional, with transformers' defaults: num_key_value_heads (= H), head_dim
// (= D / H; qwen3: 128), tie_word_embeddings (false), initializer_range (0.02),
// bos_token_id / eos_token_id (unknown; an int or a list for eos),
// pad_token_id (none; that embedding row then gets no gradient).
// Mistral: sliding_window (absent: 4096, null: none) on every layer.
// Qwen2/Qwen3: use_sliding_window (false), sliding_window (absent: 4096; kept
// only with use_sliding_window), max_window_layers (28), layer_types (absent:
// "sliding_attention" for layers >= max_window_layers when there is a window).
// Qwen3: attention_bias (false).
// Mixtral: sliding_window (absent or null: none) on every layer;
// num_local_experts (8), num_experts_per_tok (2), router_aux_loss_coef
// (0.001), router_jitter_noise (0; anything else is refused),
// output_router_logits (false; kept for exports); rope_theta 1e6 when absent.
// Rope, in either form: transformers 4's "rope_theta" + "rope_scaling", or
// transformers 5's "rope_parameters" {"rope_type", "rope_theta", ...};
// rope_type "default" and "llama3" only (llama3 needs factor, low_freq_factor,
// high_freq_factor; original_max_position_embeddings defaults to
// max_position_embeddings, as in transformers).
// Throws UsageError naming the key and its value for: a missing or mistyped
// required field; another model_type; a key that is not known for the model
// type (with how to proceed); rope types other than default/llama3, keys a
// rope type does not have, partial_rotary_factor != 1, rope_theta or
// rope_scaling/rope_parameters that disagree between the two forms;
// attention_bias (llama, mistral) or mlp_bias true; hidden_act other than
// silu; attention_dropout != 0; quantization_config; layer_types other than
// full/sliding attention; and whatever LlamaConfig::validate refuses (a
// pad_token_id outside the vocabulary, a window <= 0, ...).
LlamaConfig parse_hf_config(const std::string& json_text, const std::string& origin);

// The config.json keys parse_hf_config accepts and ignores because they change
// neither outputs nor gradients (bookkeeping, storage dtype, generation
// defaults; Note [config.json keys]).
std::vector<std::string> harmless_hf_config_keys();

}  // namespace fsdp::models

// Model registry: named presets and Hugging Face config.json files.
//
// Presets (shapes as in the config.json files published on the Hugging Face Hub;
// parameter counts from LlamaConfig::num_parameters()):
//   llama2-7b, llama2-13b, llama2-70b           meta-llama/Llama-2-*-hf
//   llama3.1-8b, llama3.1-70b                   meta-llama/Llama-3.1-*   (llama3 rope scaling, factor 8)
//   llama3.2-1b, llama3.2-3b                    meta-llama/Llama-3.2-*   (llama3 rope scaling, factor 32, tied)
//   mistral-7b                                  mistralai/Mistral-7B-v0.1 (sliding window ignored)
//   tiny   ~0.92M params (D=128, L=4, H=4, Hkv=2, F=384, V=512)   tests, demos
//   small  ~25.7M params (D=512, L=8, H=8, Hkv=4, F=1536, V=512)  demos
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
// without config.json, unreadable or malformed JSON (with the path), a missing
// or mistyped required field (naming it), model_type other than "llama" or
// "mistral", an unsupported rope_scaling type, attention_bias/mlp_bias true, or
// hidden_act other than "silu".
LlamaConfig resolve_model_config(const std::string& spec);

// Parses config.json text. `origin` (a path) is used in error messages and as
// the config's name. Required fields: model_type, hidden_size,
// intermediate_size, num_attention_heads, num_hidden_layers, vocab_size,
// max_position_embeddings, rms_norm_eps. Optional, with Hugging Face's
// defaults: num_key_value_heads (= H), head_dim (= D / H), rope_theta (10000),
// rope_scaling (none; "llama3" and "default" accepted), tie_word_embeddings
// (false), initializer_range (0.02). Other fields are ignored (Mistral's
// sliding_window included: attention is fully causal).
LlamaConfig parse_hf_config(const std::string& json_text, const std::string& origin);

}  // namespace fsdp::models

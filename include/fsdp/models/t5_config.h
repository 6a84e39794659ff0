// T5 model configuration: the original T5 (t5-small ... t5-11b) and T5 v1.1 /
// flan-T5, as Hugging Face's T5Config and its config.json describe them.
//
// Dimension letters of fsdp/models/t5.h (llama_config.h defines B, T, V, D, H, Dh):
//   Ts   encoder (source) tokens per sample              --seq-len
//   Tt   decoder (target) tokens per sample              --target-len
//   D    model width                                     d_model
//   H    attention heads                                 num_heads
//   Dh   head dimension (H x Dh need not equal D)        d_kv
//   F    feed-forward width                              d_ff
//   L    encoder blocks                                  num_layers
//   Ld   decoder blocks                                  num_decoder_layers
//   V    vocabulary                                      vocab_size
//   Nb   relative-position buckets                       relative_attention_num_buckets
//
// Note [T5 variants]
// One model class covers both published forms, as transformers' does:
//   original T5  feed_forward_proj "relu" (wi, wo); the output head IS the
//                shared embedding (no lm_head.weight) and the decoder's output
//                is scaled by D^-0.5 before it.
//   T5 v1.1,     feed_forward_proj "gated-gelu" (wi_0, wi_1, wo; gelu_new is
//   flan-T5      the tanh approximation); a separate lm_head.weight and no
//                scaling (config.json: "tie_word_embeddings": false).
// transformers 5 decouples the two switches (scale_decoder_outputs, written
// by it; absent: scaled exactly when tie_word_embeddings is not false), and
// so does this config. Dropout (dropout_rate) is read and written back but not
// applied: fsdp-train trains T5 without dropout (docs/models.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {

struct T5Config {
  std::string name;                  // a preset name or a config.json path (for logs)
  int64_t vocab_size = 32128;        // V
  int64_t d_model = 512;             // D
  int64_t d_kv = 64;                 // Dh
  int64_t d_ff = 2048;               // F
  int64_t num_layers = 6;            // L
  int64_t num_decoder_layers = 6;    // Ld
  int64_t num_heads = 8;             // H
  int64_t relative_attention_num_buckets = 32;     // Nb
  int64_t relative_attention_max_distance = 128;   // distances at or past it share the last bucket
  double layer_norm_epsilon = 1e-6;
  double initializer_factor = 1.0;   // scales every init std (transformers' _init_weights)
  // "relu", "gelu", "gelu_new", "silu", or "gated-" one of them ("gated-gelu"
  // means gelu_new, as in transformers).
  std::string feed_forward_proj = "relu";
  bool tie_word_embeddings = true;   // no lm_head: the output projection is shared.weight
  bool scale_decoder_outputs = true; // decoder output x D^-0.5 before the head
  double dropout_rate = 0.1;         // kept for exports; not applied (Note [T5 variants])
  int64_t pad_token_id = 0;          // the decoder's padding, and (by default) its start token
  std::vector<int64_t> eos_token_id = {1};
  int64_t decoder_start_token_id = 0;

  bool gated() const;                // wi_0 and wi_1 instead of wi
  // The activation's name in transformers' ACT2FN: "relu", "gelu", "gelu_new", "silu".
  std::string activation() const;

  // Every parameter of T5ForConditionalGeneration, the shared embedding once:
  //   V*D (shared) + (tied ? 0 : V*D) (lm_head) + 2*D (final norms)
  // + L  * (4*D*H*Dh + FF + 2*D)          encoder blocks
  // + Ld * (8*D*H*Dh + FF + 3*D)          decoder blocks (self- and cross-attention)
  // + 2 * Nb*H                            the first block of each stack's relative bias
  // with FF = (gated ? 3 : 2) * D*F.
  int64_t num_parameters() const;
  // Training FLOPs per target token, counted as LlamaConfig's (6 x the matrix
  // weights a token passes + attention's products), with Ts = Tt = seq_len:
  // encoder and decoder both run per sample, so this is per sample token.
  double training_flops_per_token(int64_t seq_len) const;
  // Forward FLOPs per token of the part of the model owning `params` (names
  // and shapes), a third of training_flops_per_token over all of them.
  double forward_flops_per_token(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                 int64_t seq_len) const;

  // Size limits, as LlamaConfig's (far above every published model).
  static constexpr int64_t kMaxWidth = int64_t{1} << 20;       // D, Dh
  static constexpr int64_t kMaxFeedForward = int64_t{1} << 22; // F (t5-11b: 65,536)
  static constexpr int64_t kMaxHeads = int64_t{1} << 16;       // H, Nb
  static constexpr int64_t kMaxLayers = int64_t{1} << 16;      // L, Ld
  static constexpr int64_t kMaxVocabSize = (int64_t{1} << 31) - 1;
  static constexpr int64_t kMaxParameters = int64_t{1} << 50;

  // UsageError naming the field, its value and a fix: non-positive or
  // oversized shapes, an unknown feed_forward_proj, token ids outside [0, V),
  // max_distance < Nb / 2 (transformers' bucketing divides by log of it).
  void validate() const;

  // One line for logs: "t5-3b: t5 D=1024 L=24 Ld=24 H=32 Dh=128 F=16384 V=32128 relu tied 2.85B params".
  std::string summary() const;

  // config.json as transformers 5 writes it for T5ForConditionalGeneration
  // (sorted keys; "dtype" is the exporter's), with tie_word_embeddings and
  // scale_decoder_outputs both written, so that transformers 4 (which derives
  // the scaling from tie_word_embeddings) and 5 read the same model.
  std::string to_hf_config_json() const;
};

// Presets (shapes as in the Hugging Face config.json of each checkpoint):
//   t5-small, t5-base, t5-large, t5-3b, t5-11b   google-t5/t5-* (original: relu, tied, scaled)
//   flan-t5-small, flan-t5-base, flan-t5-xl       google/flan-t5-* (gated-gelu, untied, not scaled)
//   t5-tiny       D=64 L=2 Ld=2 H=4 Dh=16 F=128 V=512, original form   tests
//   t5-tiny-v1.1  the same shape in the v1.1 form                      tests
// tiny's V=512 holds the byte tokenizer's ids (pad 0 is byte 0, which text never holds).
std::vector<std::string> t5_preset_names();
std::optional<T5Config> t5_preset(const std::string& name);

// Parses a T5 config.json (model_type "t5"). `origin` names it in errors and
// becomes the config's name. Required: model_type, d_model, d_kv, d_ff,
// num_layers, num_heads, vocab_size. Optional, with transformers' defaults:
// num_decoder_layers (= num_layers), relative_attention_num_buckets (32),
// relative_attention_max_distance (128), layer_norm_epsilon (1e-6),
// initializer_factor (1), feed_forward_proj ("relu"), tie_word_embeddings
// (true), scale_decoder_outputs (= tie_word_embeddings), dropout_rate (0.1),
// pad_token_id (0), eos_token_id (1), decoder_start_token_id (= pad).
// Keys that change neither outputs nor gradients are accepted and ignored
// (Note [config.json keys] in registry.cpp: the same list, and T5's
// n_positions, output_past, dense_act_fn / is_gated_act when they agree with
// feed_forward_proj); any other key is refused, naming it.
T5Config parse_t5_config(const std::string& json_text, const std::string& origin);

// "" when `a` and `b` describe the same model (every field that changes
// shapes, results or gradients; names, dropout and token ids may differ),
// else "<field> <a> vs <b>" for the first difference.
std::string t5_config_mismatch(const T5Config& a, const T5Config& b);

}  // namespace fsdp::models

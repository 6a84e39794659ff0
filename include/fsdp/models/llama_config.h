// Llama-family model configuration: Llama 2, Llama 3.1, Llama 3.2, Mistral,
// Mixtral, Qwen2 / Qwen2.5 and Qwen3 (Note [Model types]).
//
// Field names and meanings are those of Hugging Face's LlamaConfig /
// MistralConfig / MixtralConfig / Qwen2Config / Qwen3Config and their
// config.json, so a config
// round-trips with the files published next to the checkpoints.
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
//   W    sliding attention window (keys a query sees)      sliding_window
//   E    experts per MoE layer (mixtral)                  num_local_experts
//   K    experts each token is routed to, 1 <= K <= E     num_experts_per_tok
//   N    tokens of a micro-batch, B*T (router rows)
//
// Note [Model types]
// One decoder architecture (llama.h) with the differences transformers 5 has
// between these model types, nothing else:
//   llama    q, k, v, o and the MLP without biases; full causal attention.
//   mistral  llama's layers; sliding_window W (when set) applies to every layer.
//   qwen2    q, k and v projections WITH biases, o_proj without; per-layer
//            attention from layer_types ("sliding_attention" layers use W).
//   qwen3    no projection biases unless attention_bias (then q, k, v AND o);
//            RMSNorm over Dh on every query and key head (q_norm, k_norm,
//            weight (Dh) each) before RoPE; per-layer attention as qwen2.
//   mixtral  mistral's attention (sliding_window, when set, on every layer;
//            null when absent); the MLP of every layer is a sparse mixture
//            of E SwiGLU experts of width F, K per token, chosen by a router
//            (moe.h), and the training loss adds router_aux_loss_coef x the
//            load-balancing loss (llama.h, LlamaForCausalLMImpl::loss).
// A window W means query i sees keys j with i - W < j <= i: itself and the
// W - 1 before it (transformers' sliding_window_overlay + causal mask).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/models/op_work.h"

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
  // "llama", "mistral", "mixtral", "qwen2" or "qwen3" (HF model_type; Note [Model types]).
  std::string model_type = "llama";

  int64_t hidden_size = 0;              // D
  int64_t intermediate_size = 0;        // F (mixtral: of each expert)
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
  // W: the attention window of sliding layers (see layer_window()); nullopt:
  // none. Mistral, Mixtral: every layer. Qwen2/Qwen3: the layers layer_types marks
  // "sliding_attention"; set only when config.json's use_sliding_window is
  // true (transformers drops the window otherwise). Llama has none.
  std::optional<int64_t> sliding_window;
  // Qwen2/Qwen3 only (empty for llama and mistral): L entries,
  // "full_attention" or "sliding_attention", as transformers 5's layer_types.
  std::vector<std::string> layer_types;
  // Qwen2/Qwen3 only: config.json's max_window_layers (layers i >= it slide
  // when layer_types is not given). Kept for exports; layer_types decides.
  int64_t max_window_layers = 28;
  // Qwen3 only: q, k, v and o projections have biases (HF attention_bias).
  bool attention_bias = false;
  // The embedding row that gets no gradient (transformers builds
  // nn.Embedding(padding_idx=pad_token_id)); nullopt: every row trains.
  std::optional<int64_t> pad_token_id;

  // Mixtral only (0 / the defaults below otherwise), as MixtralConfig.
  int64_t num_local_experts = 0;    // E
  int64_t num_experts_per_tok = 0;  // K
  // Weight of the load-balancing loss in the training loss (transformers'
  // default 0.001; Mixtral-8x7B publishes 0.02). 0 trains without it.
  double router_aux_loss_coef = 0.001;
  // Training-time multiplicative noise on the router's input in transformers;
  // only 0 is implemented (validate() refuses anything else).
  double router_jitter_noise = 0.0;
  // transformers adds the load-balancing loss to its loss only when this is
  // true; the loss here always adds it for mixtral (router_aux_loss_coef = 0
  // turns it off), because training experts without it lets the router
  // collapse. Kept so that an export says what the source config said.
  bool output_router_logits = false;

  // Special token ids of the model's vocabulary, as its config.json gives them.
  // They do not change the math; they are kept so that an export describes the
  // vocabulary the weights were trained with. nullopt / empty: unknown
  // (exported as null). eos may be several ids (Llama 3.x instruct models).
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;

  // Dh: head_dim if set, else hidden_size / num_attention_heads.
  int64_t dh() const { return head_dim > 0 ? head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0); }

  // Note [Model types], as predicates.
  bool qkv_bias() const { return model_type == "qwen2" || (model_type == "qwen3" && attention_bias); }
  bool o_bias() const { return model_type == "qwen3" && attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  bool per_layer_attention() const { return model_type == "qwen2" || model_type == "qwen3"; }
  bool moe() const { return model_type == "mixtral"; }
  // The window decoder layer `layer` attends with; nullopt: full causal.
  std::optional<int64_t> layer_window(int64_t layer) const;

  // Number of parameters of LlamaForCausalLM, counting a tied embedding once:
  //   V*D                                  embed_tokens
  // + L * (D*H*Dh + 2*D*Hkv*Dh + H*Dh*D     q, k, v, o
  //        + (qkv_bias ? (H + 2*Hkv)*Dh : 0) + (o_bias ? D : 0)
  //        + (qk_norm ? 2*Dh : 0)           q_norm, k_norm
  //        + 3*D*F                          gate, up, down (mixtral: E*3*D*F, every expert,
  //                                         + E*D for the router)
  //        + 2*D)                           two RMSNorms
  // + D                                    final norm
  // + (tied ? 0 : V*D)                     lm_head
  int64_t num_parameters() const;

  // Parameters that take part in computing one token: num_parameters() with
  // K of the E experts of each layer instead of all E (the router counts
  // whole: it scores every expert for every token). Dense models: equal to
  // num_parameters(). Mixtral-8x7B: 12.9B of 46.7B.
  int64_t active_parameters() const;

  // Training FLOPs per token at sequence length `seq_len`, as MFU is usually
  // counted (PaLM, appendix B): 6 x the weights in matrix products (every
  // projection and the LM head; not the embedding lookup, norms or biases) +
  // 12 x L x H x Dh x T for attention's two matrix products, forward and
  // backward, without discounting the causal mask. bench/gpu/report.py counts
  // the same. Mixtral counts the weights a token passes through: K experts
  // and the (E, D) router per layer.
  double training_flops_per_token(int64_t seq_len) const;

  // Forward FLOPs per token of the part of the model that owns `params` (names
  // as named_parameters() gives them, shapes), counted as
  // training_flops_per_token counts them, so that over all parameters it is a
  // third of it: 2 x each matrix (2-D) weight — the embedding table only when
  // tied (it is then the LM head), a Mixtral expert's weights times K / E (the
  // share of tokens that visit it) — plus 4 x H x Dh x T for a layer's
  // attention where its q_proj weight is among them. Norms and biases: 0.
  double forward_flops_per_token(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                 int64_t seq_len) const;

  // The work of the part of the model that owns `params` (names and shapes as
  // forward_flops_per_token takes them; `trainable`: they get gradients) for one
  // micro-batch, by operation class (models/op_work.h): what the step-time
  // model's roofline times on a GPU. Counted from the operations this model
  // and its loss run (Note [Counted work] in llama_config.cpp). nullopt for
  // Mixtral, whose routed experts it does not count.
  std::optional<UnitWork> unit_work(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                    bool trainable, const WorkShape& shape) const;

  // Size limits (Note [Config size limits] in llama_config.cpp): far above every
  // published model, low enough that no product of sizes overflows int64.
  static constexpr int64_t kMaxHiddenSize = int64_t{1} << 20;        // D (largest published: 25,600)
  static constexpr int64_t kMaxIntermediateSize = int64_t{1} << 22;  // F
  static constexpr int64_t kMaxHeads = int64_t{1} << 16;             // H, Hkv, Dh
  static constexpr int64_t kMaxLayers = int64_t{1} << 16;            // L
  static constexpr int64_t kMaxExperts = int64_t{1} << 12;           // E, K (largest published: 384)
  static constexpr int64_t kMaxVocabSize = (int64_t{1} << 31) - 1;   // V: token ids are int32
  static constexpr int64_t kMaxPositions = (int64_t{1} << 31) - 1;   // max_position_embeddings
  static constexpr int64_t kMaxParameters = int64_t{1} << 50;        // ~1.1e15

  // Throws UsageError naming the field, its value and the limit when a size is
  // above the limits above. Cheap; validate() runs it first, and readers run it
  // before anything is sized by the config (a layer list, a table).
  void check_size_limits() const;

  // Throws UsageError naming the offending field, its value and a fix when the
  // config cannot describe a model (sizes above the limits, non-positive sizes, H % Hkv != 0, odd Dh,
  // D % H != 0 with head_dim unset, bad rope_scaling, a window <= 0, a window
  // or layer_types on a model type without them, layer_types of the wrong
  // length or naming a sliding layer without a window, pad_token_id outside
  // [0, V), mixtral with E < 1, K outside [1, E], a negative
  // router_aux_loss_coef or router_jitter_noise != 0, experts set on a dense
  // model type, ...).
  void validate() const;

  // One line for logs: "llama3.1-8b: D=4096 L=32 H=32 Hkv=8 Dh=128 F=14336 V=128256 ... 8.03B params".
  std::string summary() const;

  // The config as a Hugging Face config.json text in the form transformers 5
  // writes for its model_type (keys sorted; rope_theta and the llama3 scaling
  // inside "rope_parameters"; unknown token ids as null; Qwen's layer_types,
  // use_sliding_window, sliding_window, max_window_layers; Mixtral's expert
  // and router keys; no "dtype": the
  // exporter adds the weights' dtype). registry.h's parse_hf_config reads it back.
  std::string to_hf_config_json() const;
};

// "" when `a` and `b` describe the same architecture (every field that changes
// shapes, results or gradients: model_type, biases, pad_token_id, sizes, rope,
// tying, each layer's attention window — a window at least as long as the
// config's max_position_embeddings counts as none; max_position_embeddings,
// initializer_range and bos/eos token ids may differ),
// else "<field> <a> vs <b>" for the first difference.
std::string llama_config_mismatch(const LlamaConfig& a, const LlamaConfig& b);

}  // namespace fsdp::models

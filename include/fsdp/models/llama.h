// Llama-family decoder (Llama 2, Llama 3.1, Llama 3.2, Mistral, Mixtral,
// Qwen2/Qwen2.5, Qwen3) with Hugging Face LlamaForCausalLM /
// MistralForCausalLM / MixtralForCausalLM / Qwen2ForCausalLM /
// Qwen3ForCausalLM semantics, names and weight layouts (the differences:
// Note [Model types] in llama_config.h).
//
// Parameter names (exactly HF's, so checkpoints can be loaded/saved by name):
//   model.embed_tokens.weight                          (V, D)
//   model.layers.{i}.self_attn.q_proj.weight           (H*Dh, D)
//   model.layers.{i}.self_attn.q_proj.bias             (H*Dh)     qwen2; qwen3 with attention_bias
//   model.layers.{i}.self_attn.k_proj.weight           (Hkv*Dh, D)
//   model.layers.{i}.self_attn.k_proj.bias             (Hkv*Dh)   as q_proj.bias
//   model.layers.{i}.self_attn.v_proj.weight           (Hkv*Dh, D)
//   model.layers.{i}.self_attn.v_proj.bias             (Hkv*Dh)   as q_proj.bias
//   model.layers.{i}.self_attn.o_proj.weight           (D, H*Dh)
//   model.layers.{i}.self_attn.o_proj.bias             (D)        qwen3 with attention_bias
//   model.layers.{i}.self_attn.q_norm.weight           (Dh)       qwen3
//   model.layers.{i}.self_attn.k_norm.weight           (Dh)       qwen3
//   model.layers.{i}.mlp.gate_proj.weight              (F, D)
//   model.layers.{i}.mlp.up_proj.weight                (F, D)
//   model.layers.{i}.mlp.down_proj.weight              (D, F)
//   model.layers.{i}.block_sparse_moe.gate.weight      (E, D)     mixtral, instead of mlp.* (moe.h)
//   model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight (F, D)   mixtral, e in [0, E)
//   model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight (D, F)   mixtral
//   model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight (F, D)   mixtral
//   model.layers.{i}.input_layernorm.weight            (D)
//   model.layers.{i}.post_attention_layernorm.weight   (D)
//   model.norm.weight                                  (D)
//   lm_head.weight                                     (V, D)   untied only
// named_parameters() lists them in this order (HF's order). No other biases.
//
// Tied embeddings (tie_word_embeddings, Llama 3.2): there is no lm_head module
// and `lm_head.weight` is ABSENT from named_parameters(); the output projection
// uses model.embed_tokens.weight, which is therefore counted once and receives
// the sum of both gradients. This is what PyTorch's named_parameters() reports
// for HF's tied model, and what HF writes to safetensors (it drops the shared
// lm_head.weight). A checkpoint loader meeting `lm_head.weight` for a tied model
// should check it equals the embedding or ignore it.
//
// Semantics (checked against transformers itself: tests/hf/test_transformers.py):
//   h = embed(tokens)                       pad_token_id's row gets no gradient
//   per layer: h = h + o(attn(rope(qn(q(n1(h)))), rope(kn(k(n1(h)))), v(n1(h))))
//              h = h + down(silu(gate(n2(h))) * up(n2(h)))      (mixtral: h + moe(n2(h)), moe.h)
//   logits = lm_head(norm(h))
// qn, kn: qwen3's per-head RMSNorms over Dh (identity otherwise). attn is
// causal; in a layer with a window W (LlamaConfig::layer_window) query i sees
// only keys i - W < j <= i (Note [Sliding-window mask]).
// RoPE in HF's rotate_half convention (the two halves of Dh are the pair, NOT
// interleaved even/odd elements); cos/sin computed in fp32 and cast to the
// activation dtype; GQA by repeat_kv (query head h reads kv head h / (H/Hkv));
// causal softmax(q k^T / sqrt(Dh)) in fp32; RMSNorm in fp32. The rotary tables
// are neither parameters nor buffers: inv_freq (Dh/2 floats) is computed by
// kernels on the device the forward runs on, the first time it runs there, and
// kept (never copied from the host: on CUDA such a copy is a host wait in every
// forward), and cos/sin are computed once per forward on that device.
//
// Devices: built on options.device(). On kMeta nothing is allocated or
// initialized (construction of a 70B model takes milliseconds); on any other
// device the constructor initializes every parameter with llama_init_rule(cfg)
// and `seed` through nn::init_module.
//
// Units: every decoder layer is an nn::Unit<LlamaDecoderLayerImpl>, the token
// embedding an nn::Unit<LlamaEmbeddingImpl> and the output head an
// nn::Unit<LlamaHeadImpl> (names unchanged by the marks); wrap policies "by
// block type" use llama_block_type(), and llama_unit_types() adds the
// embedding and the head (fsdp-train's --wrap block). The output projection
// and the loss run inside the head's unit — tied, inside the embedding's unit,
// which the forward then calls twice (LlamaForCausalLMImpl::unit_call_order).
// The final norm stays with the root: its HF name (model.norm) is not under
// lm_head, and it is hidden_size elements.
//
// Note [Sliding-window mask]
// Where T >= W (the same test as transformers' _ignore_causal_mask_sdpa), a
// layer with window W attends through a banded causal mask: (T, T) bool, true
// where i - W < j <= i, built once per forward by LlamaModelImpl and shared by
// every sliding layer (T*T bytes: 16 MiB at T = 4096, 1 GiB at T = 32768).
// SDPA then gets the mask with repeat_kv'd keys and values instead of
// is_causal + enable_gqa: what transformers does with a mask, so gradients
// round alike, and on CUDA a mask with enable_gqa would fall back to the math
// kernel. Where T < W the window cuts nothing and the layer runs the
// plain causal path.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <typeindex>
#include <utility>
#include <vector>

#include "fsdp/models/chunked_loss.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/moe.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"

namespace fsdp::models {

// How attention is computed. Results agree to rounding.
enum class AttentionKernel {
  kSdpa,   // at::scaled_dot_product_attention(is_causal, enable_gqa): fused (flash) kernels on
           // CPU and GPU, no (T, T) score matrix kept for backward; the default
  kEager,  // matmul, causal mask, softmax in fp32, matmul (HF "eager"); the reference
};

// Masks a forward shares among its layers (Note [Sliding-window mask]). Not
// a tensor argument of the decoder layer on purpose: units replay non-tensor
// arguments unchanged (activation checkpointing recomputes with the same mask)
// and only tensors that are the layer's data become unit inputs.
struct AttentionMasks {
  at::Tensor sliding;  // (T, T) bool, true where i - W < j <= i; undefined when no layer needs it
};

// Attention. LayerKernels::kFused: q, k and v are one product over the three
// weights where they lie back to back (models::fused_linears; else the three
// products), and rotary on q and k is one elementwise kernel each way
// (models::fused_rotary), from the projection's output view to the layout the
// reference's rotary gives SDPA.
class LlamaAttentionImpl : public torch::nn::Module, public HasLayerKernels {
 public:
  // `layer`: the decoder layer's index (its window: cfg.layer_window(layer)).
  LlamaAttentionImpl(const LlamaConfig& cfg, const at::TensorOptions& options, int64_t layer);

  // x (B, T, D); cos, sin (T, Dh) in x's dtype -> (B, T, D).
  // Requires: masks.sliding defined and (T, T) when window() <= T.
  // Activation checkpointing's marks (nn/recompute.h): the q, k, v and o
  // products are kKept (fused: the one q|k|v product, unless biased), and so
  // is the SDPA kernel's output unless masked.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const AttentionMasks& masks);

  void set_kernels(LayerKernels kernels) override { kernels_ = kernels; }
  LayerKernels kernels() const { return kernels_; }
  void set_kernel(AttentionKernel kernel);
  AttentionKernel kernel() const { return kernel_; }
  const std::optional<int64_t>& window() const { return window_; }

 private:
  int64_t n_heads_;     // H
  int64_t n_kv_heads_;  // Hkv
  int64_t head_dim_;    // Dh
  std::optional<int64_t> window_;  // W of this layer; nullopt: full causal
  AttentionKernel kernel_ = AttentionKernel::kSdpa;
  LayerKernels kernels_ = LayerKernels::kReference;  // rotary's
  Linear q_proj_{nullptr};  // weight (H*Dh, D), bias (H*Dh) when cfg.qkv_bias()
  Linear k_proj_{nullptr};  // weight (Hkv*Dh, D), bias (Hkv*Dh) when cfg.qkv_bias()
  Linear v_proj_{nullptr};  // weight (Hkv*Dh, D), bias (Hkv*Dh) when cfg.qkv_bias()
  Linear o_proj_{nullptr};  // weight (D, H*Dh), bias (D) when cfg.o_bias()
  RMSNorm q_norm_{nullptr};  // weight (Dh); qwen3 only (cfg.qk_norm()), else null
  RMSNorm k_norm_{nullptr};  // weight (Dh); qwen3 only
};
TORCH_MODULE(LlamaAttention);

// SwiGLU: down(silu(gate(x)) * up(x)). LayerKernels::kFused: gate and up are
// one product where their weights lie back to back (models::fused_linears),
// and silu(gate) * up is one elementwise kernel (models::fused_swiglu),
// rounded once.
class LlamaMLPImpl : public torch::nn::Module, public HasLayerKernels {
 public:
  LlamaMLPImpl(const LlamaConfig& cfg, const at::TensorOptions& options);

  void set_kernels(LayerKernels kernels) override { kernels_ = kernels; }

  // x (B, T, D) -> (B, T, D)
  at::Tensor forward(const at::Tensor& x);
  // The same, with down_proj's product marked `down` (nn::ProductRole): the
  // decoder layer adds the result to its residual, which makes it the layer's
  // tail (Note [Recompute policy] in src/nn/recompute.cpp).
  at::Tensor forward_marked(const at::Tensor& x, nn::ProductRole down);

 private:
  Linear gate_proj_{nullptr};  // weight (F, D)
  Linear up_proj_{nullptr};    // weight (F, D)
  Linear down_proj_{nullptr};  // weight (D, F)
  LayerKernels kernels_ = LayerKernels::kReference;
  at::Tensor swiglu(const at::Tensor& x);  // (B, T, D) -> (B, T, F): silu(gate(x)) * up(x)
};
TORCH_MODULE(LlamaMLP);

// Tag for the forward overloads that also return Mixtral's router logits. A
// tag rather than a flag: a unit replays it unchanged, and the overload's
// result type (several tensors) is fixed at compile time.
struct WithRouterLogits {};

// Tags of the output head's forwards (LlamaHeadImpl, and LlamaEmbeddingImpl
// when tied): the loss over targets, or the logits.
struct HeadLoss {
  LossReduction reduction = LossReduction::kMean;
  int64_t chunk_rows = 1;  // rows of logits per chunk (chunked_loss.h)
  LayerKernels kernels = LayerKernels::kReference;  // the loss's (chunked_cross_entropy)
};
struct HeadLogits {};

// The token embedding, a unit boundary of its own. Tied (no lm_head), the
// output head runs here too, so that the one matrix belongs to one unit.
class LlamaEmbeddingImpl : public EmbeddingImpl {
 public:
  using EmbeddingImpl::EmbeddingImpl;
  using EmbeddingImpl::forward;  // tokens (B, T) -> (B, T, D)
  // hidden (N, D), targets (N) -> chunked cross-entropy with this weight as the head (fp32 ()).
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& targets, HeadLoss how);
  // hidden (..., D) -> logits (..., V).
  at::Tensor forward(const at::Tensor& hidden, HeadLogits);
};
using LlamaEmbedding = nn::Unit<LlamaEmbeddingImpl>;

// The output projection lm_head (a Linear, so LoRA can adapt it) and the loss,
// a unit boundary of its own.
class LlamaHeadImpl : public LinearImpl {
 public:
  LlamaHeadImpl(int64_t hidden_size, int64_t vocab_size, const at::TensorOptions& options)
      : LinearImpl(hidden_size, vocab_size, /*bias=*/false, options) {}
  using LinearImpl::forward;  // hidden (..., D) -> logits (..., V), adapter included
  // hidden (N, D), targets (N) -> chunked cross-entropy (fp32 ()), adapter included.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& targets, HeadLoss how);
};
using LlamaHead = nn::Unit<LlamaHeadImpl>;

// One pre-norm transformer block; the unit of sharding.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  // `layer`: this layer's index among the L (for per-layer attention windows).
  LlamaDecoderLayerImpl(const LlamaConfig& cfg, const at::TensorOptions& options, int64_t layer);

  // x (B, T, D); cos, sin (T, Dh) in x's dtype -> (B, T, D).
  // Pure function of its tensor inputs, masks and parameters (activation
  // checkpointing may call it again in backward). Mixtral: the router logits
  // are computed and dropped (the overload below returns them).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const AttentionMasks& masks);

  // The same, also returning the layer's router logits: {h (B, T, D),
  // router_logits (N, E) in x's dtype}. Requires: a mixtral layer (moe()).
  std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const AttentionMasks& masks, WithRouterLogits);

  LlamaAttentionImpl& self_attn() { return *self_attn_; }
  bool moe() const { return !block_sparse_moe_.is_empty(); }

 private:
  LlamaAttention self_attn_{nullptr};
  LlamaMLP mlp_{nullptr};                           // dense models; null for mixtral
  MixtralSparseMoeBlock block_sparse_moe_{nullptr};  // mixtral only
  RMSNorm input_layernorm_{nullptr};           // weight (D)
  RMSNorm post_attention_layernorm_{nullptr};  // weight (D)
};

using LlamaBlock = nn::Unit<LlamaDecoderLayerImpl>;

// HF's LlamaModel: embedding, L blocks, final norm (registered as "model").
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& cfg, const at::TensorOptions& options);

  // tokens (B, T) int64 -> hidden states (B, T, D) after the final norm.
  // Requires: tokens already checked (LlamaForCausalLM checks them).
  at::Tensor forward(const at::Tensor& tokens);
  // The same; Mixtral's layers also append their router logits, (N, E) each,
  // in layer order to `router_logits`. Requires: a mixtral config. (Not a
  // forward overload: ModuleHolder's call needs forward unambiguous.)
  at::Tensor forward_with_router_logits(const at::Tensor& tokens, std::vector<at::Tensor>& router_logits);

  LlamaEmbeddingImpl& embed_tokens() { return embed_tokens_->impl(); }
  const LlamaEmbeddingImpl& embed_tokens() const { return *embed_tokens_->impl_ptr(); }
  // The embedding's unit: calls through it are gathered when it is sharded.
  LlamaEmbedding& embed_unit() { return embed_tokens_; }
  const std::vector<LlamaBlock>& layers() const { return blocks_; }
  // The rotary inverse frequencies (Dh/2) fp32 on `device`: computed there by
  // llama_rope_inv_freq on first use and kept until asked for another device
  // (no host copy). Not a parameter or buffer. forward() uses the hidden
  // states' device.
  const at::Tensor& inv_freq(at::Device device);

 private:
  LlamaEmbedding embed_tokens_{nullptr};  // weight (V, D)
  torch::nn::ModuleList layers_{nullptr};  // "layers.{i}", holds blocks_
  std::vector<LlamaBlock> blocks_;      // L, typed handles to the same modules
  RMSNorm norm_{nullptr};               // weight (D)
  LlamaConfig rope_cfg_;                // what inv_freq_ is computed from
  at::Tensor inv_freq_;                 // (Dh/2) fp32 on the last forward's device; undefined before
  std::optional<int64_t> window_;       // W of the sliding layers; nullopt when no layer slides
  bool moe_ = false;                    // mixtral: layers return router logits
};
TORCH_MODULE(LlamaModel);

// What a Mixtral forward gives besides the logits (LlamaForCausalLMImpl::forward
// with WithRouterLogits). Through a unit the result travels as tensors:
// pack() / unpack() convert, in the order logits, aux_loss, router_logits[0..L).
struct RouterOutputs {
  at::Tensor logits;                       // (B, T, V) in the parameters' dtype
  at::Tensor aux_loss;                     // () fp32: load_balancing_loss over every layer (moe.h)
  std::vector<at::Tensor> router_logits;   // L x (N, E), N = B*T, in the parameters' dtype

  std::vector<at::Tensor> pack() const;
  static RouterOutputs unpack(std::vector<at::Tensor> tensors);
};

// The trainer's model.
class LlamaForCausalLMImpl : public torch::nn::Module, public nn::CallOrder, public HasLayerKernels {
 public:
  // Builds on options.device()/dtype(); see the file comment for meta vs real
  // devices. Throws UsageError if cfg.validate() does.
  LlamaForCausalLMImpl(const LlamaConfig& cfg, const at::TensorOptions& options, uint64_t seed);

  // tokens (B, T) int64 on the parameters' device -> logits (B, T, V) in the
  // parameters' dtype.
  // Throws UsageError: tokens not 2-D int64, T > max_position_embeddings, or an
  // id outside [0, V) (checked with one aminmax over the batch; on a CUDA
  // device asserted there without a host sync: a bad id stops the process
  // with the device's message instead of a UsageError).
  at::Tensor forward(const at::Tensor& tokens);

  // Mixtral: the logits with the router logits of every layer and the
  // load-balancing loss, packed (RouterOutputs::unpack reads them back), so
  // that a root unit around this model can run it. Throws UsageError as
  // forward, and for a model without experts.
  std::vector<at::Tensor> forward(const at::Tensor& tokens, WithRouterLogits);
  // The same without a unit in between.
  RouterOutputs forward_with_router_logits(const at::Tensor& tokens) {
    return RouterOutputs::unpack(forward(tokens, WithRouterLogits{}));
  }

  // Mean cross-entropy of next-token prediction, fp32 scalar. `targets` (B, T)
  // int64 is already shifted (targets[b][t] is the token after tokens[b][t]);
  // positions with target == kIgnoreIndex are left out of the mean (all ignored
  // gives NaN, as in torch). Log-softmax runs in fp32 whatever the param dtype.
  // The output projection and the cross-entropy run in chunks of
  // loss_chunk_rows() rows (chunked_loss.h): the (B, T, V) logits never exist
  // at once; the result equals that of cross_entropy(forward(tokens)) to
  // rounding. A LoRA adapter on lm_head takes part (peft's output).
  // Mixtral adds router_aux_loss_coef x the load-balancing loss of this
  // micro-batch's router logits (all of its tokens, ignored targets included:
  // transformers' training path passes no attention mask), which is
  // transformers' `loss` with output_router_logits set (llama_config.h says
  // why it is always on here).
  // Throws UsageError as forward, and for targets of another shape or outside
  // [0, V) other than kIgnoreIndex (tokens and targets share one check; on a
  // CUDA device an assertion there, as forward's).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  // The same loss through the module's call: a root fsdp::nn::Unit around this
  // model then covers the whole step (logits and loss) in one forward.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets) { return loss(tokens, targets); }

  // The same cross-entropy with another reduction: kSum is the sum over the
  // non-ignored targets (0 when all are ignored), for exact means over many
  // batches (evaluation: sum of sums / number of targets). kMean is loss().
  // kSum never includes Mixtral's load-balancing loss: it is a per-batch
  // regulariser, not a sum over targets, and evaluation reports the language
  // model's cross-entropy (perplexity).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets, LossReduction reduction);
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& targets, LossReduction reduction) {
    return loss(tokens, targets, reduction);
  }

  const LlamaConfig& config() const { return cfg_; }
  LlamaModelImpl& model() { return *model_; }
  const std::vector<LlamaBlock>& layers() const { return model_->layers(); }
  // The (V, D) output matrix: lm_head.weight, or embed_tokens.weight when tied.
  const at::Tensor& output_weight() const;

  // The embedding, every layer, the root's final norm (""), then the head
  // (tied: the embedding again), for plan_sharding (nn::CallOrder).
  std::vector<std::string> unit_call_order() const override;

  // Applies to every layer's attention (default kAuto).
  void set_attention_kernel(AttentionKernel kernel);

  // Rows of (B x T) per chunk of the loss's logits. 0 (the default):
  // default_loss_chunk_rows(vocab_size, the hidden states' device type); a
  // value >= B x T computes the whole micro-batch at once. Requires: rows >= 0.
  void set_loss_chunk_rows(int64_t rows);
  int64_t loss_chunk_rows(at::DeviceType device = at::kCPU) const;

  // The loss's kernels (chunked_cross_entropy): set_layer_kernels reaches the
  // loss here, the layers in their own modules.
  void set_kernels(LayerKernels kernels) override { loss_kernels_ = kernels; }

 private:
  at::Tensor logits_unchecked(const at::Tensor& tokens);  // (B, T) -> (B, T, V)
  // hidden (B, T, D) after the final norm -> cross-entropy (chunked_loss.h).
  at::Tensor head_loss(const at::Tensor& hidden, const at::Tensor& targets, LossReduction reduction);
  // (..., D) -> (..., V): lm_head (with its adapter), or the tied embedding.
  at::Tensor project(const at::Tensor& hidden);

  LlamaConfig cfg_;
  LlamaModel model_{nullptr};
  LlamaHead lm_head_{nullptr};  // weight (V, D); null when tie_word_embeddings
  int64_t loss_chunk_rows_ = 0;  // 0: default_loss_chunk_rows(V)
  LayerKernels loss_kernels_ = LayerKernels::kReference;
};
TORCH_MODULE(LlamaForCausalLM);

// The factory the trainer calls; same as LlamaForCausalLM(cfg, options, seed).
LlamaForCausalLM build_llama(const LlamaConfig& cfg, const at::TensorOptions& options, uint64_t seed);

// HF's init (Llama, Mistral, Mixtral, Qwen2, Qwen3 alike): normal(0,
// initializer_range) for every Linear weight (Mixtral's router and experts
// included) and the embedding; zeros for every Linear bias; ones
// for every RMSNorm weight (q_norm, k_norm included). Keyed by name suffix, so
// it also works for names under an extra prefix. An unknown name is an internal
// error. Unlike transformers' _init_weights, the pad_token_id row of the
// embedding is not zeroed (rules here are per parameter, not per row); it
// receives no gradient either way.
nn::InitRuleFn llama_init_rule(const LlamaConfig& cfg);

// typeid(LlamaDecoderLayerImpl): the transformer block type for wrap policies,
// compared with nn::UnitBase::inner_type().
std::type_index llama_block_type();

// Bytes a checkpointed decoder layer `layer` keeps from forward for its
// recompute, per token, beyond its input, under `policy` (nn/recompute.h):
// kSelective keeps the q, k, v and o products (H*Dh + 2*Hkv*Dh + D values of
// `dtype`) and, where the attention kernel's own backward can be rebuilt (the
// CPU's flash kernel: `device` the CPU, the SDPA kernel, the layer unmasked at
// `seq_len`), its output (H*Dh values) and log-sum-exp (H fp32 values);
// kFull and kTail keep nothing. Exact: ShardedModel::checkpoint_kept_bytes is
// tokens x this, summed over the layers.
int64_t llama_kept_bytes_per_token(const LlamaConfig& cfg, int64_t layer, nn::RecomputePolicy policy,
                                   at::ScalarType dtype, at::DeviceType device, int64_t seq_len,
                                   AttentionKernel kernel = AttentionKernel::kSdpa);
// The block, the embedding and the head: fsdp-train's --wrap block, which
// shards the embedding and the head as units of their own.
std::vector<std::type_index> llama_unit_types();

// Rotary inverse frequencies (Dh/2) fp32 on `device`: 1 / theta^(2j/Dh), then
// the llama3 rescaling when cfg.rope_scaling is set — the same fp32
// operations, in the same order, as transformers' _compute_default_rope_parameters
// and _compute_llama3_parameters (bit for bit on the CPU), each a kernel on
// `device`: nothing is copied from the host.
at::Tensor llama_rope_inv_freq(const LlamaConfig& cfg, at::Device device = at::kCPU);

// (T, T) bool on `device`, true where key j is visible to query i with window
// W: i - W < j <= i (Note [Sliding-window mask]).
at::Tensor sliding_window_mask(int64_t seq_len, int64_t window, at::Device device);

// cos, sin (T, Dh) in `dtype` on `device` for positions 0..T-1: computed in fp32
// as cat(f, f) with f = pos x inv_freq (T, Dh/2), then cast. Requires:
// inv_freq on `device` (a table on another device is refused, not copied).
std::pair<at::Tensor, at::Tensor> llama_rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len,
                                                     at::ScalarType dtype, at::Device device);

}  // namespace fsdp::models

// T5 encoder-decoder (Raffel et al. 2020, arXiv:1910.10683) with Hugging Face
// T5ForConditionalGeneration's semantics, names and weight layouts: the
// original T5 and T5 v1.1 / flan-T5 (Note [T5 variants] in t5_config.h).
//
// Parameter names (exactly HF's; stack S is "encoder" or "decoder"):
//   shared.weight                                              (V, D)
//   S.block.{i}.layer.0.SelfAttention.{q,k,v}.weight           (H*Dh, D)
//   S.block.{i}.layer.0.SelfAttention.o.weight                 (D, H*Dh)
//   S.block.0.layer.0.SelfAttention.relative_attention_bias.weight  (Nb, H)  first block only
//   S.block.{i}.layer.0.layer_norm.weight                      (D)
//   decoder.block.{i}.layer.1.EncDecAttention.{q,k,v,o}.weight as SelfAttention's
//   decoder.block.{i}.layer.1.layer_norm.weight                (D)
//   S.block.{i}.layer.{f}.DenseReluDense.wi.weight             (F, D)    relu/gelu/silu
//   S.block.{i}.layer.{f}.DenseReluDense.wi_0.weight, wi_1     (F, D)    gated-*
//   S.block.{i}.layer.{f}.DenseReluDense.wo.weight             (D, F)
//   S.block.{i}.layer.{f}.layer_norm.weight                    (D)       f = 1 (encoder), 2 (decoder)
//   S.final_layer_norm.weight                                  (D)
//   lm_head.weight                                             (V, D)    untied only
// named_parameters() lists them in HF's order. The stacks' embed_tokens are
// shared.weight (HF ties them; its files hold shared.weight only).
//
// Semantics (checked against transformers: tests/hf/test_t5.py):
//   encoder: h = shared(inputs); per block: h += o(attn(ln(h), bias_e)); h += ff(ln(h)); h = ln_f(h)
//   decoder: g = shared(shift_right(targets)); per block: g += o(attn(ln(g), bias_d));
//            g += o(cross_attn(ln(g), h, mask_e)); g += ff(ln(g)); g = ln_f(g)
//   logits = head(g * (scale_decoder_outputs ? D^-0.5 : 1))
// attention: softmax(q k^T + bias) v, no 1/sqrt(Dh) (T5 folds it into the init),
// softmax in fp32. bias_e = the encoder's bidirectional relative-position bias
// + the padding mask of the inputs; bias_d = the decoder's unidirectional bias
// + the causal mask; cross-attention has no position bias, only the inputs'
// padding mask. ln is T5's RMS norm (RMSNorm of layers.h, eps layer_norm_epsilon).
// ff: wo(act(wi(x))), gated: wo(act(wi_0(x)) * wi_1(x)). No dropout.
//
// Inputs: `inputs` (B, Ts) int64, the encoder's tokens, padding = pad_token_id
// (the attention mask is inputs != pad, as T5's tokenizer makes it); `targets`
// (B, Tt) int64, the labels, kIgnoreIndex where there is none; the decoder
// reads them shifted right by one behind decoder_start_token_id, ignored
// positions as pad (transformers' _shift_right).
//
// Units: every block is an nn::Unit<T5BlockImpl> (the posts wrap T5Block);
// the shared embedding, the final norms and lm_head belong to the root. The
// first block of each stack owns the relative-position embedding, computes the
// bias once per forward and returns it with its hidden state; the stack hands
// it to the other blocks (as transformers does), so the bias's gradient flows
// back into the first unit from every block that used it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <string>
#include <typeindex>
#include <vector>

#include "fsdp/models/chunked_loss.h"
#include "fsdp/models/layers.h"
#include "fsdp/models/t5_config.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"

namespace fsdp::models {

class T5AttentionImpl : public torch::nn::Module {
 public:
  // relative_bias: owns relative_attention_bias (a stack's first block's
  // self-attention); bidirectional: the encoder's buckets (both directions).
  T5AttentionImpl(const T5Config& cfg, const at::TensorOptions& options, bool relative_bias, bool bidirectional);
  // x (B, Tq, D), kv (B, Tk, D), bias added to the scores (1 or B, 1 or H, Tq, Tk) -> (B, Tq, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& kv, const at::Tensor& bias);
  // (1, H, Tq, Tk): the relative-position bias for queries 0..Tq-1 and keys
  // 0..Tk-1, in the parameters' dtype. Requires: has_relative_bias().
  at::Tensor position_bias(int64_t tq, int64_t tk);
  bool has_relative_bias() const { return !relative_attention_bias_.is_empty(); }

 private:
  int64_t heads_, d_kv_, buckets_, max_distance_;
  bool bidirectional_;
  Linear q_{nullptr}, k_{nullptr}, v_{nullptr};  // weight (H*Dh, D)
  Linear o_{nullptr};                            // weight (D, H*Dh)
  Embedding relative_attention_bias_{nullptr};   // weight (Nb, H); first blocks only
};
TORCH_MODULE(T5Attention);

// wo(act(wi(x))) or wo(act(wi_0(x)) * wi_1(x)).
class T5DenseImpl : public torch::nn::Module {
 public:
  T5DenseImpl(const T5Config& cfg, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // (B, T, D) -> (B, T, D)

 private:
  std::string act_;
  Linear wi_{nullptr};    // (F, D), not gated
  Linear wi_0_{nullptr};  // (F, D), gated
  Linear wi_1_{nullptr};  // (F, D), gated
  Linear wo_{nullptr};    // (D, F)
};
TORCH_MODULE(T5Dense);

// One of a block's sublayers: pre-norm attention or feed-forward with its
// residual. kind: "SelfAttention", "EncDecAttention" or "DenseReluDense" (the
// HF name of its inner module).
class T5SublayerImpl : public torch::nn::Module {
 public:
  T5SublayerImpl(const T5Config& cfg, const at::TensorOptions& options, const std::string& kind, bool relative_bias,
                 bool bidirectional);
  // Attention: h + attn(ln(h), kv or ln(h), bias); feed-forward: h + ff(ln(h)).
  at::Tensor forward(const at::Tensor& h, const at::Tensor& kv, const at::Tensor& bias);
  at::Tensor forward(const at::Tensor& h);
  T5AttentionImpl& attention() { return *attention_; }

 private:
  T5Attention attention_{nullptr};
  T5Dense dense_{nullptr};
  RMSNorm layer_norm_{nullptr};  // weight (D)
};
TORCH_MODULE(T5Sublayer);

// HF's T5Block: the unit of sharding and of activation checkpointing.
class T5BlockImpl : public torch::nn::Module {
 public:
  // first: the stack's first block (owns the relative-position embedding).
  T5BlockImpl(const T5Config& cfg, const at::TensorOptions& options, bool decoder, bool first);
  // Encoder block: h (B, Ts, D); bias: the first block's mask (B, 1, 1, Ts),
  // the others' the bias the first returned. -> {h} or, first, {h, bias (B, H, Ts, Ts)}.
  std::vector<at::Tensor> forward(const at::Tensor& h, const at::Tensor& bias);
  // Decoder block: g (B, Tt, D), bias as above with the causal mask (1, 1, Tt, Tt),
  // enc (B, Ts, D) the encoder's output, enc_mask (B, 1, 1, Ts).
  std::vector<at::Tensor> forward(const at::Tensor& g, const at::Tensor& bias, const at::Tensor& enc,
                                  const at::Tensor& enc_mask);

 private:
  bool first_;
  torch::nn::ModuleList layer_{nullptr};  // "layer.0" self-attention, ["layer.1" cross-attention], feed-forward
  std::vector<T5Sublayer> sublayers_;
};
using T5Block = nn::Unit<T5BlockImpl>;

// A stack of blocks and its final norm (no embedding: the root's shared one).
class T5StackImpl : public torch::nn::Module {
 public:
  T5StackImpl(const T5Config& cfg, const at::TensorOptions& options, bool decoder);
  // Encoder: x (B, Ts, D) embedded inputs, mask (B, 1, 1, Ts) -> (B, Ts, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask);
  // Decoder: x (B, Tt, D), causal (1, 1, Tt, Tt), enc (B, Ts, D), enc_mask (B, 1, 1, Ts) -> (B, Tt, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal, const at::Tensor& enc, const at::Tensor& enc_mask);
  const std::vector<T5Block>& blocks() const { return blocks_; }

 private:
  torch::nn::ModuleList block_{nullptr};  // "block.{i}", holds blocks_
  std::vector<T5Block> blocks_;
  RMSNorm final_layer_norm_{nullptr};  // weight (D)
};
TORCH_MODULE(T5Stack);

// Tag of the forward that returns the logits (through a root unit, which
// replays tags unchanged).
struct T5Logits {};

// The trainer's T5 model.
class T5ForConditionalGenerationImpl : public torch::nn::Module, public nn::CallOrder, public HasLayerKernels {
 public:
  // Builds on options.device() (kMeta: shapes only; else initialized by
  // t5_init_rule(cfg) and `seed`). UsageError when cfg.validate() refuses.
  T5ForConditionalGenerationImpl(const T5Config& cfg, const at::TensorOptions& options, uint64_t seed);
  // inputs (B, Ts), targets (B, Tt) -> logits (B, Tt, V) in the parameters' dtype.
  // UsageError: not 2-D int64, ids outside [0, V) (targets: or kIgnoreIndex), B differing.
  at::Tensor logits(const at::Tensor& inputs, const at::Tensor& targets);
  // Mean cross-entropy over the non-ignored targets (fp32 ()), the output
  // projection chunked as Llama's (chunked_loss.h); kSum: their sum.
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets, LossReduction reduction = LossReduction::kMean);
  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& targets) { return loss(inputs, targets); }
  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& targets, LossReduction reduction) {
    return loss(inputs, targets, reduction);
  }
  at::Tensor forward(const at::Tensor& inputs, const at::Tensor& targets, T5Logits) { return logits(inputs, targets); }
  // The root's own parameters (the shared embedding) first, then every
  // encoder block, then every decoder block (nn::CallOrder).
  std::vector<std::string> unit_call_order() const override;
  // Rows per chunk of the loss's logits; 0: default_loss_chunk_rows(V, the decoder states' device type).
  void set_loss_chunk_rows(int64_t rows);
  // The loss's kernels (chunked_cross_entropy), as Llama's.
  void set_kernels(LayerKernels kernels) override { loss_kernels_ = kernels; }
  const T5Config& config() const { return cfg_; }

 private:
  // Decoder hidden states (B, Tt, D), scaled for the head when the config says so.
  at::Tensor decode(const at::Tensor& inputs, const at::Tensor& targets);
  const at::Tensor& head_weight() const;

  T5Config cfg_;
  Embedding shared_{nullptr};  // weight (V, D)
  T5Stack encoder_{nullptr};
  T5Stack decoder_{nullptr};
  Linear lm_head_{nullptr};    // weight (V, D); null when tied
  int64_t loss_chunk_rows_ = 0;
  LayerKernels loss_kernels_ = LayerKernels::kReference;
};
TORCH_MODULE(T5ForConditionalGeneration);

// transformers' T5PreTrainedModel._init_weights, per parameter name (f =
// initializer_factor): norms f; shared and lm_head normal(f); wi, wi_0, wi_1
// normal(f D^-0.5), wo normal(f F^-0.5); q normal(f (D Dh)^-0.5), k and v
// normal(f D^-0.5), o normal(f (H Dh)^-0.5), relative_attention_bias
// normal(f D^-0.5). An unknown name is an internal error.
nn::InitRuleFn t5_init_rule(const T5Config& cfg);

// typeid(T5BlockImpl): the block for wrap policies and activation checkpointing.
std::type_index t5_block_type();

// T5's bucket of each relative position (memory - query), as transformers'
// T5Attention._relative_position_bucket: int64 of relative_position's shape.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional, int64_t num_buckets,
                                       int64_t max_distance);

}  // namespace fsdp::models

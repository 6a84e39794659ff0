// Building blocks with explicit TensorOptions: Linear, Embedding, RMSNorm.
//
// Each constructor creates its parameters with `at::empty(shape, options)` and
// does not initialize them. With `options.device() == kMeta` nothing is
// allocated, which is how a 70B model is built for inspection or for a sharding
// engine that materializes only its shards. Values come from the model's
// nn::InitRuleFn (see llama.h / mlp.h), applied by the model constructor on a
// real device.
//
// Parameter names are those of torch.nn (`weight`, `bias`), so qualified names
// match Hugging Face / PyTorch state dicts. Members alias the registered
// parameters (the same TensorImpl), so an engine's `set_data` on a parameter is
// seen by forward.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/models/fp8.h"
#include "fsdp/models/layer_kernels.h"
#include "fsdp/nn/recompute.h"

namespace fsdp::models {

// y = x W^T (+ b), as torch.nn.Linear; optionally with a LoRA adapter
// (add_lora; models/lora.h applies adapters to a whole model).
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options);

  // x (..., in) -> (..., out), in the parameters' dtype. With an adapter, as
  // peft's LoraLayer (vanilla LoRA, no rslora/DoRA):
  //   y = x W^T (+ b) + ((dropout(x) A^T) B^T) * (alpha / r)
  // Without one, exactly the plain linear: no extra operation.
  at::Tensor forward(const at::Tensor& x);
  // The same, with the product x W^T (+ b) marked `role` for activation
  // checkpointing (nn::linear: outside a checkpointed unit, the same call).
  at::Tensor forward_marked(const at::Tensor& x, nn::ProductRole role);

  // The product's arithmetic (set_fp8_linears sets it on a model's decoder
  // products). kRowwise runs x W^T as models::fp8_linear (the bias, if any,
  // added in the compute dtype after it), marked for checkpointing as the
  // plain product is (nn::marked_product). A layer with a LoRA adapter, a
  // frozen weight (requires_grad false: a LoRA base) or a size that is not a
  // multiple of 16 keeps the plain product.
  void set_fp8(Fp8Linear mode) { fp8_ = mode; }
  Fp8Linear fp8() const { return fp8_; }
  // Whether forward runs the FP8 product now (the conditions above).
  bool runs_fp8() const;

  // Registers the adapter's submodules "lora_A" (weight (r, in)) and "lora_B"
  // (weight (out, r)), so their parameters are `<this>.lora_A.weight` and
  // `<this>.lora_B.weight`, listed after weight and bias. They are created
  // like weight (same device and dtype; on kMeta nothing is allocated) and
  // NOT initialized: apply_lora or the engine's init rule does
  // (lora_init_rule). Dropout probability p in [0, 1): applied to the
  // adapter's input in training mode only; its masks are a pure function of
  // (set_lora_dropout_key's key, mask_key) — no global RNG is consumed, and
  // p == 0 draws nothing. Requires: no adapter yet, rank >= 1.
  void add_lora(int64_t rank, double alpha, double dropout, uint64_t mask_key);
  bool has_lora() const { return lora_A_ != nullptr; }
  // The adapter's first half, lora_A(dropout(x)): x (..., in) -> (..., r);
  // forward adds lora_B of it times lora_scaling(). Requires: has_lora().
  at::Tensor lora_down(const at::Tensor& x);
  // Requires: has_lora().
  const at::Tensor& lora_A() const;  // (r, in)
  const at::Tensor& lora_B() const;  // (out, r)
  int64_t lora_rank() const { return lora_rank_; }
  double lora_scaling() const { return lora_scaling_; }  // alpha / r
  // The key of the next forwards' dropout masks (the trainer sets one per
  // micro-batch, so that a recomputed forward draws the same masks).
  void set_lora_dropout_key(uint64_t key) { lora_dropout_key_ = key; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const at::Tensor& weight() const { return weight_; }
  const at::Tensor& bias() const { return bias_; }  // undefined without bias

 private:
  int64_t in_features_;
  int64_t out_features_;
  at::Tensor weight_;  // (out, in)
  at::Tensor bias_;    // (out), undefined when bias == false
  // The adapter; null without one. Held as LinearImpl so that the parameter
  // names are lora_A.weight / lora_B.weight, as peft's.
  std::shared_ptr<LinearImpl> lora_A_;  // weight (r, in)
  std::shared_ptr<LinearImpl> lora_B_;  // weight (out, r)
  int64_t lora_rank_ = 0;               // r
  double lora_scaling_ = 0;             // alpha / r
  double lora_dropout_ = 0;             // p
  uint64_t lora_mask_key_ = 0;          // this layer's part of the mask key (its name's hash)
  uint64_t lora_dropout_key_ = 0;       // the micro-batch's part
  Fp8Linear fp8_ = Fp8Linear::kOff;

  at::Tensor fp8_product(const at::Tensor& x, std::optional<nn::ProductRole> role);
};
TORCH_MODULE(Linear);

// Sets `mode` on the decoder's products of `model`: every Linear named
// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj (the
// embedding, the head, the norms, routers and LoRA adapters are left in the
// compute dtype); returns how many it set.
int64_t set_fp8_linears(torch::nn::Module& model, Fp8Linear mode);

// Token embedding lookup, as torch.nn.Embedding. With `padding_idx`, row
// padding_idx receives no gradient (the lookup itself is unchanged), as
// nn.Embedding(padding_idx=...) — what transformers builds from pad_token_id.
class EmbeddingImpl : public torch::nn::Module {
 public:
  // padding_idx, when set, must lie in [0, num_embeddings) (an internal error otherwise).
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, const at::TensorOptions& options,
                std::optional<int64_t> padding_idx = std::nullopt);

  // tokens (B, T) int64 in [0, V) -> (B, T, D). Range checking is the caller's
  // job (LlamaForCausalLM checks once per batch).
  at::Tensor forward(const at::Tensor& tokens);

  const at::Tensor& weight() const { return weight_; }
  const std::optional<int64_t>& padding_idx() const { return padding_idx_; }

 private:
  at::Tensor weight_;                   // (V, D)
  std::optional<int64_t> padding_idx_;  // the row without gradient; nullopt: none
};
TORCH_MODULE(Embedding);

// A layer with a fused form; set_layer_kernels sets every one of a model.
class HasLayerKernels {
 public:
  virtual ~HasLayerKernels() = default;
  virtual void set_kernels(LayerKernels kernels) = 0;
};

// Root-mean-square norm, as HF's LlamaRMSNorm: the input is upcast to fp32,
// x * rsqrt(mean(x^2) + eps) is cast back to the input dtype, then multiplied by
// weight (result in the promoted dtype of weight and input).
class RMSNormImpl : public torch::nn::Module, public HasLayerKernels {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options);

  // x (..., D) -> (..., D). kReference: HF's LlamaRMSNorm — statistics in
  // fp32, the normalized values rounded to x's dtype, then times the weight
  // (a second rounding in bf16). kFused: at::_fused_rms_norm (its own CUDA
  // kernel and backward; on the CPU LibTorch's composite of the same
  // arithmetic): x * rsqrt(mean(x^2) + eps) * weight in fp32, rounded once.
  // fp32: the same values; bf16: within one rounding of the reference.
  at::Tensor forward(const at::Tensor& x);

  void set_kernels(LayerKernels kernels) override { kernels_ = kernels; }
  LayerKernels kernels() const { return kernels_; }
  double eps() const { return eps_; }
  const at::Tensor& weight() const { return weight_; }

 private:
  double eps_;
  LayerKernels kernels_ = LayerKernels::kReference;
  at::Tensor weight_;  // (D)
};
TORCH_MODULE(RMSNorm);

// Sets `kernels` on every layer of `model` that has a fused form
// (HasLayerKernels: its RMSNorms, Llama's attentions and MLPs, a language
// model's loss); returns how
// many it set.
int64_t set_layer_kernels(torch::nn::Module& model, LayerKernels kernels);

}  // namespace fsdp::models

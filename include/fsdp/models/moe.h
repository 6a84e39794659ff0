// Mixtral's sparse mixture-of-experts feed-forward block, with Hugging Face
// MixtralSparseMoeBlock semantics and the parameter names transformers writes
// to disk (dimension letters: llama_config.h).
//
// Parameter names, relative to the decoder layer (as transformers 5's
// save_pretrained writes a Mixtral: it fuses the experts in memory,
// `mlp.experts.gate_up_proj`, and converts back to these names on save and
// from them on load):
//   block_sparse_moe.gate.weight              (E, D)   router, no bias
//   block_sparse_moe.experts.{e}.w1.weight    (F, D)   SwiGLU gate projection
//   block_sparse_moe.experts.{e}.w2.weight    (D, F)   down projection
//   block_sparse_moe.experts.{e}.w3.weight    (F, D)   up projection
// Expert weights are ordinary parameters of the decoder layer, so they are
// sharded with it (the layer is the unit).
//
// Semantics, for the N = B*T tokens x (N, D) of a micro-batch:
//   router_logits = x gate^T                           (N, E), x's dtype
//   p = softmax(router_logits) in fp32                 (N, E)
//   (w, i) = topk(p, K); w = w / sum(w)                (N, K) fp32, renormalised
//   out[n] = sum_j  w[n, j] * expert_{i[n, j]}(x[n])    expert(x) = w2(silu(w1 x) * w3 x)
// Each product w * expert(x) is formed in fp32 and cast to x's dtype before the
// sum, as transformers does. Note [Expert dispatch] in moe.cpp says how the
// tokens reach their experts.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "fsdp/models/layers.h"
#include "fsdp/models/llama_config.h"

namespace fsdp::models {

// One expert: SwiGLU, w2(silu(w1 x) * w3 x) (HF MixtralBlockSparseTop2MLP).
class MixtralExpertImpl : public torch::nn::Module {
 public:
  MixtralExpertImpl(const LlamaConfig& cfg, const at::TensorOptions& options);

  // x (n, D) -> (n, D); n may be 0.
  at::Tensor forward(const at::Tensor& x);

 private:
  Linear w1_{nullptr};  // weight (F, D)
  Linear w2_{nullptr};  // weight (D, F)
  Linear w3_{nullptr};  // weight (F, D)
};
TORCH_MODULE(MixtralExpert);

class MixtralSparseMoeBlockImpl : public torch::nn::Module {
 public:
  // Requires: cfg.moe() (validated).
  MixtralSparseMoeBlockImpl(const LlamaConfig& cfg, const at::TensorOptions& options);

  // x (B, T, D) -> {out (B, T, D) in x's dtype, router_logits (N, E) in x's dtype}.
  // A pure function of x and the parameters (activation checkpointing
  // recomputes it and gets the same routing). Every expert runs every call,
  // on zero rows if no token chose it, so every expert weight is in the
  // autograd graph and gets a (zero) gradient. One host sync: the per-expert
  // token counts (Note [Expert dispatch]).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x);

  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }

 private:
  int64_t num_experts_;  // E
  int64_t top_k_;        // K
  Linear gate_{nullptr};                    // router, weight (E, D)
  torch::nn::ModuleList experts_{nullptr};  // "experts.{e}", holds experts_list_
  std::vector<MixtralExpert> expert_list_;  // E typed handles to the same modules
};
TORCH_MODULE(MixtralSparseMoeBlock);

// transformers' load_balancing_loss_func (Switch Transformer, eqs. 4-6)
// without an attention mask, over every layer's router logits (N, E) (the
// rows of all layers pooled):
//   f_e = (number of top-K choices of expert e) / rows      (no gradient)
//   P_e = (sum of softmax probabilities of expert e) / rows
//   loss = E * sum_e f_e * P_e
// The softmax and top-K here run in the logits' dtype, as transformers' does
// (routing itself takes softmax in fp32; with fp32 logits both are the same).
// fp32 scalar. No host sync. Requires: at least one layer.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k);

}  // namespace fsdp::models

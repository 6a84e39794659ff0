#include "fsdp/models/layers.h"

#include <ATen/Context.h>

#include <mutex>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "models/module_names.h"

namespace fsdp::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options)
    : in_features_(in_features), out_features_(out_features) {
  FSDP_ASSERT(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features, ")");
  weight_ = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (bias) bias_ = register_parameter("bias", at::empty({out_features}, options));
}

bool LinearImpl::runs_fp8() const {
  return fp8_ == Fp8Linear::kRowwise && !lora_A_ && weight_.requires_grad() &&
         fp8_linear_applies(in_features_, out_features_);
}

at::Tensor LinearImpl::fp8_product(const at::Tensor& x, std::optional<nn::ProductRole> role) {
  const at::Tensor y = nn::marked_product(x, out_features_, role, [&](const at::Tensor& rows, const at::Tensor* over) {
    return fp8_linear(rows, weight_, over);
  });
  return bias_.defined() ? y + bias_ : y;
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  if (runs_fp8()) return fp8_product(x, std::nullopt);
  at::Tensor y = at::linear(x, weight_, bias_);
  if (!lora_A_) return y;
  // peft's LoraLayer.forward, in its order: result + lora_B(lora_A(dropout(x))) * scaling.
  return y + lora_B_->forward(lora_down(x)) * lora_scaling_;
}

at::Tensor LinearImpl::forward_marked(const at::Tensor& x, nn::ProductRole role) {
  // The adapter adds to the product: a tail stays a tail, a kept product is
  // kept without it (the adapter's own products are recomputed).
  if (runs_fp8()) return fp8_product(x, role);
  at::Tensor y = nn::linear(x, weight_, bias_, role);
  if (!lora_A_) return y;
  // peft's LoraLayer.forward, in its order: result + lora_B(lora_A(dropout(x))) * scaling.
  return y + lora_B_->forward(lora_down(x)) * lora_scaling_;
}

at::Tensor LinearImpl::lora_down(const at::Tensor& x) {
  FSDP_ASSERT(lora_A_, "lora_down of a Linear without an adapter");
  at::Tensor h = x;
  if (lora_dropout_ > 0 && is_training()) {
    // Masks from a generator of x's device seeded with (micro-batch key, this
    // layer's key): the global generators are left alone, and recomputing the
    // forward (activation checkpointing) draws the same masks.
    at::Generator gen = at::globalContext().defaultGenerator(x.device()).clone();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(splitmix64(lora_dropout_key_ ^ lora_mask_key_));
    }
    const at::Tensor keep = at::empty_like(x).bernoulli_(1.0 - lora_dropout_, gen);
    h = x * keep.div_(1.0 - lora_dropout_);
  }
  return lora_A_->forward(h);
}

void LinearImpl::add_lora(int64_t rank, double alpha, double dropout, uint64_t mask_key) {
  FSDP_ASSERT(!lora_A_, "Linear(", in_features_, ", ", out_features_, ") already has a LoRA adapter");
  FSDP_ASSERT(rank >= 1 && dropout >= 0 && dropout < 1, "LoRA rank ", rank, ", dropout ", dropout);
  const at::TensorOptions options = weight_.options();
  lora_A_ = register_module("lora_A", std::make_shared<LinearImpl>(in_features_, rank, /*bias=*/false, options));
  lora_B_ = register_module("lora_B", std::make_shared<LinearImpl>(rank, out_features_, /*bias=*/false, options));
  lora_rank_ = rank;
  lora_scaling_ = alpha / static_cast<double>(rank);
  lora_dropout_ = dropout;
  lora_mask_key_ = mask_key;
}

const at::Tensor& LinearImpl::lora_A() const {
  FSDP_ASSERT(lora_A_, "lora_A() of a Linear without a LoRA adapter");
  return lora_A_->weight();
}

const at::Tensor& LinearImpl::lora_B() const {
  FSDP_ASSERT(lora_B_, "lora_B() of a Linear without a LoRA adapter");
  return lora_B_->weight();
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, const at::TensorOptions& options,
                             std::optional<int64_t> padding_idx)
    : padding_idx_(padding_idx) {
  FSDP_ASSERT(num_embeddings > 0 && embedding_dim > 0, "Embedding(", num_embeddings, ", ", embedding_dim, ")");
  FSDP_ASSERT(!padding_idx || (*padding_idx >= 0 && *padding_idx < num_embeddings), "Embedding padding_idx ",
              *padding_idx, " outside [0, ", num_embeddings, ")");
  weight_ = register_parameter("weight", at::empty({num_embeddings, embedding_dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& tokens) {
  // ATen's embedding takes -1 for "no padding row" (torch.nn.functional
  // turns a negative padding_idx into a row number before it gets here).
  return at::embedding(weight_, tokens, padding_idx_.value_or(-1));
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options) : eps_(eps) {
  FSDP_ASSERT(dim > 0, "RMSNorm(", dim, ")");
  weight_ = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (kernels_ == LayerKernels::kFused) {
    return std::get<0>(at::_fused_rms_norm(x, {weight_.size(0)}, weight_, eps_));
  }
  // As HF's LlamaRMSNorm: statistics in fp32, normalized values cast back to
  // the input dtype before the (possibly bf16) weight multiplies them.
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor var = x32.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normed = (x32 * at::rsqrt(var + eps_)).to(x.scalar_type());
  return weight_ * normed;
}

const char* to_string(LayerKernels kernels) {
  return kernels == LayerKernels::kFused ? "fused" : "reference";
}

std::optional<LayerKernels> parse_layer_kernels(const std::string& name) {
  for (LayerKernels k : {LayerKernels::kReference, LayerKernels::kFused}) {
    if (name == to_string(k)) return k;
  }
  return std::nullopt;
}

int64_t set_fp8_linears(torch::nn::Module& model, Fp8Linear mode) {
  static const char* const kDecoderProducts[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  int64_t n = 0;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    const std::string leaf = last_component(item.key());
    for (const char* product : kDecoderProducts) {
      if (leaf == product) {
        linear->set_fp8(mode);
        ++n;
      }
    }
  }
  return n;
}

int64_t set_layer_kernels(torch::nn::Module& model, LayerKernels kernels) {
  int64_t n = 0;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* layer = dynamic_cast<HasLayerKernels*>(m.get())) {
      layer->set_kernels(kernels);
      ++n;
    }
  }
  return n;
}

}  // namespace fsdp::models

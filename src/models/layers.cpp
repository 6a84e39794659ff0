#include "fsdp/models/layers.h"

#include "fsdp/common/error.h"

namespace fsdp::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options)
    : in_features_(in_features), out_features_(out_features) {
  FSDP_ASSERT(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features, ")");
  weight_ = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (bias) bias_ = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight_, bias_); }

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
  // As HF's LlamaRMSNorm: statistics in fp32, normalized values cast back to
  // the input dtype before the (possibly bf16) weight multiplies them.
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor var = x32.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normed = (x32 * at::rsqrt(var + eps_)).to(x.scalar_type());
  return weight_ * normed;
}

}  // namespace fsdp::models

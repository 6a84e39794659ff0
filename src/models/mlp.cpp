#include "fsdp/models/mlp.h"

#include <cmath>
#include <string>

#include "fsdp/common/error.h"

namespace fsdp::models {

void MlpConfig::validate() const {
  FSDP_CHECK(width > 0, "MlpConfig: width = ", width, " must be positive (the tutorial uses 20480)");
  FSDP_CHECK(layers > 0, "MlpConfig: layers = ", layers, " must be positive (the tutorial uses 8)");
}

MlpImpl::MlpImpl(const MlpConfig& cfg, const at::TensorOptions& options, uint64_t seed) : cfg_(cfg) {
  cfg_.validate();
  // A parameterless container named like the tutorial's nn.Sequential, so the
  // names are fcs.0.*, fcs.2.*, ... (ReLUs at the odd indices).
  auto fcs = register_module("fcs", std::make_shared<torch::nn::Module>("Sequential"));
  fcs_.reserve(cfg_.layers);
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    nn::Unit<LinearImpl> fc(std::make_shared<LinearImpl>(cfg_.width, cfg_.width, /*bias=*/true, options));
    fcs->register_module(std::to_string(2 * i), fc.ptr());
    fcs_.push_back(std::move(fc));
  }
  if (options.device().type() != at::kMeta) nn::init_module(*this, mlp_init_rule(cfg_), seed);
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  FSDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == cfg_.width, "Mlp: input must be (B, W=", cfg_.width,
             "), got ", x.defined() ? x.sizes() : at::IntArrayRef{}, " — reshape it or build the Mlp with that width");
  at::Tensor h = x;
  for (size_t i = 0; i < fcs_.size(); ++i) {
    h = fcs_[i](h);
    if (i + 1 < fcs_.size()) h = at::relu(h);
  }
  return h;
}

at::Tensor MlpImpl::loss(const at::Tensor& x, const at::Tensor& target) {
  const at::Tensor y = forward(x);
  FSDP_CHECK(target.defined() && target.sizes() == y.sizes(), "Mlp: target must be ", y.sizes(), ", got ",
             target.defined() ? target.sizes() : at::IntArrayRef{});
  return at::mse_loss(y.to(at::kFloat), target.to(at::kFloat));
}

nn::InitRuleFn mlp_init_rule(const MlpConfig& cfg) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(cfg.width));
  return [bound](const std::string&) { return nn::InitRule::uniform(bound); };
}

std::type_index mlp_block_type() { return std::type_index(typeid(LinearImpl)); }

}  // namespace fsdp::models

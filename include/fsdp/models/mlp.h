// The MLP of the PyTorch FSDP tutorial: `layers` Linear layers of width W with
// ReLU between consecutive ones (none after the last), biases as torch.nn.Linear.
//
// Dimension letters: B (batch) as in llama_config.h; W = MlpConfig::width.
//
// Parameter names mirror the tutorial's `fcs = nn.Sequential(Linear, ReLU, ...)`:
// fcs.0.weight (W, W), fcs.0.bias (W), fcs.2.weight, ... fcs.{2*(layers-1)}.bias
// (the ReLUs occupy the odd indices and hold no parameters).
//
// Every Linear is an nn::Unit<LinearImpl> (mlp_block_type()), so a wrap policy
// by module type shards each layer on its own, as the tutorial's
// ModuleWrapPolicy({nn.Linear}).
//
// Devices: as Llama (llama.h) — kMeta allocates nothing; elsewhere the
// constructor initializes with mlp_init_rule(cfg) and `seed`.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <typeindex>
#include <vector>

#include "fsdp/models/layers.h"
#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"

namespace fsdp::models {

struct MlpConfig {
  int64_t width = 20480;  // W (the tutorial's size: 8 x 419M = 3.36B params)
  int64_t layers = 8;     // number of Linear layers

  // layers * (W*W + W)
  int64_t num_parameters() const { return layers * (width * width + width); }
  // Throws UsageError for non-positive width or layers.
  void validate() const;
};

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const MlpConfig& cfg, const at::TensorOptions& options, uint64_t seed);

  // x (B, W) -> (B, W) in the parameters' dtype.
  // Throws UsageError when x is not (B, W).
  at::Tensor forward(const at::Tensor& x);

  // Mean squared error of forward(x) against target (B, W), computed in fp32;
  // fp32 scalar.
  at::Tensor loss(const at::Tensor& x, const at::Tensor& target);

  const MlpConfig& config() const { return cfg_; }
  const std::vector<nn::Unit<LinearImpl>>& layers() const { return fcs_; }

 private:
  MlpConfig cfg_;
  std::vector<nn::Unit<LinearImpl>> fcs_;  // `layers` of them; weight (W, W), bias (W)
};
TORCH_MODULE(Mlp);

// torch.nn.Linear's default init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
// (kaiming_uniform with a=sqrt(5) gives the same bound for the weight).
nn::InitRuleFn mlp_init_rule(const MlpConfig& cfg);

// typeid(LinearImpl): the unit type of the MLP for wrap policies.
std::type_index mlp_block_type();

}  // namespace fsdp::models

// Small models for engine tests: any torch::nn::Module with fsdp::nn::Unit
// boundaries. Deliberately odd sizes so flat parameters need padding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <string>

#include "fsdp/nn/init.h"
#include "fsdp/nn/unit.h"

namespace fsdp::testing {

struct ToyConfig {
  int64_t d_in = 5;    // Din
  int64_t d = 7;       // D
  int64_t f = 13;      // F
  int64_t d_out = 3;   // Dout
  int64_t blocks = 3;
  bool with_unused = false;  // a parameter that never gets a gradient
  // A decoder's layout (ToyIoNetImpl): the input and output projections as
  // units of their own, and between the blocks and the output a root-owned
  // scale (as a final norm); `tied`: the output uses the input unit's matrix
  // (d_in == d_out), one unit called twice.
  bool io_units = false;
  bool tied = false;
};

struct ToyBlockImpl : torch::nn::Module {
  torch::Tensor w1;      // (F, D)
  torch::Tensor b1;      // (F)
  torch::Tensor w2;      // (D, F)
  torch::Tensor unused;  // (D) never read by forward, when present
  ToyBlockImpl(const ToyConfig& c, const at::TensorOptions& o) {
    w1 = register_parameter("w1", torch::empty({c.f, c.d}, o));
    b1 = register_parameter("b1", torch::empty({c.f}, o));
    w2 = register_parameter("w2", torch::empty({c.d, c.f}, o));
    if (c.with_unused) unused = register_parameter("unused", torch::empty({c.d}, o));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // (B, D) -> (B, D)
    return x + torch::tanh(x.matmul(w1.t()) + b1).matmul(w2.t());
  }
};

struct ToyNetImpl : torch::nn::Module {
  torch::Tensor w_in;   // (D, Din)
  torch::nn::ModuleList blocks_list{nullptr};
  std::vector<nn::Unit<ToyBlockImpl>> blocks;
  torch::Tensor w_out;  // (Dout, D)
  ToyNetImpl(const ToyConfig& c, const at::TensorOptions& o) {
    w_in = register_parameter("w_in", torch::empty({c.d, c.d_in}, o));
    blocks_list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.blocks; ++i) {
      blocks.push_back(nn::make_unit<ToyBlockImpl>(c, o));
      blocks_list->push_back(blocks.back().ptr());
    }
    w_out = register_parameter("w_out", torch::empty({c.d_out, c.d}, o));
  }
  // Mean squared error of the prediction for x (B, Din) against y (B, Dout).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor h = x.matmul(w_in.t());
    for (auto& b : blocks) h = b(h);
    return (h.matmul(w_out.t()) - y).pow(2).mean();
  }
};

// Input projection as a unit: x (B, Din) -> (B, D); tied, also the loss of the
// output projection through the same matrix.
struct ToyInImpl : torch::nn::Module {
  torch::Tensor weight;  // (D, Din)
  ToyInImpl(const ToyConfig& c, const at::TensorOptions& o) {
    weight = register_parameter("weight", torch::empty({c.d, c.d_in}, o));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight.t()); }
  // h (B, D), y (B, Din): mean squared error of h W against y.
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& y) { return (h.matmul(weight) - y).pow(2).mean(); }
};

// Output projection and loss as a unit: h (B, D), y (B, Dout).
struct ToyOutImpl : torch::nn::Module {
  torch::Tensor weight;  // (Dout, D)
  ToyOutImpl(const ToyConfig& c, const at::TensorOptions& o) {
    weight = register_parameter("weight", torch::empty({c.d_out, c.d}, o));
  }
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& y) {
    return (h.matmul(weight.t()) - y).pow(2).mean();
  }
};

// ToyConfig::io_units: in -> blocks -> h * scale (the root's own) -> out (or in, tied).
struct ToyIoNetImpl : torch::nn::Module, nn::CallOrder {
  nn::Unit<ToyInImpl> in{nullptr};
  torch::nn::ModuleList blocks_list{nullptr};
  std::vector<nn::Unit<ToyBlockImpl>> blocks;
  torch::Tensor scale;  // (D)
  nn::Unit<ToyOutImpl> out{nullptr};
  ToyIoNetImpl(const ToyConfig& c, const at::TensorOptions& o) {
    in = register_module("in", nn::make_unit<ToyInImpl>(c, o).ptr());
    blocks_list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.blocks; ++i) {
      blocks.push_back(nn::make_unit<ToyBlockImpl>(c, o));
      blocks_list->push_back(blocks.back().ptr());
    }
    scale = register_parameter("scale", torch::empty({c.d}, o));
    if (!c.tied) out = register_module("out", nn::make_unit<ToyOutImpl>(c, o).ptr());
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    torch::Tensor h = in(x);
    for (auto& b : blocks) h = b(h);
    h = h * scale;
    return out ? out(h, y) : in(h, y);
  }
  std::vector<std::string> unit_call_order() const override {
    std::vector<std::string> order = {"in"};
    for (size_t i = 0; i < blocks.size(); ++i) order.push_back("blocks." + std::to_string(i));
    order.push_back("");  // scale
    order.push_back(out ? "out" : "in");
    return order;
  }
};

inline nn::InitRule toy_init_rule(const std::string& name) {
  if (name.size() >= 2 && name.compare(name.size() - 2, 2, "b1") == 0) return nn::InitRule::uniform(0.1);
  return nn::InitRule::normal(0.4);
}

inline nn::Unit<ToyIoNetImpl> make_toy_io(const ToyConfig& c, bool meta, uint64_t seed) {
  auto o = at::TensorOptions().dtype(at::kFloat).device(meta ? at::kMeta : at::kCPU);
  auto m = nn::Unit<ToyIoNetImpl>(std::make_shared<ToyIoNetImpl>(c, o));
  if (!meta) nn::init_module(*m, toy_init_rule, seed);
  return m;
}

inline nn::Unit<ToyNetImpl> make_toy(const ToyConfig& c, bool meta, uint64_t seed) {
  auto o = at::TensorOptions().dtype(at::kFloat).device(meta ? at::kMeta : at::kCPU);
  auto m = nn::Unit<ToyNetImpl>(std::make_shared<ToyNetImpl>(c, o));
  if (!meta) nn::init_module(*m, toy_init_rule, seed);
  return m;
}

}  // namespace fsdp::testing

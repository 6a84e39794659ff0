// A tiny Llama trained on a learnable token stream, shared by the tests that
// hold one form of the layers (fused kernels, FP8 products) to the reference
// over a few steps.
#pragma once

#include <torch/optim/adamw.h>

#include <ATen/CPUGeneratorImpl.h>

#include <string>
#include <vector>

#include "fsdp/models/llama.h"
#include "support/tiny_llama.h"

namespace fsdp::models::testing {

// The tests' tiny Llama twice as wide (Dh=16), V=128.
inline LlamaConfig chain_llama(const std::string& name) {
  LlamaConfig c = fsdp::testing::tiny_llama(name);
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.vocab_size = 128;
  c.validate();
  return c;
}

// (B, T + 1) tokens of a noisy counting chain, t_j = t_{j-1} + 1 + e_j mod V
// with e_j in {0, 1} (order 1), or t_j = t_{j-1} + 1 + (t_{j-2} mod 2) + e_j
// mod V (order 2: the step depends on the token two back). Learnable in a few
// steps (towards ln 2), unlike uniform tokens, whose loss stays at ln V.
inline at::Tensor counting_chain(int64_t b, int64_t t, int64_t vocab, uint64_t seed, int order) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor noise = at::randint(2, {b, t + 1}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor seq = at::randint(vocab, {b, t + 1}, gen, at::TensorOptions().dtype(at::kLong));
  auto s = seq.accessor<int64_t, 2>();
  auto e = noise.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = order; j <= t; ++j) {
      const int64_t two_back = order == 2 ? s[i][j - 2] % 2 : 0;
      s[i][j] = (s[i][j - 1] + 1 + two_back + e[i][j]) % vocab;
    }
  }
  return seq;
}

// `steps` steps of AdamW (lr 3e-3) on the whole (unsharded) model, each on 4
// fresh sequences of 32 tokens of counting_chain(order), seeds first_seed,
// first_seed + 1, ...; the losses.
inline std::vector<double> train_on_chain(LlamaForCausalLMImpl& model, int steps, int order, uint64_t first_seed) {
  torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const at::Tensor seq = counting_chain(4, 32, model.config().vocab_size, first_seed + step, order);
    opt.zero_grad();
    const at::Tensor loss = model.loss(seq.narrow(1, 0, 32).contiguous(), seq.narrow(1, 1, 32).contiguous());
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace fsdp::models::testing

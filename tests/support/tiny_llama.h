// The tiny Llama that model, engine and checkpoint tests build: one shape for
// all, so that a test states only what it changes (a vocabulary, a layer more,
// tied embeddings) on the LlamaConfig it gets, and a reader sees at once which
// of its numbers depend on its own choices.
#pragma once

#include <string>

#include "fsdp/models/llama_config.h"

namespace fsdp::testing {

// D=32, F=48 (F != H*Dh), H=4, Hkv=2 (grouped-query attention), Dh=8, L=2,
// V=64, T<=64; every other field is LlamaConfig's default. Small enough for
// multi-process runs of many steps on two cores. Not validated: the caller
// changes fields first (the model validates when built).
inline models::LlamaConfig tiny_llama(const std::string& name) {
  models::LlamaConfig c;
  c.name = name;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 2;
  c.vocab_size = 64;
  c.max_position_embeddings = 64;
  return c;
}

// tiny_llama as a Mixtral: E=4 experts of F, K=2 per token (the tiny-mixtral
// preset's E and K). The auxiliary loss at 0.1 (Mixtral's 0.02 would leave its
// gradients lost in the rest) and the init std at 0.2 (0.02 gives nearly equal
// router logits): routing far from uniform, so the router's gradients matter.
inline models::LlamaConfig tiny_mixtral(const std::string& name) {
  models::LlamaConfig c = tiny_llama(name);
  c.model_type = "mixtral";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.router_aux_loss_coef = 0.1;
  c.initializer_range = 0.2;
  return c;
}

}  // namespace fsdp::testing

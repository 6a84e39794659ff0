// Pieces the Llama-family parity tests share (LoRA, Mixtral): the root type,
// a loss over counting sequences, and the run's settings. For tests that link
// fsdp_models beside fsdp_parity.
#pragma once

#include "fsdp/models/llama.h"
#include "parity.h"

namespace fsdp::testing {

using LlamaRoot = nn::UnitImpl<models::LlamaForCausalLMImpl>;

// ParityModel::loss of a LlamaRoot: next-token loss on counting_sequences of
// `seq_len` tokens (and their successors as targets).
inline std::function<at::Tensor(nn::UnitBase&, int64_t, int64_t, int64_t)> counting_lm_loss(int64_t vocab,
                                                                                             int64_t seq_len) {
  return [vocab, seq_len](nn::UnitBase& root, int64_t step, int64_t first, int64_t count) {
    const at::Tensor seq = counting_sequences(vocab, seq_len + 1, step, first, count);
    const at::Tensor tokens = seq.narrow(1, 0, seq_len).contiguous();
    const at::Tensor targets = seq.narrow(1, 1, seq_len).contiguous();
    return dynamic_cast<LlamaRoot&>(root).forward(tokens, targets);
  };
}

// Six steps of a global batch of 8, one unit per decoder layer, HYBRID as 2
// shard x 2 replicas at 4 ranks.
inline ParityConfig llama_parity_config(ShardingStrategy s, int world, double lr) {
  ParityConfig c;
  c.steps = 6;
  c.global_batch = 8;
  c.lr = lr;
  c.fsdp.strategy = s;
  c.fsdp.hybrid_shard_size = world >= 4 ? 2 : 1;
  c.fsdp.wrap = WrapPolicy::by_type({models::llama_block_type()});
  return c;
}

}  // namespace fsdp::testing

// SGD with momentum over flat shards, with the update of torch.optim.SGD
// (dampening 0, no Nesterov):
//   g += weight_decay * p
//   buf = g at the first step, else momentum * buf + g
//   p -= lr * buf
// Its state (momentum_buffer) has the shape of each shard it updates. It is
// the second optimizer behind the state seam (Note [State seam],
// common/state.h): checkpoints persist it through the same code as AdamW.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/common/state.h"
#include "fsdp/fsdp.h"

namespace fsdp::optim {

// torch.optim.SGD's hyperparameters (dampening 0, nesterov false).
struct SgdOptions {
  double lr = 1e-2;            // learning rate
  double momentum = 0.9;       // in [0, 1)
  double weight_decay = 0.0;   // L2, added to the gradient
};

class SgdMomentum : public StateOwner {
 public:
  explicit SgdMomentum(SgdOptions options);

  // Every trainable local shard of a sharded model.
  void add_shards(const std::vector<ShardRef>& shards);
  // One update of every shard (an undefined gradient counts as zeros).
  void step();
  int64_t step_count() const { return step_; }
  const SgdOptions& options() const { return options_; }

  // StateOwner: key "optimizer", slot momentum_buffer per shard, metadata
  // {"type": "SGD", "step": t, "options": {lr, momentum, weight_decay}}.
  std::string state_key() const override { return "optimizer"; }
  std::vector<StateSlot> state_slots() override;
  nlohmann::json state_metadata() const override;
  void load_state_metadata(const nlohmann::json& saved) override;

 private:
  struct Slot {
    at::Tensor param;            // the shard, updated in place
    at::Tensor grad;             // its reduced gradient (may be undefined)
    at::Tensor momentum_buffer;  // same shape and dtype as param
  };
  SgdOptions options_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

}  // namespace fsdp::optim

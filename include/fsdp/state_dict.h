// State dicts of a sharded model and of its optimizer, with the options of
// PyTorch's torch.distributed.checkpoint.state_dict (get_model_state_dict,
// set_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict;
// StateDictOptions): full or sharded, CPU offload (rank 0 only for full
// ones), broadcast from rank 0, strict, ignore frozen parameters.
//
// A state dict here is a list of (fully qualified name, StateDictTensor) in the
// module's named_parameters() order, then its buffers. Full entries are the
// tensors themselves; sharded ones are this rank's part of each parameter: its
// elements in the flattened parameter from `offset` on — the engine's flat
// shards cut through parameters anywhere, so a part is a range of elements,
// not a block of rows (PyTorch's DTensor Shard(0)). A sharded dict loads only
// into the same layout (world size, strategy, wrap policy); across layouts use
// full ones (or the checkpoints of docs/checkpoints.md, which re-cut).
//
// Values: parameters in their shard's dtype (the master dtype; frozen
// parameters under mixed precision: the param dtype, Note [Frozen shards in
// the param dtype] in src/fsdp/model.cpp); ignored parameters and buffers as
// the module holds them.
//
// Collective calls: the getters with full_state_dict, and the setters with
// broadcast_from_rank0, are collective over the model's process group (every
// rank, the same order); the others are local. All are between steps.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"

namespace fsdp {

// PyTorch's StateDictOptions, the fields that apply.
struct StateDictOptions {
  bool full_state_dict = false;       // full tensors (gathered) instead of this rank's parts
  bool cpu_offload = false;           // tensors on the CPU; with full_state_dict only rank 0 gets any
  bool ignore_frozen_params = false;  // get: leave out parameters with requires_grad false
  bool strict = true;                 // set: every parameter given, and no unknown name (else UsageError)
  bool broadcast_from_rank0 = false;  // set (full_state_dict): only rank 0's dict is read; the others may be empty
};

// One tensor of a state dict: full, or this rank's part of it.
struct StateDictTensor {
  at::Tensor value;             // full: the parameter's shape; part: 1-D, this rank's elements (maybe none)
  std::vector<int64_t> shape;   // the whole tensor's shape
  int64_t offset = 0;           // part: where value begins in the flattened tensor
  bool full = true;
};
using StateDict = std::vector<std::pair<std::string, StateDictTensor>>;

// What a non-strict load did not use (PyTorch's _IncompatibleKeys).
struct IncompatibleKeys {
  std::vector<std::string> missing;     // parameters the dict did not give (they keep their values)
  std::vector<std::string> unexpected;  // names the model does not have
};

StateDict get_model_state_dict(ShardedModel& model, const StateDictOptions& options = {});
IncompatibleKeys set_model_state_dict(ShardedModel& model, const StateDict& state,
                                      const StateDictOptions& options = {});

// An optimizer's state for one trainable shard (ShardedModel::shards()): the
// shard itself (matched by identity) and its state tensors by name, each of
// the shard's size — for fsdp::optim::AdamW, each slot's {param, {"exp_avg",
// exp_avg}, {"exp_avg_sq", exp_avg_sq}} (optim::AdamW::slots()).
struct ShardOptimizerState {
  at::Tensor shard;
  std::map<std::string, at::Tensor> tensors;
};

// An optimizer state dict: per parameter, its state tensors by name (as
// PyTorch's "state" holds them), and the step count (PyTorch keeps one per
// parameter; the sharded optimizer has one).
struct OptimizerStateDict {
  int64_t step = 0;
  std::vector<std::pair<std::string, std::map<std::string, StateDictTensor>>> state;
};

OptimizerStateDict get_optimizer_state_dict(ShardedModel& model, const std::vector<ShardOptimizerState>& optimizer,
                                            int64_t step, const StateDictOptions& options = {});
// Writes `state` into the optimizer's tensors (in place); returns the step count to restore.
int64_t set_optimizer_state_dict(ShardedModel& model, const std::vector<ShardOptimizerState>& optimizer,
                                 const OptimizerStateDict& state, const StateDictOptions& options = {});

}  // namespace fsdp

// Autograd functions the engine inserts into the graph.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "fsdp/nn/recompute.h"
#include "fsdp/nn/unit.h"

namespace fsdp::detail {

class ShardedUnit;

// Identity on `outputs` whose backward first calls unit.pre_backward():
// the unit's parameters are gathered again before any of its backward runs.
// Outputs that do not require grad pass through (no node when none does).
// The node holds the unit weakly and counts itself in the root's live graph
// of this iteration (Note [Graph lifetime]); a backward after the model is
// gone is a UsageError.
std::vector<at::Tensor> attach_pre_backward(ShardedUnit& unit, const std::vector<at::Tensor>& outputs);

// Identity on the `inputs` that require grad, whose backward calls
// unit.on_inputs_grad_ready() once the gradients of all of them are computed,
// which is after the unit's own backward. For units with frozen parameters
// (Note [Frozen parameters] in unit.cpp). Other inputs pass through.
std::vector<at::Tensor> attach_post_backward(ShardedUnit& unit, const std::vector<at::Tensor>& inputs);

// Runs fn(inputs) without saving activations and recomputes it in backward
// (non-reentrant: the recompute runs inside this function's backward, through
// the inner forward directly, while the unit is unsharded by its pre-backward
// hook). `params` are the unit's parameters: passed as inputs so their
// gradients flow to their AccumulateGrad nodes. `offload_inputs`: keep the
// saved inputs in host memory until the recompute (a no-op for CPU tensors).
// `on_recompute` runs just before each recomputation (the schedule's trace).
// `policy`: what the recompute skips or keeps from forward (nn/recompute.h);
// the kept tensors are offloaded with the inputs. `kept_bytes` (may be null)
// counts the bytes kept from forward (kSelective) while they are held.
std::vector<at::Tensor> checkpointed_call(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                                          const std::vector<at::Tensor>& params, nn::RecomputePolicy policy,
                                          bool offload_inputs, std::function<void()> on_recompute,
                                          std::shared_ptr<std::atomic<int64_t>> kept_bytes);

}  // namespace fsdp::detail

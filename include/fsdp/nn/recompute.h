// What activation checkpointing recomputes, and the marks a model's forward
// places so that a checkpointed unit recomputes less (Note [Recompute policy]
// in src/nn/recompute.cpp).
//
// A checkpointed unit keeps its inputs in forward and runs its forward again
// in backward to rebuild the graph. Not every value of that graph is read by
// backward: a product whose output only reaches the unit's output through an
// addition (the MLP's down_proj before the residual) is never read.
// The model says which products those are, with the marks below; the engine
// opens a RecomputeScope around a checkpointed forward and its recompute.
// Outside a scope every mark is exactly the plain operation it names.
//
// This header knows nothing about sharding; models include it.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>

namespace fsdp::nn {

enum class RecomputePolicy {
  kFull,       // backward re-runs the whole forward, every product
  kTail,       // ... except the products marked kTail (their outputs are not read by backward)
};
const char* to_string(RecomputePolicy policy);  // "full" | "tail"
// nullopt for any other name.
std::optional<RecomputePolicy> parse_recompute_policy(std::string_view name);

// How a product's output is used in its unit.
enum class ProductRole {
  kTail,  // reaches the unit's output only through additions: backward never reads it
};

// at::linear(x, weight, bias): the same operations and the same values,
// marked `role`. In a recompute under a policy that skips or keeps it, the
// product is not run: its output gets the autograd node at::linear's product
// would have had (the same backward kernels), over a placeholder whose value
// nothing reads (kTail). Marks apply where that node can be rebuilt exactly
// (no bias, x of 2 dimensions or contiguous); elsewhere the product is
// recomputed.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, ProductRole role);

// ---- for the engine -------------------------------------------------------

// The marks on this thread follow `policy` while the scope lives: kForward
// (the checkpointed forward, grad mode off), kRecompute (backward's second
// forward, grad mode on). Scopes do not nest (a checkpointed unit holds no
// nested unit).
class RecomputeScope {
 public:
  enum class Phase { kForward, kRecompute };
  RecomputeScope(RecomputePolicy policy, Phase phase);
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

  RecomputePolicy policy() const { return policy_; }
  Phase phase() const { return phase_; }

 private:
  RecomputePolicy policy_;
  Phase phase_;
};

}  // namespace fsdp::nn

// What activation checkpointing recomputes, and the marks a model's forward
// places so that a checkpointed unit recomputes less (Note [Recompute policy]
// in src/nn/recompute.cpp).
//
// A checkpointed unit keeps its inputs in forward and runs its forward again
// in backward to rebuild the graph. Not every value of that graph is read by
// backward: a product whose output only reaches the unit's output through an
// addition (the MLP's down_proj before the residual) is never read, and a
// policy may keep a few outputs from forward instead of recomputing them.
// The model says which products those are, with the marks below; the engine
// opens a RecomputeScope around a checkpointed forward and its recompute.
// Outside a scope every mark is exactly the plain operation it names.
//
// This header knows nothing about sharding; models include it.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/nn/recompute_policy.h"

namespace fsdp::nn {

// How a product's output is used in its unit.
enum class ProductRole {
  kTail,  // reaches the unit's output only through additions: backward never reads it
  kKept,  // kSelective keeps it from forward
};

// at::linear(x, weight, bias): the same operations and the same values,
// marked `role`. In a recompute under a policy that skips or keeps it, the
// product is not run: its output gets the autograd node at::linear's product
// would have had (the same backward kernels), over the kept value (kKept) or
// over a placeholder whose value nothing reads (kTail). Marks apply where
// that node can be rebuilt exactly (no bias, x of 2 dimensions or
// contiguous); elsewhere the product is recomputed.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, ProductRole role);

// A product of x (..., in) by a weight of `out_features` rows that is not
// at::linear's (an FP8 linear: models/fp8.h), marked `role` as linear() marks
// at::linear. `product(rows, over)` gets x folded to rows (N, in) and returns
// (N, out) with its own autograd node: over null, computed; over non-null,
// the node rebuilt over *over (N, out) without running the product (a
// placeholder for kTail, the forward's output for kKept). The result has x's
// leading shape. role nullopt: an unmarked product (always computed).
using RowsProduct = std::function<at::Tensor(const at::Tensor& rows, const at::Tensor* over)>;
at::Tensor marked_product(const at::Tensor& x, int64_t out_features, std::optional<ProductRole> role,
                          const RowsProduct& product);

// A kKept product computed by the model's own autograd function (the fused
// q|k|v product, models/fused_products.h). `run(kept)` with `kept` undefined
// computes the product; with `kept` defined (a value run returned before) it
// gives `kept` the autograd node its computation would have had, without
// computing it. kSelective keeps run's result from the checkpointed forward
// (one tensor, counted once) and hands it back to run in the recompute;
// everywhere else this is run(undefined).
at::Tensor kept_product(const std::function<at::Tensor(const at::Tensor& kept)>& run);

// at::scaled_dot_product_attention(q, k, v, no mask, no dropout, causal,
// default scale, enable_gqa). kSelective keeps its output and the kernel's
// softmax statistics where the kernel LibTorch picks can be called on its own
// with its own backward node (the CPU's flash kernel); then the recompute runs
// no attention. Elsewhere (the math fallback, CUDA) it is recomputed.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa);

// ---- for the engine -------------------------------------------------------

// What one checkpointed forward kept (kSelective), in the order its marks ran.
struct KeptActivations {
  std::vector<at::Tensor> tensors;
  int64_t bytes() const;  // the sum of their sizes (distinct tensors, no view shares another's bytes)
};

// The marks on this thread follow `policy` while the scope lives. kForward
// (the checkpointed forward, grad mode off): kept outputs are appended to
// `kept`. kRecompute (backward's second forward, grad mode on): they are taken
// from `kept` in the same order. Scopes do not nest (a checkpointed unit holds
// no nested unit). `kept` must outlive the scope.
class RecomputeScope {
 public:
  enum class Phase { kForward, kRecompute };
  RecomputeScope(RecomputePolicy policy, Phase phase, KeptActivations* kept);
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

  // Internal error unless a recompute took every kept tensor (the forward and
  // its recompute ran the same marks).
  void check_all_replayed() const;

  RecomputePolicy policy() const { return policy_; }
  Phase phase() const { return phase_; }
  KeptActivations& kept() { return *kept_; }
  size_t next_kept = 0;  // kRecompute: the next tensor to take

 private:
  RecomputePolicy policy_;
  Phase phase_;
  KeptActivations* kept_;
};

}  // namespace fsdp::nn

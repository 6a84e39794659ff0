#include "fsdp/nn/recompute.h"

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include "fsdp/common/error.h"

namespace fsdp::nn {

// Note [Recompute policy]
// A checkpointed unit's backward runs its forward again only to rebuild the
// autograd graph: what backward reads are the tensors the graph's nodes save.
// A product y = x W^T saves x and W, never y. So under kTail a product whose
// output reaches the unit's output only through additions (the MLP's
// down_proj before the residual) has an output no node reads. The recompute
// does not run it: the output is a placeholder (one element, zero strides)
// given the very node LibTorch's mm would have made (MmBackward0, with the
// same saved inputs, sizes and strides), so backward runs the same kernels on
// the same values: gradients are bit for bit those of the full recompute, one
// product fewer per block.
// The graph a mark rebuilds is at::linear's own decomposition (at::matmul: an
// x of more than two dimensions folded into rows, mm, _unsafe_view back), so
// the nodes above and below the product are LibTorch's.
namespace {

thread_local RecomputeScope* t_scope = nullptr;

// Whether at::linear(x, weight, bias)'s graph is the one linear_over rebuilds:
// no bias (with one, at::linear takes addmm), and an x whose rows fold
// without a copy (at::matmul's should_fold).
bool markable(const at::Tensor& x, const at::Tensor& bias) {
  return !bias.defined() && x.layout() == at::kStrided && x.numel() > 0 &&
         (x.dim() == 2 || (x.dim() > 2 && x.is_contiguous()));
}

// The graph at::linear(x, weight) builds, with `product` (N, out) standing for
// its mm's output: a fresh tensor (no autograd history, no view) that gets
// MmBackward0 as VariableType's mm would have filled it.
at::Tensor linear_over(const at::Tensor& x, const at::Tensor& weight, at::Tensor product) {
  using namespace torch::autograd;
  const at::Tensor self = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  const at::Tensor mat2 = weight.t();
  if (compute_requires_grad(self, mat2)) {
    auto node = std::shared_ptr<generated::MmBackward0>(new generated::MmBackward0(), deleteNode);
    node->set_next_edges(collect_next_edges(self, mat2));
    if (node->should_compute_output(1)) node->self_ = SavedVariable(self, false);
    node->self_layout = self.layout();
    node->self_sym_sizes = self.sym_sizes().vec();
    node->self_sym_strides = self.sym_strides().vec();
    if (node->should_compute_output(0)) node->mat2_ = SavedVariable(mat2, false);
    node->mat2_layout = mat2.layout();
    node->mat2_sym_sizes = mat2.sym_sizes().vec();
    node->mat2_sym_strides = mat2.sym_strides().vec();
    set_history(product, node);
  }
  if (x.dim() == 2) return product;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(weight.size(0));
  return at::_unsafe_view(product, shape);
}

// A tensor of `shape` whose value nothing reads: one element, zero strides.
at::Tensor placeholder(at::IntArrayRef shape, const at::TensorOptions& options) {
  // Not empty_strided(...).zero_(): an in-place write refuses overlapping elements.
  const std::vector<int64_t> strides(shape.size(), 0);
  at::Tensor t = at::empty({0}, options);
  t.set_(at::zeros({1}, options).storage(), 0, shape, strides);
  return t;
}

}  // namespace

const char* to_string(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::kFull: return "full";
    case RecomputePolicy::kTail: return "tail";
  }
  return "?";
}

std::optional<RecomputePolicy> parse_recompute_policy(std::string_view name) {
  for (RecomputePolicy p : {RecomputePolicy::kFull, RecomputePolicy::kTail}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

RecomputeScope::RecomputeScope(RecomputePolicy policy, Phase phase) : policy_(policy), phase_(phase) {
  FSDP_ASSERT(t_scope == nullptr, "recompute scopes do not nest (a checkpointed unit holds no nested unit)");
  t_scope = this;
}

RecomputeScope::~RecomputeScope() { t_scope = nullptr; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, ProductRole role) {
  const RecomputeScope* s = t_scope;
  if (s == nullptr || s->policy() == RecomputePolicy::kFull || s->phase() != RecomputeScope::Phase::kRecompute ||
      role != ProductRole::kTail || !markable(x, bias)) {
    return at::linear(x, weight, bias);
  }
  return linear_over(x, weight, placeholder({x.numel() / x.size(-1), weight.size(0)}, x.options()));
}

}  // namespace fsdp::nn

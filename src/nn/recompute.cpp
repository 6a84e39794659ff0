#include "fsdp/nn/recompute.h"

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>

#include "fsdp/common/error.h"
#include "fsdp/nn/attention_backend.h"

namespace fsdp::nn {

// Note [Recompute policy]
// A checkpointed unit's backward runs its forward again only to rebuild the
// autograd graph: what backward reads are the tensors the graph's nodes save.
// A product y = x W^T saves x and W, never y. So:
//   - kTail: a product whose output reaches the unit's output only through
//     additions (the MLP's down_proj before the residual) has an output no
//     node reads. The recompute does not run it: the output is a placeholder
//     (one element, zero strides) given the very node LibTorch's mm would
//     have made (MmBackward0, with the same saved inputs, sizes and strides),
//     so backward runs the same kernels on the same values: gradients are bit
//     for bit those of the full recompute, one product fewer per block.
//   - kSelective: besides, products marked kKept keep their output from
//     forward (q, k, v and o of attention), and so does attention (its output
//     and the kernel's softmax statistics, logsumexp). The recompute gives the
//     kept values the nodes LibTorch would have made over them
//     (MmBackward0; ScaledDotProductFlashAttentionForCpuBackward0), so again
//     the same kernels run on the same values. What is left to recompute are
//     the norms, rotary and the MLP's first two products. The fused q|k|v
//     product (--kernels fused, models/fused_products.h) is kept whole, its
//     output one tensor (kept_product), and given its own node again over
//     the kept value.
// The graph a mark rebuilds is at::linear's own decomposition (at::matmul: an
// x of more than two dimensions folded into rows, mm, _unsafe_view back), so
// the nodes above and below the product are LibTorch's. The kept values are
// the forward's own tensors: nothing is copied.
//
// What LibTorch lets us keep: the CPU's flash attention kernel is an operator
// of its own with a backward operator of its own, callable from C++. The
// CUDA kernels (flash, memory-efficient, cuDNN) are too, but
// scaled_dot_product_attention pads and rescales around them per backend;
// until that wrapping is mirrored and checked on a GPU, CUDA attention is
// recomputed (its products are still kept). The math fallback saves its
// scores and probabilities: it is recomputed.
namespace {

thread_local RecomputeScope* t_scope = nullptr;

// SDPBackend::flash_attention in ATen's sdp_utils.
constexpr int64_t kFlashAttention = 1;

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

// The next kept tensor of a recompute (undefined: the forward kept none there).
at::Tensor take(RecomputeScope& scope, const char* what) {
  KeptActivations& kept = scope.kept();
  FSDP_ASSERT(scope.next_kept < kept.tensors.size(), "recompute: ", what, " asks for kept tensor ", scope.next_kept,
              " but the checkpointed forward kept ", kept.tensors.size(),
              " — the recompute ran other marks than the forward");
  return kept.tensors[scope.next_kept++];
}

bool keeps(const RecomputeScope* s) { return s != nullptr && s->policy() == RecomputePolicy::kSelective; }

}  // namespace

const char* to_string(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::kFull: return "full";
    case RecomputePolicy::kTail: return "tail";
    case RecomputePolicy::kSelective: return "selective";
  }
  return "?";
}

std::optional<RecomputePolicy> parse_recompute_policy(std::string_view name) {
  for (RecomputePolicy p : {RecomputePolicy::kFull, RecomputePolicy::kTail, RecomputePolicy::kSelective}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

int64_t KeptActivations::bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

RecomputeScope::RecomputeScope(RecomputePolicy policy, Phase phase, KeptActivations* kept)
    : policy_(policy), phase_(phase), kept_(kept) {
  FSDP_ASSERT(t_scope == nullptr, "recompute scopes do not nest (a checkpointed unit holds no nested unit)");
  FSDP_ASSERT(kept != nullptr, "RecomputeScope needs a KeptActivations");
  t_scope = this;
}

RecomputeScope::~RecomputeScope() { t_scope = nullptr; }

void RecomputeScope::check_all_replayed() const {
  FSDP_ASSERT(phase_ != Phase::kRecompute || next_kept == kept_->tensors.size(), "recompute took ", next_kept,
              " of the ", kept_->tensors.size(), " tensors its forward kept — the recompute ran other marks");
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, ProductRole role) {
  RecomputeScope* s = t_scope;
  if (s == nullptr || s->policy() == RecomputePolicy::kFull) return at::linear(x, weight, bias);
  const bool recompute = s->phase() == RecomputeScope::Phase::kRecompute;
  if (role == ProductRole::kTail) {
    if (!recompute || !markable(x, bias)) return at::linear(x, weight, bias);
    return linear_over(x, weight, placeholder({x.numel() / x.size(-1), weight.size(0)}, x.options()));
  }
  if (!keeps(s)) return at::linear(x, weight, bias);
  if (!recompute) {
    const at::Tensor y = at::linear(x, weight, bias);
    // The mm's output, as a tensor of its own (no view of y's): replayed below.
    s->kept().tensors.push_back(markable(x, bias) ? at::_unsafe_view(y, {x.numel() / x.size(-1), weight.size(0)})
                                                  : at::Tensor());
    return y;
  }
  const at::Tensor kept = take(*s, "a kept product");
  if (!kept.defined()) return at::linear(x, weight, bias);
  FSDP_ASSERT(markable(x, bias) && kept.size(0) == x.numel() / x.size(-1) && kept.size(1) == weight.size(0),
              "recompute: a kept product of ", kept.sizes(), " for x ", x.sizes(), " and weight ", weight.sizes());
  return linear_over(x, weight, kept.variable_data());
}

at::Tensor marked_product(const at::Tensor& x, int64_t out_features, std::optional<ProductRole> role,
                          const RowsProduct& product) {
  const at::Tensor rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  const auto shaped = [&](const at::Tensor& y) {
    if (x.dim() == 2) return y;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    shape.push_back(out_features);
    return y.view(shape);
  };
  const auto run = [&](const at::Tensor* over) { return shaped(product(rows, over)); };
  RecomputeScope* s = t_scope;
  if (!role || s == nullptr || s->policy() == RecomputePolicy::kFull || x.numel() == 0) return run(nullptr);
  const bool recompute = s->phase() == RecomputeScope::Phase::kRecompute;
  if (*role == ProductRole::kTail) {
    if (!recompute) return run(nullptr);
    const at::Tensor stand_in = placeholder({rows.size(0), out_features}, x.options());
    return run(&stand_in);
  }
  // kKept: the rows' product, kept as kept_product keeps any.
  return shaped(kept_product([&](const at::Tensor& kept) {
    if (!kept.defined()) return product(rows, nullptr);
    FSDP_ASSERT(kept.size(0) == rows.size(0) && kept.size(1) == out_features, "recompute: a kept product of ",
                kept.sizes(), " for x ", x.sizes(), " and ", out_features, " outputs");
    const at::Tensor value = kept.variable_data();
    return product(rows, &value);
  }));
}

at::Tensor kept_product(const std::function<at::Tensor(const at::Tensor& kept)>& run) {
  RecomputeScope* s = t_scope;
  if (!keeps(s)) return run(at::Tensor());
  if (s->phase() == RecomputeScope::Phase::kForward) {
    at::Tensor y = run(at::Tensor());
    s->kept().tensors.push_back(y);
    return y;
  }
  const at::Tensor kept = take(*s, "a kept product");
  FSDP_ASSERT(kept.defined(), "recompute: a kept product's forward kept nothing");
  return run(kept);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa) {
  note_attention_kernel(q, k, v, enable_gqa);  // the run's log names it
  RecomputeScope* s = t_scope;
  const auto plain = [&] {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/std::nullopt, enable_gqa);
  };
  if (!keeps(s)) return plain();
  if (s->phase() == RecomputeScope::Phase::kForward) {
    // scaled_dot_product_attention's CPU flash branch calls this operator with
    // these arguments and nothing around it (no padding, no mask to convert).
    const bool flash_cpu =
        q.is_cpu() && at::_fused_sdp_choice(q, k, v, {}, 0.0, true, std::nullopt, enable_gqa) == kFlashAttention;
    if (!flash_cpu) {
      s->kept().tensors.emplace_back();  // nothing kept: the recompute runs attention
      return plain();
    }
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, /*is_causal=*/true);
    s->kept().tensors.push_back(out);
    s->kept().tensors.push_back(lse);
    return out;
  }
  const at::Tensor out = take(*s, "attention");
  if (!out.defined()) return plain();
  const at::Tensor lse = take(*s, "attention's statistics");
  using namespace torch::autograd;
  at::Tensor result = out.variable_data();
  if (compute_requires_grad(q, k, v)) {
    // As VariableType fills it for _scaled_dot_product_flash_attention_for_cpu.
    auto node = std::shared_ptr<generated::ScaledDotProductFlashAttentionForCpuBackward0>(
        new generated::ScaledDotProductFlashAttentionForCpuBackward0(), deleteNode);
    node->set_next_edges(collect_next_edges(q, k, v));
    node->attn_mask_ = SavedVariable(at::Tensor(), false);
    node->dropout_p = 0.0;
    node->is_causal = true;
    node->key_ = SavedVariable(k, false);
    node->query_ = SavedVariable(q, false);
    node->scale = std::nullopt;
    node->value_ = SavedVariable(v, false);
    set_history(result, node);
    node->logsumexp_ = SavedVariable(lse, true);
    node->output_ = SavedVariable(result, true);
  }
  return result;
}

}  // namespace fsdp::nn

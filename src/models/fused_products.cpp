#include "fsdp/models/fused_products.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>

#include "fsdp/common/error.h"
#include "fsdp/nn/recompute.h"
#include "fp8_shared.h"

namespace fsdp::models {

// Note [Fused products over the flat parameter]
// Attention's q, k and v, and the MLP's gate and up, are products of one
// input with several weights. The FSDP engine makes each parameter a view
// into its unit's flat unsharded buffer, in registration order, so q_proj's,
// k_proj's and v_proj's weights are one (Hq + 2 Hkv) Dh x D matrix already,
// and gate_proj's and up_proj's one 2F x D matrix: a view spanning them
// (as_strided over the first weight's storage, no copy) turns three products
// into one with the same arithmetic — each output element is the same dot
// product over D — and larger operands, which a GPU's matmul runs nearer its
// peak. Backward is one product for the input's gradient (dy [Wq; Wk; Wv],
// summing over the three outputs inside the product instead of adding three
// (N, D) results) and one for the weights' (dy^T x, whose blocks of rows are
// each weight's gradient, views of one result).
//
// The node is a custom autograd Function taking the separate weights as
// inputs (so that each gets its gradient through its own AccumulateGrad and
// the engine's hooks) and building the span inside. It keeps the span, not
// the weights: like the weight's transpose that at::linear's MmBackward0
// saves, the span holds the real storage, which the engine empties after
// forward and refills before backward (Note [Refusing storage] in
// src/fsdp/flat_param.cpp) while the parameters themselves point elsewhere in
// between. The q|k|v product keeps its output under selective checkpointing
// (nn::kept_product): the recompute gives the kept output this node again.
//
// Elsewhere the separate products run, exactly as with the reference
// kernels: a model outside the engine (each weight its own storage), a LoRA
// adapter (its products add to the base's), some weights frozen and some
// not (the trainable ones' gradients would be computed for all), a bias on
// some but not all.
namespace {

std::atomic<int64_t> g_fused{0};
std::atomic<int64_t> g_separate{0};

// Whether `ts` lie back to back in one storage, each contiguous, of one
// dtype, device and trailing shape: then one view spans them.
bool back_to_back(const std::vector<at::Tensor>& ts) {
  if (ts.empty()) return false;
  const at::Tensor& first = ts.front();
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (!t.defined() || t.layout() != at::kStrided || t.is_meta() || !t.has_storage() || !t.is_contiguous() ||
        t.dim() != first.dim() || t.scalar_type() != first.scalar_type() || t.device() != first.device() ||
        t.sizes().slice(1) != first.sizes().slice(1)) {
      return false;
    }
    if (i == 0) continue;
    const at::Tensor& prev = ts[i - 1];
    if (t.storage().unsafeGetStorageImpl() != first.storage().unsafeGetStorageImpl() ||
        t.storage_offset() != prev.storage_offset() + prev.numel()) {
      return false;
    }
  }
  return true;
}

// One view over `ts` (back_to_back), concatenated along the first dimension.
at::Tensor span(at::TensorList ts) {
  const at::Tensor& first = ts.front();
  std::vector<int64_t> sizes = first.sizes().vec();
  for (size_t i = 1; i < ts.size(); ++i) sizes[0] += ts[i].size(0);
  return first.detach().as_strided(sizes, first.strides(), first.storage_offset());
}

// A kept value passed through apply as an argument that is not an input.
struct KeptValue {
  at::Tensor value;
};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedProductFn : torch::autograd::Function<FusedProductFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                            const KeptValue& kept) {
    const at::Tensor w = span(weights);
    std::vector<int64_t> rows;
    for (const at::Tensor& t : weights) rows.push_back(t.size(0));
    ctx->save_for_backward({x});
    ctx->saved_data["w"] = w;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["biases"] = static_cast<int64_t>(biases.size());
    if (kept.value.defined()) {
      FSDP_ASSERT(kept.value.dim() == x.dim() && kept.value.size(-1) == w.size(0) &&
                      kept.value.numel() / w.size(0) == x.numel() / x.size(-1),
                  "a kept fused product of ", kept.value.sizes(), " for x ", x.sizes(), " and weights ", w.sizes());
      return kept.value.variable_data();
    }
    return at::linear(x, w, biases.empty() ? at::Tensor() : span(biases));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const auto n = static_cast<int64_t>(rows.size());
    const int64_t n_biases = ctx->saved_data["biases"].toInt();
    // x, the weights, the biases, and the kept value (not an input: no gradient).
    variable_list out(static_cast<size_t>(1 + n + n_biases + 1));
    const at::Tensor dy = grads[0].reshape({-1, w.size(0)});  // (N, sum n_i)
    if (ctx->needs_input_grad(0)) out[0] = at::mm(dy, w).view(x.sizes());
    bool weights_need = false;
    for (int64_t i = 0; i < n; ++i) weights_need = weights_need || ctx->needs_input_grad(static_cast<size_t>(1 + i));
    if (weights_need) {
      const std::vector<at::Tensor> dw = at::mm(dy.t(), x.reshape({-1, x.size(-1)})).split_with_sizes(rows, 0);
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(1 + i)] = dw[static_cast<size_t>(i)];
    }
    if (n_biases > 0) {
      const std::vector<at::Tensor> db = dy.sum(0).split_with_sizes(rows, 0);
      for (int64_t i = 0; i < n_biases; ++i) out[static_cast<size_t>(1 + n + i)] = db[static_cast<size_t>(i)];
    }
    return out;
  }
};

}  // namespace

bool products_fusable(const std::vector<const LinearImpl*>& linears) {
  if (linears.size() < 2) return false;
  std::vector<at::Tensor> weights, biases;
  const bool grad = linears.front()->weight().requires_grad();
  for (const LinearImpl* l : linears) {
    // An FP8 linear's product is its own (_scaled_mm per weight): the separate forwards run.
    if (l->has_lora() || l->runs_fp8() || l->weight().requires_grad() != grad ||
        l->in_features() != linears.front()->in_features()) {
      return false;
    }
    weights.push_back(l->weight());
    if (l->bias().defined()) {
      if (l->bias().requires_grad() != grad) return false;
      biases.push_back(l->bias());
    }
  }
  if (!biases.empty() && (biases.size() != linears.size() || !back_to_back(biases) ||
                          biases.front().scalar_type() != weights.front().scalar_type())) {
    return false;
  }
  return back_to_back(weights) && weights.front().dim() == 2;
}

at::Tensor fused_product(const at::Tensor& x, at::TensorList weights, at::TensorList biases, const at::Tensor& kept) {
  FSDP_ASSERT(back_to_back(weights.vec()) && (biases.empty() || back_to_back(biases.vec())),
              "fused_product: the weights (and biases) must lie back to back in one storage");
  return FusedProductFn::apply(x, weights, biases, KeptValue{kept});
}

std::vector<at::Tensor> fused_linears(const at::Tensor& x, const std::vector<LinearImpl*>& linears, bool kept) {
  const std::vector<const LinearImpl*> view(linears.begin(), linears.end());
  const at::Tensor& w0 = linears.front()->weight();
  // An input the product would refuse gets the separate products' own error.
  if (!products_fusable(view) || x.scalar_type() != w0.scalar_type() || x.device() != w0.device() ||
      x.dim() < 1 || x.size(-1) != w0.size(1)) {
    g_separate.fetch_add(1, std::memory_order_relaxed);
    // FP8 linears among them quantize x once (Note [One quantization of a shared input]).
    const SharedFp8Input shared(x);
    std::vector<at::Tensor> out;
    for (LinearImpl* l : linears) out.push_back(kept ? l->forward_marked(x, nn::ProductRole::kKept) : l->forward(x));
    return out;
  }
  g_fused.fetch_add(1, std::memory_order_relaxed);
  std::vector<at::Tensor> weights, biases;
  std::vector<int64_t> rows;
  for (const LinearImpl* l : linears) {
    weights.push_back(l->weight());
    if (l->bias().defined()) biases.push_back(l->bias());
    rows.push_back(l->out_features());
  }
  at::Tensor y;
  if (kept && biases.empty()) {
    y = nn::kept_product([&](const at::Tensor& k) { return fused_product(x, weights, biases, k); });
  } else {
    y = fused_product(x, weights, biases);  // a biased product is recomputed, as at::linear's with a bias
  }
  return y.split_with_sizes(rows, -1);
}

FusedProductCounts fused_product_counts() {
  return {g_fused.load(std::memory_order_relaxed), g_separate.load(std::memory_order_relaxed)};
}

}  // namespace fsdp::models

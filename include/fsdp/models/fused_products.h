// Fused products of linears that share their input (--kernels fused):
// attention's q|k|v and the MLP's gate|up as one product each, over a view
// that spans their weights where those lie back to back — as the FSDP engine
// lays a unit's parameters out, views into one flat unsharded buffer in
// registration order (Note [Fused products over the flat parameter] in
// src/models/fused_products.cpp).
//
// The product is a function of the weights, not of LinearImpl's forward, so
// that another form of the product (an FP8 one) can take its place here; a
// linear whose forward is not the plain product must make
// products_fusable() false, and then its separate forward runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "fsdp/models/layers.h"

namespace fsdp::models {

// Whether fused_linears runs one product for `linears`: every weight 2-D of
// the same in_features, contiguous, of one dtype and device, each starting in
// the same storage where the one before ends (the registration order); biases
// all absent, or all present and back to back the same way; no LoRA adapter;
// all parameters requiring grad, or none; none running FP8 (LinearImpl::runs_fp8:
// --fp8-linear's products are one _scaled_mm per weight). Otherwise — weights each in storage
// of its own (a model outside the engine), a layout with gaps, an adapter,
// some but not all frozen, one bias without the others — the separate
// products run, exactly as with the reference kernels.
bool products_fusable(const std::vector<const LinearImpl*>& linears);

// The outputs of each linear for x (..., in) -> (..., out_i). Fusable: one
// product x [W_1; ...; W_n]^T (+ [b_1; ...; b_n]) over a view spanning the
// weights (no copy), split into views of its output; backward computes
// dx = dy [W_1; ...; W_n] and d[W_1; ...; W_n] = dy^T x (two products) and
// hands each weight its block of rows (fused_product). `kept`: the products
// are marked nn::ProductRole::kKept for activation checkpointing — fused and
// without bias, the one product's output is kept (nn::kept_product); fused
// with a bias it is recomputed, as a biased separate product is. Not
// fusable: each linear's own forward (forward_marked(x, kKept) when kept).
std::vector<at::Tensor> fused_linears(const at::Tensor& x, const std::vector<LinearImpl*>& linears, bool kept);

// The product itself: x (..., D) and weights (n_i, D) back to back in one
// storage (products_fusable's layout), biases likewise or empty ->
// (..., sum n_i), one autograd node whose gradients reach x, every weight and
// every bias. `kept` defined: a value this function returned before for the
// same inputs, given the node without computing the product (activation
// checkpointing's recompute). Internal error when the layout is not one span.
at::Tensor fused_product(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                         const at::Tensor& kept = at::Tensor());

// How many times fused_linears ran one product, and how many times it fell
// back to separate ones, in this process (for tests and diagnostics).
struct FusedProductCounts {
  int64_t fused = 0;
  int64_t separate = 0;
};
FusedProductCounts fused_product_counts();

}  // namespace fsdp::models

// FP8 rowwise linears (fsdp-train --fp8-linear rowwise): the e4m3 quantizer
// and a linear y = x W^T whose products run in FP8 (Note [FP8 rowwise
// linears] in src/models/fp8.cpp).
//
// Recipe: torchao's `rowwise_with_gw_hp`. Forward quantizes x per row (per
// token) and W per row (per output feature) and multiplies with the two scale
// vectors applied to the product; backward's grad_input = dy W with dy per row
// and W per column (rowwise of W^T); grad_weight = dy^T x in the compute dtype
// (high precision, no FP8). On CUDA the products are at::_scaled_mm (Hopper's
// rowwise-scaled FP8 GEMM, bf16 output); on the CPU (and on CUDA builds
// without a GPU) the same arithmetic is emulated: the e4m3 values times their
// scales in fp32, an fp32 product, rounded to bf16 — the CPU twin.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace fsdp::models {

// The decoder's products in the compute dtype, or in FP8 (the head, the
// embedding and the norms stay in the compute dtype either way).
enum class Fp8Linear {
  kOff,      // every product in the compute dtype
  kRowwise,  // rowwise-scaled e4m3 products (the recipe above)
};
const char* to_string(Fp8Linear mode);  // "off" | "rowwise"
// nullopt for any other name.
std::optional<Fp8Linear> parse_fp8_linear(const std::string& name);

// The largest finite float8_e4m3fn value.
constexpr float kE4m3Max = 448.0f;
// The smallest amax a scale is computed from (torchao's EPS): a row of zeros
// or of tiny values gets a finite scale 448 / 1e-12 instead of inf.
constexpr float kFp8AmaxEps = 1e-12f;

// x cast to float8_e4m3fn with round-to-nearest-even, saturating: values
// beyond +-448 (infinities included) become +-448. NaN stays NaN. LibTorch's
// own cast does not saturate (see the Note): this clamps first.
at::Tensor cast_to_e4m3(const at::Tensor& x);

// A matrix quantized per row: data (M, K) float8_e4m3fn and inv_scale (M, 1)
// fp32, so that row i is approximately data[i] * inv_scale[i].
struct Fp8Rows {
  at::Tensor data;
  at::Tensor inv_scale;
};

// x (M, K) of any floating dtype: per row amax = max |x| (in fp32, at least
// kFp8AmaxEps), scale = 448 / amax, data = cast_to_e4m3(x * scale),
// inv_scale = 1 / scale. The largest value of each row maps to +-448.
Fp8Rows quantize_rowwise(const at::Tensor& x);

// data * inv_scale in fp32, (M, K).
at::Tensor dequantize_rowwise(const Fp8Rows& q);

// a (M, K) and b (N, K), both quantized per row: (M, N) = deq(a) deq(b)^T,
// rounded to bf16, returned in `out_dtype`. CUDA tensors in a CUDA build:
// at::_scaled_mm with rowwise scales (fast accumulation as asked); else the
// emulated product (fp32 accumulation). K and N must be multiples of 16
// (what _scaled_mm requires; fp8_linear_applies checks it).
at::Tensor scaled_mm_rowwise(const Fp8Rows& a, const Fp8Rows& b, at::ScalarType out_dtype, bool fast_accum);

// Whether a linear of these sizes can run in FP8 (both multiples of 16).
bool fp8_linear_applies(int64_t in_features, int64_t out_features);

// x (N, in) times weight (out, in)^T as the recipe above, differentiable in x
// and weight; result (N, out) in x's dtype. `over` non-null (a recompute that
// rebuilds the graph without running the product, nn::marked_product): the
// result is *over, with this product's backward node.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor* over = nullptr);

}  // namespace fsdp::models

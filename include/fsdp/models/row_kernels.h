// Kernels that reduce along a row and then write it (Note [Row kernels] in
// src/models/row_kernels.cpp): the fused cross-entropy of a chunk of logits
// and the rowwise FP8 quantizer, each one launch over the rows on CUDA (NVRTC
// at run time), and its CPU twin elsewhere.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {

// Whether the row kernels take a matrix like `t`: 2-d, contiguous, fp32 or
// bf16, on the CPU or CUDA. The callers run their composites for the rest.
bool row_kernels_take(const at::Tensor& t);

// For each row i of `logits` (c, V), -log softmax(logits_i)[target_i] in fp32
// (c): one online-softmax pass gives the row's maximum m and sum s of
// exp(x - m) (in fp32), and the loss is (m - x[t]) + log s. With `scale` (c)
// fp32 defined, then writes the gradient over the row: (softmax -
// onehot(target)) x scale_i, softmax as exp(x - m) x (1 / s), formed in fp32
// and rounded once to the dtype. Each row is read twice and
// written once. Requires: row_kernels_take(logits); target (c) int64 in
// [0, V), contiguous; scale undefined or (c) fp32 contiguous, on one device.
at::Tensor online_softmax_cross_entropy(at::Tensor& logits, const at::Tensor& target, const at::Tensor& scale);

// Rowwise e4m3 quantization of x (M, K): data (M, K) float8_e4m3fn,
// row-major, and inv_scale (M, 1) fp32, bit for bit what
// models::quantize_rowwise's composite gives (a NaN's sign aside) (amax of |x| per row in fp32,
// at least kFp8AmaxEps; scale = (1 / amax) x 448; x x scale clamped to
// +-448, rounded to nearest even; inv_scale = 1 / scale), in one pass that
// reads each row twice and writes it once. Requires: row_kernels_take(x).
std::pair<at::Tensor, at::Tensor> quantize_rows_e4m3(const at::Tensor& x);

// The whole CUDA program the row kernels are launched from (what NVRTC
// compiles on a CUDA run and, for sm_90, in CI), and its entry points.
const std::string& row_kernels_program();
const std::vector<std::string>& row_kernel_entry_points();

// The CPU twin's e4m3 and bf16 roundings of one fp32 value (the kernels'
// own), for tests against c10's conversions.
uint8_t row_kernels_e4m3_bits(float f);
uint16_t row_kernels_bf16_bits(float f);

}  // namespace fsdp::models

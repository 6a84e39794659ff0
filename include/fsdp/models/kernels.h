// Fused elementwise kernels of the layers (--kernels fused), each with a CPU
// twin of its arithmetic (Note [Kernels and their CPU twins] in
// src/models/kernels.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp::models {

// silu(gate) * up, differentiable: forward and backward are one elementwise
// kernel each (gate and up's gradients from one read of dout, gate and up),
// computed in fp32 and rounded once to the inputs' dtype, where the reference
// (at::silu(gate) * up) rounds silu's output first. fp32: within rounding of
// the reference. Requires: gate and up of one shape, dtype and device.
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

// Hugging Face's apply_rotary_pos_emb on one tensor, x * cos +
// rotate_half(x) * sin (the pair of element j is element j + Dh/2), as one
// elementwise kernel over (..., 2, Dh/2): no copy of x first, whatever its
// strides. The result's layout follows x's (TensorIterator's rule, as for the
// reference's x * cos): for the attention's (B, T, n, Dh) projection seen as
// (B, n, T, Dh) it is the reference's, which SDPA reads without a copy.
// Differentiable in x: the gradient is the transpose rotation
// (dout * cos + rotate_half^T(dout * sin)), one kernel, laid out as dout.
// Computed in fp32 and rounded once to the dtype, where the reference rounds
// each product and the sum: fp32 within rounding of the reference, bf16 within
// one rounding. Requires: x (..., T, Dh) with Dh even; cos and sin (T, Dh),
// broadcast over the leading dimensions, not requiring grad (they get none).
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// One kernel's functor, as the jiterator compiles it on CUDA (NVRTC, at run
// time) and CI compiles it for sm_90 (tests/models/test_kernels_nvrtc.cpp):
// `template <typename T> T name(T a, T b, ...)` with `arity` arguments.
struct KernelSource {
  const char* name;
  const char* code;
  int arity;
};
// Every kernel of this file.
const std::vector<KernelSource>& kernel_sources();

}  // namespace fsdp::models

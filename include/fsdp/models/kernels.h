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

#include "fsdp/models/kernels.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cmath>
#include <utility>

#if defined(FSDP_WITH_CUDA)
#include <ATen/cuda/jiterator.h>
#endif

#include "fsdp/common/error.h"
#include "twin.h"

namespace fsdp::models {

// Note [Kernels and their CPU twins]
// Each fused kernel's arithmetic is written once, as a functor template
// `T name(T...)` that computes in fp32 and rounds once to T. FSDP_TWIN both
// compiles it here (the CPU twin: instantiated for float over the inputs
// widened to fp32, the result rounded to the dtype once, as the kernel's
// static_cast<T> does) and keeps its text, which on CUDA the jiterator compiles
// with NVRTC at run time (at::cuda::CompileAndLaunchKernel: LibTorch's
// TensorIterator launch, so broadcasting, strides and dtypes are handled as
// for its own kernels). The twin runs over a TensorIterator configured as the
// jiterator's, so its output has the shape, dtype and layout the GPU's has
// (rotary relies on it: its inputs are broadcast views, and its output's
// layout is the one SDPA is given). No nvcc and no .cu files: the CPU build
// runs the very arithmetic the GPU runs (to the last bit of fp32's exp, which
// the devices' libraries round differently), and CI compiles every text for
// sm_90 with the wheel's NVRTC (tests/models/test_kernels_nvrtc.cpp), so a
// kernel that does not compile fails CI, not the GPU call.
// FSDP_TWIN is src/models/twin.h's.

namespace twin {

// silu(g) * u = g * sigmoid(g) * u.
FSDP_TWIN(swiglu_forward, template <typename T> T swiglu_forward(T g, T u) {
  const float x = static_cast<float>(g);
  return static_cast<T>(x / (1.0f + expf(-x)) * static_cast<float>(u));
})

// d/dg: dout * u * s * (1 + g * (1 - s)), s = sigmoid(g).
FSDP_TWIN(swiglu_backward_gate, template <typename T> T swiglu_backward_gate(T dout, T g, T u) {
  const float x = static_cast<float>(g);
  const float s = 1.0f / (1.0f + expf(-x));
  return static_cast<T>(static_cast<float>(dout) * static_cast<float>(u) * s * (1.0f + x * (1.0f - s)));
})

// d/du: dout * silu(g).
FSDP_TWIN(swiglu_backward_up, template <typename T> T swiglu_backward_up(T dout, T g) {
  const float x = static_cast<float>(g);
  return static_cast<T>(static_cast<float>(dout) * x / (1.0f + expf(-x)));
})

// Rotary (Hugging Face's x * cos + rotate_half(x) * sin) on one element of
// the view (..., 2, Dh/2) of x: x1 and x2 the element's pair (x[j] and
// x[j + Dh/2]), c and s the tables at the element, `second` 1 in the second
// half and 0 in the first: (x1 c - x2 s) in the first half, (x2 c + x1 s) in
// the second. The products and the sum in the reference's order.
FSDP_TWIN(rotary_forward, template <typename T> T rotary_forward(T x1, T x2, T c, T s, T second) {
  const float a = static_cast<float>(x1), b = static_cast<float>(x2);
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  return static_cast<T>(static_cast<float>(second) != 0.0f ? b * cf + a * sf : a * cf - b * sf);
})

// Its gradient, the transpose rotation: g1, g2 the pair of dout, c the cos
// table at the element, s1 and s2 the sin table at the pair's first and
// second place: (g1 c + g2 s2) in the first half, (g2 c - g1 s1) in the second.
FSDP_TWIN(rotary_backward, template <typename T> T rotary_backward(T g1, T g2, T c, T s1, T s2, T second) {
  const float a = static_cast<float>(g1), b = static_cast<float>(g2), cf = static_cast<float>(c);
  return static_cast<T>(static_cast<float>(second) != 0.0f ? b * cf - a * static_cast<float>(s1)
                                                           : a * cf + b * static_cast<float>(s2));
})

}  // namespace twin

const std::vector<KernelSource>& kernel_sources() {
  static const std::vector<KernelSource> sources = {
      {"swiglu_forward", twin::swiglu_forward_code, 2},
      {"swiglu_backward_gate", twin::swiglu_backward_gate_code, 3},
      {"swiglu_backward_up", twin::swiglu_backward_up_code, 2},
      {"rotary_forward", twin::rotary_forward_code, 5},
      {"rotary_backward", twin::rotary_backward_code, 6},
  };
  return sources;
}

namespace {

// The CPU twin: f<float> over the broadcast inputs widened to fp32, rounded
// once to the dtype, over a TensorIterator built as CompileAndLaunchKernel
// builds the jiterator's (Note [Kernels and their CPU twins]).
template <size_t N, class F, size_t... I>
at::Tensor host_map(F f, const std::array<at::Tensor, N>& ins, std::index_sequence<I...>) {
  at::TensorIteratorConfig config;
  config.set_check_mem_overlap(true)
      .allow_cpu_scalars(false)
      .promote_inputs_to_common_dtype(true)
      .cast_common_dtype_to_outputs(true)
      .enforce_safe_casting_to_output(true)
      .check_all_same_device(true);
  config.add_owned_output(at::Tensor());
  for (const auto& t : ins) config.add_const_input(t);
  at::TensorIterator iter = config.build();
  constexpr size_t kTensors = N + 1;  // the output first
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, iter.common_dtype(), "kernel twin", [&] {
    iter.for_each(
        [&](char** data, const int64_t* strides, int64_t n0, int64_t n1) {
          for (int64_t i1 = 0; i1 < n1; ++i1) {
            for (int64_t i0 = 0; i0 < n0; ++i0) {
              const auto ptr = [&](size_t k) { return data[k] + i0 * strides[k] + i1 * strides[kTensors + k]; };
              *reinterpret_cast<scalar_t*>(ptr(0)) = static_cast<scalar_t>(
                  f(static_cast<float>(*reinterpret_cast<const scalar_t*>(ptr(I + 1)))...));
            }
          }
        },
        /*grain_size=*/1 << 14);
  });
  return iter.output(0);
}

// `source` on the inputs' device: the jiterator on CUDA, the CPU twin `f`
// elsewhere. The inputs broadcast (TensorIterator's rules) and are promoted
// to their common dtype, the output's.
template <size_t N, class F>
at::Tensor run(const KernelSource& source, F f, const std::array<at::Tensor, N>& ins) {
  for (const auto& t : ins) {
    FSDP_ASSERT(t.device() == ins[0].device(), "kernel ", source.name, ": inputs on one device, got ", t.device(),
                " beside ", ins[0].device());
  }
  if (ins[0].is_cuda()) {
#if defined(FSDP_WITH_CUDA)
    const c10::SmallVector<at::Tensor> tensors(ins.begin(), ins.end());
    return at::cuda::CompileAndLaunchKernel(source.code, source.name, /*num_outputs=*/1, tensors, {},
                                            /*return_by_ref=*/false)[0];
#else
    FSDP_CHECK(false, "kernel ", source.name, " on ", ins[0].device(),
               ": this build has no CUDA (configure with -DFSDP_WITH_CUDA=ON)");
#endif
  }
  return host_map<N>(f, ins, std::make_index_sequence<N>{});
}

const KernelSource& source(const char* name) {
  for (const auto& s : kernel_sources()) {
    if (std::string(s.name) == name) return s;
  }
  FSDP_ASSERT(false, "no kernel source named ", name);
  return kernel_sources().front();
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return run<2>(source("swiglu_forward"), twin::swiglu_forward<float>, {gate, up});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor dout = grads[0].contiguous(), gate = saved[0], up = saved[1];
    at::Tensor dgate, dup;
    if (ctx->needs_input_grad(0)) {
      dgate = run<3>(source("swiglu_backward_gate"), twin::swiglu_backward_gate<float>, {dout, gate, up});
    }
    if (ctx->needs_input_grad(1)) dup = run<2>(source("swiglu_backward_up"), twin::swiglu_backward_up<float>, {dout, gate});
    return {dgate, dup};
  }
};

// Note [Rotary as one elementwise kernel]
// Element j of rotary's output reads x at j and at its pair j +- Dh/2, which
// no strided view of x gives one elementwise kernel (it would need a negative
// stride). Over the view (..., 2, Dh/2) of the output the kernel instead
// reads both halves of x, each broadcast over the pair's dimension, and a
// (2, 1) tensor saying which half the element is in. Every input is a view:
// x is read where the projection wrote it, and TensorIterator lays the output
// out as x (the pair's dimension, broadcast in all but the (2, 1) tensor,
// keeps its place beside the last), so (..., 2, Dh/2) folds back into
// (..., Dh) without a copy — where x's last dimension is its innermost, as
// every caller's (the projections', SDPA's gradient); elsewhere reshape copies.

// t (..., Dh) as (..., 2, Dh/2).
at::Tensor pairs(const at::Tensor& t) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end() - 1);
  shape.push_back(2);
  shape.push_back(t.size(-1) / 2);
  return t.view(shape);
}

// t's first (k = 0) or second (k = 1) half, (..., 1, Dh/2): broadcast over the pair.
at::Tensor half(const at::Tensor& t, int64_t k) {
  const int64_t h = t.size(-1) / 2;
  return t.narrow(-1, k * h, h).unsqueeze(-2);
}

// (2, 1): 0 for the first half, 1 for the second.
at::Tensor second_half(const at::Tensor& like) { return at::arange(2, like.options()).view({2, 1}); }

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return run<5>(source("rotary_forward"), twin::rotary_forward<float>,
                  {half(x, 0), half(x, 1), pairs(cos), pairs(sin), second_half(x)})
        .reshape(x.sizes());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& dout = grads[0];
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const at::Tensor dx = run<6>(source("rotary_backward"), twin::rotary_backward<float>,
                                 {half(dout, 0), half(dout, 1), pairs(cos), half(sin, 0), half(sin, 1),
                                  second_half(dout)})
                              .reshape(dout.sizes());
    return {dx, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) { return SwigluFn::apply(gate, up); }

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  FSDP_ASSERT(x.dim() >= 2 && x.size(-1) % 2 == 0 && cos.dim() == 2 && cos.sizes() == sin.sizes() &&
                  cos.size(0) == x.size(-2) && cos.size(1) == x.size(-1),
              "fused_rotary: x (..., T, Dh) with Dh even and cos, sin (T, Dh), got x ", x.sizes(), ", cos ",
              cos.sizes(), ", sin ", sin.sizes());
  FSDP_ASSERT(!cos.requires_grad() && !sin.requires_grad(),
              "fused_rotary: the cos and sin tables get no gradient, yet one requires it");
  return RotaryFn::apply(x, cos, sin);
}

}  // namespace fsdp::models

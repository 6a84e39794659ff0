#include "fsdp/models/fp8.h"

#include <torch/csrc/autograd/custom_function.h>

#include "fsdp/common/error.h"
#include "fsdp/models/row_kernels.h"
#include "fp8_shared.h"

namespace fsdp::models {

// Note [FP8 rowwise linears]
// A product y = x W^T in FP8 keeps one scale per row of each operand: x's per
// token, W's per output feature. Rowwise scales follow outliers more closely
// than one scale per tensor, and Hopper's _scaled_mm applies them inside the
// GEMM's epilogue (the product of row i and column j times sa[i] * sb[j]), so
// they cost nothing beyond the quantization itself.
//
// Quantization, as torchao's float8 training: amax per row in fp32, clamped
// below at 1e-12 (a zero row gets a finite scale, its values stay 0), scale =
// 448 / amax, values times scale clamped to +-448 and cast to e4m3 with
// round-to-nearest-even. The clamp is needed: LibTorch's float -> e4m3fn cast
// (c10's fp8e4m3fn_from_fp32_value, the same code on the CPU and in CUDA
// kernels) does not saturate — magnitudes above 464 (the midpoint between
// 448 and the first unrepresentable 480) become NaN (0x7F), and 448 * scale
// rounded in fp32 may land a hair above 448. tests/models/test_fp8.cpp shows
// both.
//
// Backward, torchao's `rowwise_with_gw_hp`: grad_input = dy W is an FP8
// product again (dy per row, W per column: W^T's rows), grad_weight = dy^T x
// runs in the compute dtype, because a weight gradient quantized per row of
// dy^T (per output feature, across tokens) loses the small per-token
// contributions that accumulate into it. x and W are saved in the compute
// dtype (what a plain linear saves) and quantized again in backward.
//
// The CPU twin: dequantize both operands (e4m3 values times the inverse
// scales, exact in fp32), multiply in fp32, round the result to bf16 (the
// output _scaled_mm gives), then to the output dtype. It differs from the GPU
// only in the fp32 accumulation order. The quantizer of an fp32 or bf16
// operand is one kernel (amax, scale and cast: Note [Row kernels] in
// row_kernels.cpp), launched on CUDA, its twin on the CPU, with the
// composite's bits; other dtypes take the composite. The transposed operand
// of backward (W's columns) is still a LibTorch copy first.

const char* to_string(Fp8Linear mode) { return mode == Fp8Linear::kRowwise ? "rowwise" : "off"; }

std::optional<Fp8Linear> parse_fp8_linear(const std::string& name) {
  for (Fp8Linear m : {Fp8Linear::kOff, Fp8Linear::kRowwise}) {
    if (name == to_string(m)) return m;
  }
  return std::nullopt;
}

at::Tensor cast_to_e4m3(const at::Tensor& x) {
  return x.to(at::kFloat).clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn);
}

Fp8Rows quantize_rowwise(const at::Tensor& x) {
  FSDP_ASSERT(x.dim() == 2 && x.is_floating_point(), "quantize_rowwise of a ", x.dim(), "-d ", x.scalar_type(),
              " tensor (expected a 2-d floating matrix)");
  // Row-major data whatever x's strides: _scaled_mm takes its first operand
  // row-major and the second's rows transposed (column-major).
  const at::Tensor rows = x.contiguous();
  // fp32 and bf16: one kernel (Note [Row kernels]), the composite's bits.
  if (row_kernels_take(rows)) {
    auto [data, inv_scale] = quantize_rows_e4m3(rows);
    return {data, inv_scale};
  }
  const at::Tensor x32 = rows.to(at::kFloat);
  const at::Tensor amax = x32.abs().amax(/*dim=*/1, /*keepdim=*/true).clamp_min(kFp8AmaxEps);
  const at::Tensor scale = at::reciprocal(amax).mul_(kE4m3Max);
  return {cast_to_e4m3(x32 * scale), at::reciprocal(scale)};
}

at::Tensor dequantize_rowwise(const Fp8Rows& q) { return q.data.to(at::kFloat) * q.inv_scale; }

at::Tensor scaled_mm_rowwise(const Fp8Rows& a, const Fp8Rows& b, at::ScalarType out_dtype, bool fast_accum) {
  FSDP_ASSERT(a.data.size(1) == b.data.size(1), "scaled_mm_rowwise of (", a.data.sizes(), ") and (",
              b.data.sizes(), ")^T: inner sizes differ");
  if (a.data.is_cuda()) {
#if defined(FSDP_WITH_CUDA)
    // Rowwise scaling: scale_a (M, 1), scale_b (1, N), fp32; the second
    // operand column-major, which b's rows transposed are; bf16 out (the
    // only output rowwise _scaled_mm supports on sm_90).
    const at::Tensor y =
        at::_scaled_mm(a.data, b.data.t(), a.inv_scale, b.inv_scale.view({1, -1}), /*bias=*/std::nullopt,
                       /*scale_result=*/std::nullopt, at::kBFloat16, fast_accum);
    return y.to(out_dtype);
#else
    FSDP_CHECK(false, "an FP8 linear on ", a.data.device(),
               ": this build has no CUDA (configure with -DFSDP_WITH_CUDA=ON)");
#endif
  }
  (void)fast_accum;  // the emulation always accumulates in fp32
  return at::mm(dequantize_rowwise(a), dequantize_rowwise(b).t()).to(at::kBFloat16).to(out_dtype);
}

bool fp8_linear_applies(int64_t in_features, int64_t out_features) {
  return in_features % 16 == 0 && out_features % 16 == 0;
}

// Note [One quantization of a shared input]
// Attention's q, k and v read one input, and so do the MLP's gate and up;
// without the fused product (FP8 linears run apart, Note [Fused products over
// the flat parameter]) each would quantize it again. fused_linears opens a
// SharedFp8Input over the input for its separate products, and each FP8
// forward asks it: the first quantizes the rows, the next reuse them while
// the values are the same (storage, offset, sizes, strides and the version
// counter, which an in-place change bumps). The quantization lives until the
// scope closes, after the last of its products: no more than the one it
// replaces held. Backward's operands (d y, W^T) differ per product.
namespace {

thread_local SharedFp8Input* t_shared_input = nullptr;
thread_local int64_t t_reused = 0;

bool same_values(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

}  // namespace

SharedFp8Input::SharedFp8Input(const at::Tensor& x)
    : rows_(x.dim() == 2 ? x : x.reshape({-1, x.size(-1)})), version_(x._version()), outer_(t_shared_input) {
  t_shared_input = this;
}

SharedFp8Input::~SharedFp8Input() { t_shared_input = outer_; }

Fp8Rows SharedFp8Input::quantize(const at::Tensor& rows) {
  SharedFp8Input* s = t_shared_input;
  if (s == nullptr || !same_values(rows, s->rows_) || rows._version() != s->version_) return quantize_rowwise(rows);
  if (s->q_) {
    ++t_reused;
    return *s->q_;
  }
  s->q_ = quantize_rowwise(rows);
  return *s->q_;
}

int64_t SharedFp8Input::reused() { return t_reused; }

namespace {

struct Fp8LinearFn : torch::autograd::Function<Fp8LinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor* over) {
    ctx->save_for_backward({x, weight});
    if (over != nullptr) return *over;
    // Forward: torchao's output GEMM uses fast accumulation.
    return scaled_mm_rowwise(SharedFp8Input::quantize(x), quantize_rowwise(weight), x.scalar_type(),
                             /*fast_accum=*/true);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = scaled_mm_rowwise(quantize_rowwise(dy), quantize_rowwise(weight.t().contiguous()), x.scalar_type(),
                             /*fast_accum=*/false);
    }
    if (ctx->needs_input_grad(1)) dw = at::mm(dy.t().to(x.scalar_type()), x).to(weight.scalar_type());
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor* over) {
  FSDP_ASSERT(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "fp8_linear of x ", x.sizes(),
              " and weight ", weight.sizes());
  FSDP_ASSERT(fp8_linear_applies(weight.size(1), weight.size(0)), "fp8_linear of a ", weight.sizes(),
              " weight: both sizes must be multiples of 16");
  return Fp8LinearFn::apply(x, weight, over);
}

}  // namespace fsdp::models

#include "fsdp/models/chunked_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

#include "fsdp/common/error.h"
#include "fsdp/models/row_kernels.h"

namespace fsdp::models {

int64_t default_loss_chunk_rows(int64_t vocab_size, at::DeviceType device) {
  FSDP_ASSERT(vocab_size >= 1, "vocab_size ", vocab_size);
  int64_t rows = 16;
  if (device == at::kCUDA) {
    constexpr int64_t kBytesPerLogit = 2 * 2 + 3 * 4;  // chunked_loss_bytes' per-row part in bf16
    while (rows * 2 * vocab_size * kBytesPerLogit <= kCudaLossChunkBytes) rows *= 2;
    return rows;
  }
  constexpr int64_t kElements = int64_t{1} << 24;  // 64 MiB of fp32 logits
  while (rows * 2 * vocab_size <= kElements) rows *= 2;
  return rows;
}

int64_t loss_chunk_rows(int64_t asked, int64_t vocab_size, at::DeviceType device) {
  return asked > 0 ? asked : default_loss_chunk_rows(vocab_size, device);
}

int64_t chunked_loss_bytes(int64_t rows, int64_t vocab_size, int64_t hidden_size, at::ScalarType dtype,
                           LayerKernels kernels) {
  const auto elem = static_cast<double>(c10::elementSize(dtype));
  const bool reduced = dtype != at::kFloat && dtype != at::kDouble;  // the weight's gradient summed in fp32
  // Note [Fused cross-entropy]: the fused path has no fp32 (c, V) buffer of its own.
  const double fp32_buffers = kernels == LayerKernels::kFused ? 0 : 3 * 4;
  const double per_logit = 2 * elem + fp32_buffers + (reduced ? 4 : 0);
  const double weight = elem + (reduced ? 2 * 4 : 0);
  double bytes = static_cast<double>(rows) * static_cast<double>(vocab_size) * per_logit +
                 static_cast<double>(vocab_size) * static_cast<double>(hidden_size) * weight;
  // Backward: the weight's saved gradient and its product by the upstream
  // gradient, (V, D) each in `dtype`, both paths alike. In fp32 at a small
  // chunk this is the larger moment (forward holds one (V, D) and the chunk).
  bytes = std::max(bytes, 2 * elem * static_cast<double>(vocab_size) * static_cast<double>(hidden_size));
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max() / 4);  // saturate: no overflow
  return static_cast<int64_t>(std::min(bytes, kMax));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's logits in the compute dtype: h W^T (+ (u B^T) * s).
// `u` undefined: no low-rank term.
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& u, const at::Tensor& b,
                        double scaling) {
  at::Tensor logits = at::mm(h, weight.t());  // (c, V)
  if (u.defined()) logits = logits + at::mm(u, b.t()) * scaling;
  return logits;
}

// Whether the (u, b) arguments hold a low-rank term (else empty placeholders).
bool has_low_rank(const at::Tensor& u) { return u.dim() == 2; }

// A sum over chunks of products lhs^T rhs (the weight's gradient (V, D),
// B's (V, r)), in fp32 whatever the inputs' dtype, rounded to `dtype` once,
// by result(). Below fp32 each product is formed in fp32 (CUDA: the bf16/fp16
// matrix product with an fp32 output; CPU: of fp32 copies) and added.
class Fp32Sum {
 public:
  Fp32Sum() = default;
  explicit Fp32Sum(const at::Tensor& like) : options_(like.options()), shape_(like.sizes().vec()) {}
  bool defined() const { return !shape_.empty(); }
  void add_product(const at::Tensor& lhs, const at::Tensor& rhs) {  // += lhs^T rhs
    const at::Tensor l = lhs.t();
    if (!at::isReducedFloatingType(options_.dtype().toScalarType())) {
      if (!sum_.defined()) sum_ = at::zeros(shape_, lhs.options());
      sum_.addmm_(l, rhs);
      return;
    }
    if (!sum_.defined()) {
      sum_ = product(l, rhs);
    } else {
      sum_.add_(product(l, rhs));
    }
  }
  at::Tensor result() const { return sum_.defined() ? sum_.to(options_.dtype()) : at::zeros(shape_, options_); }

 private:
  static at::Tensor product(const at::Tensor& l, const at::Tensor& r) {
    if (l.is_cuda()) return at::mm(l, r, at::kFloat);  // fp32 accumulation and output, no copy of the inputs
    return at::mm(l.to(at::kFloat), r.to(at::kFloat));  // the CPU has no bf16 x bf16 -> fp32 product
  }
  at::TensorOptions options_;  // the result's
  std::vector<int64_t> shape_;
  at::Tensor sum_;  // fp32 (the dtype's own above it), undefined before the first chunk
};

// The gradients of the inputs, summed chunk by chunk (undefined where not needed).
struct Gradients {
  at::Tensor hidden, u;
  Fp32Sum weight, b;
  Gradients(const at::Tensor& h, const at::Tensor& w, const at::Tensor& u_in, const at::Tensor& b_in, bool need_h,
            bool need_w, bool need_u, bool need_b)
      : hidden(need_h ? at::empty_like(h) : at::Tensor()),
        u(need_u ? at::empty_like(u_in) : at::Tensor()),
        weight(need_w ? Fp32Sum(w) : Fp32Sum()),
        b(need_b ? Fp32Sum(b_in) : Fp32Sum()) {}

  // One chunk (rows r0 .. r0 + c): its log-softmax `logp` (fp32) and the
  // targets' gradient of nll_loss give d loss / d logits, multiplied into the sums.
  void add_chunk(const at::Tensor& logp, const at::Tensor& safe, const at::Tensor& target_grad, int64_t r0, int64_t c,
                 const at::Tensor& h, const at::Tensor& w, const at::Tensor& u_c, const at::Tensor& b_all,
                 double scaling) {
    at::Tensor gc;  // d loss / d logits of this chunk, the compute dtype
    {
      at::Tensor grad_logp = at::zeros_like(logp);
      grad_logp.scatter_(1, safe.narrow(0, r0, c).unsqueeze(1), target_grad.narrow(0, r0, c));
      gc = at::_log_softmax_backward_data(grad_logp, logp, 1, at::kFloat).to(h.scalar_type());
    }
    add_logits_grad(gc, r0, c, h, w, u_c, b_all, scaling);
  }

  // d loss / d logits `gc` (c, V) of rows r0 .. r0 + c, in the compute dtype,
  // multiplied into the sums.
  void add_logits_grad(const at::Tensor& gc, int64_t r0, int64_t c, const at::Tensor& h, const at::Tensor& w,
                       const at::Tensor& u_c, const at::Tensor& b_all, double scaling) {
    if (hidden.defined()) {
      at::Tensor out = hidden.narrow(0, r0, c);
      at::mm_out(out, gc, w);
    }
    if (weight.defined()) weight.add_product(gc, h);
    if (u.defined() || b.defined()) {
      const at::Tensor gs = gc * scaling;
      if (u.defined()) {
        at::Tensor out = u.narrow(0, r0, c);
        at::mm_out(out, gs, b_all);
      }
      if (b.defined()) b.add_product(gs, u_c);
    }
  }
};

// Note [Fused cross-entropy]
// --kernels fused: a chunk's logits (c, V), in the compute dtype, are the
// only (c, V) buffer the chunk keeps. For fp32 and bf16 logits one kernel per
// chunk (row_kernels.h, Note [Row kernels] in row_kernels.cpp) reads each row
// once for its maximum m and sum s of exp(x - m) (the online softmax: the
// sum rescaled when the maximum grows, in fp32), gives the row's loss
// (m - x[t]) + log s, and, when the loss will be differentiated, reads the
// row again to write the gradient over it: exp(x - m) / s x scale, minus
// scale at the target (scale = 1 / count, 0 for an ignored row), formed in fp32 and
// rounded once — no zeros, no scatter, no fp32 copy. CUDA launches it (NVRTC
// at run time); the CPU runs its twin, the same arithmetic over the same lanes
// and tree, for bf16. The CPU's fp32 (where LibTorch's vectorized exp makes
// its operations twice as fast as the twin's scalar expf: 1.99x the time for
// a 128-row chunk of 128,256 logits, where bf16's twin takes 0.56x; bench/
// kernels) and fp16 on both devices take LibTorch's operations instead, the
// composite below: logsumexp straight from the logits into an fp32 result,
// softmax in place, times the scale, the target's entry overwritten by
// (exp(x[t] - lse) - 1) x scale. The reference holds the logits, their fp32
// copy, log-softmax, the gradient of the log-softmax and of the logits in
// fp32 (chunked_loss_bytes: 2 elem + 12 bytes per logit); this path the
// logits (and the composite logsumexp's one temporary: 2 elem). fp32: the
// loss and gradients are the reference's within rounding
// (tests/models/test_chunked_loss.cpp, 1e-6 relative); bf16: within 1%.
at::Tensor fused_chunk_loss(at::Tensor& logits, const at::Tensor& target, const at::Tensor& valid,
                            const at::Tensor& scale) {
  // The CPU's fp32 takes the composite: there LibTorch's vectorized exp
  // outruns the twin's scalar expf (bench/kernels, bench/RESULTS.md).
  if (row_kernels_take(logits) && (logits.is_cuda() || logits.scalar_type() != at::kFloat)) {
    return online_softmax_cross_entropy(logits, target.contiguous(), scale).masked_fill_(valid.logical_not(), 0).sum();
  }
  at::Tensor lse = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));  // (c)
  at::logsumexp_out(lse, logits, {1}, /*keepdim=*/false);
  const at::Tensor t = target.unsqueeze(1);                                       // (c, 1)
  const at::Tensor nll = lse - logits.gather(1, t).squeeze(1).to(at::kFloat);  // (c) -log p(t)
  if (scale.defined()) {
    const at::Tensor at_target = nll.neg().exp_().sub_(1).mul_(scale);  // (p(t) - 1) x scale, fp32
    at::_softmax_out(logits, logits, 1, /*half_to_float=*/false);
    logits.mul_(scale.unsqueeze(1));
    logits.scatter_(1, t, at_target.unsqueeze(1).to(logits.scalar_type()));
  }
  return nll.masked_fill_(valid.logical_not(), 0).sum();
}

// Note [Chunked cross-entropy]
// Each chunk runs the unchunked path's own kernels on its rows: logits in the
// compute dtype, cast to fp32, log_softmax; the loss sums -log p of the
// targets of non-ignored rows. The count of non-ignored targets is a ()
// tensor (no host sync). A chunk's d loss / d logits comes from
// _log_softmax_backward_data of nll_loss's gradient (-scale at each
// non-ignored target, scale = 1 / count for the mean), cast to the compute
// dtype as the unchunked cast's backward does, and is multiplied into the
// gradients: d hidden = G W (this chunk's rows), d W += G^T hidden, and with a
// low-rank term d u = (G s) B, d B += (G s)^T u.
// When the loss is differentiated (grad mode on, an input requiring grad),
// forward forms these gradients while the chunk's log-softmax is at hand, for
// an upstream gradient of 1, and backward only multiplies them by the actual
// one: the logits are computed once, not again in backward (the head's
// matrix products were 4 per step, are 3: 25% of the head's work at a large
// vocabulary). The cost is holding d hidden (N, D) and d W (V, D) from the
// end of forward to the start of backward, which follow each other: the head
// is the last unit called. For an upstream gradient of 1 (loss.backward())
// every row's gradient is the unchunked path's to the bit; for another g the
// product g x (G W) rounds once more than G' = g G would. Without grad mode
// forward computes the loss alone (and autograd records nothing to call
// backward on). Only the sums over chunks (the loss, d W,
// d B) add in another order than one matrix product would; d W and d B are
// summed in fp32 and rounded to the compute dtype once, as the unchunked
// product's own fp32 accumulation is (Fp32Sum: until 9fc8542 they were summed
// in the compute dtype, a bf16 rounding and a read and write of the whole
// (V, D) gradient per chunk; on CUDA chunks are now also 16x larger,
// default_loss_chunk_rows).
struct ChunkedCrossEntropy : torch::autograd::Function<ChunkedCrossEntropy> {
  // `grads`: form the gradients here (Note [Chunked cross-entropy]).
  // `fused`: Note [Fused cross-entropy].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& u, const at::Tensor& b, const at::Tensor& targets, int64_t chunk_rows,
                            double scaling, bool mean, bool grads, bool fused) {
    const int64_t N = hidden.size(0);
    const at::Tensor valid = targets.ne(kIgnoreIndex);                 // (N) bool
    const at::Tensor safe = targets.masked_fill(valid.logical_not(), 0);  // (N) ignored rows read class 0
    const at::Tensor count = valid.sum().to(at::kFloat);
    const bool low_rank = has_low_rank(u);
    const bool need_hidden = grads && hidden.requires_grad(), need_weight = grads && weight.requires_grad();
    const bool need_u = grads && low_rank && u.requires_grad(), need_b = grads && low_rank && b.requires_grad();
    Gradients g(hidden, weight, u, b, need_hidden, need_weight, need_u, need_b);
    // nll_loss's gradient at a non-ignored target for an upstream gradient of 1.
    const at::Tensor target_grad =
        grads ? (valid.to(at::kFloat) * (mean ? 1.0 / count : at::ones_like(count))).neg_().unsqueeze(1) : at::Tensor();
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t c = std::min(chunk_rows, N - r0);
      const at::Tensor h = hidden.narrow(0, r0, c);
      const at::Tensor u_c = low_rank ? u.narrow(0, r0, c) : at::Tensor();
      if (fused) {
        at::Tensor logits = chunk_logits(h, weight, u_c, b, scaling);  // (c, V), then its gradient
        const at::Tensor scale = grads ? target_grad.narrow(0, r0, c).squeeze(1).neg() : at::Tensor();
        total.add_(fused_chunk_loss(logits, safe.narrow(0, r0, c), valid.narrow(0, r0, c), scale));
        if (grads) g.add_logits_grad(logits, r0, c, h, weight, u_c, b, scaling);
        continue;
      }
      const at::Tensor logp = at::log_softmax(chunk_logits(h, weight, u_c, b, scaling).to(at::kFloat), 1);  // (c, V)
      const at::Tensor picked = logp.gather(1, safe.narrow(0, r0, c).unsqueeze(1)).squeeze(1);
      total.sub_(picked.masked_fill_(valid.narrow(0, r0, c).logical_not(), 0).sum());
      if (grads) g.add_chunk(logp, safe, target_grad, r0, c, h, weight, u_c, b, scaling);
    }
    ctx->save_for_backward({g.hidden, g.weight.result(), g.u, g.b.result()});
    ctx->saved_data["grads"] = grads;
    return mean ? total / count : total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    FSDP_ASSERT(ctx->saved_data["grads"].toBool(), "the chunked loss was differentiated without its gradients");
    at::NoGradGuard no_grad;
    // Formed in forward for an upstream gradient of 1: scaled by the actual one.
    const at::Tensor& up = grad_outputs[0];
    const auto times_up = [&](const at::Tensor& t) { return t.defined() ? t * up.to(t.scalar_type()) : t; };
    return {times_up(saved[0]), times_up(saved[1]), times_up(saved[2]), times_up(saved[3]), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 LossReduction reduction, int64_t chunk_rows, const LowRankHead* lora,
                                 LayerKernels kernels) {
  FSDP_ASSERT(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1), "hidden ",
              hidden.sizes(), ", weight ", weight.sizes());
  FSDP_ASSERT(targets.dim() == 1 && targets.size(0) == hidden.size(0), "targets ", targets.sizes(), " for hidden ",
              hidden.sizes());
  FSDP_ASSERT(hidden.scalar_type() == weight.scalar_type(), "hidden ", hidden.scalar_type(), ", weight ",
              weight.scalar_type());
  FSDP_ASSERT(chunk_rows >= 1, "chunk_rows ", chunk_rows);
  // Without an adapter u and b are empty placeholders: a custom Function's
  // tensor arguments must be defined.
  at::Tensor u = at::empty({0}, hidden.options()), b = at::empty({0}, hidden.options());
  double scaling = 1.0;
  if (lora != nullptr) {
    FSDP_ASSERT(lora->u.dim() == 2 && lora->u.size(0) == hidden.size(0) && lora->b.dim() == 2 &&
                    lora->b.size(0) == weight.size(0) && lora->b.size(1) == lora->u.size(1),
                "low-rank head u ", lora->u.sizes(), ", b ", lora->b.sizes());
    u = lora->u;
    b = lora->b;
    scaling = lora->scaling;
  }
  // Gradients in forward only when this loss will be differentiated (not in evaluation).
  const bool grads = at::GradMode::is_enabled() &&
                     (hidden.requires_grad() || weight.requires_grad() || u.requires_grad() || b.requires_grad());
  return ChunkedCrossEntropy::apply(hidden.contiguous(), weight, u, b, targets.contiguous(), chunk_rows, scaling,
                                    reduction == LossReduction::kMean, grads, kernels == LayerKernels::kFused);
}

}  // namespace fsdp::models

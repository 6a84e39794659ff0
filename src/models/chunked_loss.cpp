#include "fsdp/models/chunked_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>

#include "fsdp/common/error.h"

namespace fsdp::models {

int64_t default_loss_chunk_rows(int64_t vocab_size) {
  FSDP_ASSERT(vocab_size >= 1, "vocab_size ", vocab_size);
  constexpr int64_t kElements = int64_t{1} << 24;  // 64 MiB of fp32 logits
  int64_t rows = 16;
  while (rows * 2 * vocab_size <= kElements) rows *= 2;
  return rows;
}

int64_t chunked_loss_bytes(int64_t rows, int64_t vocab_size, int64_t hidden_size, at::ScalarType dtype) {
  const auto elem = static_cast<double>(c10::elementSize(dtype));
  const double bytes = static_cast<double>(rows) * static_cast<double>(vocab_size) * (2 * elem + 3 * 4) +
                       static_cast<double>(vocab_size) * static_cast<double>(hidden_size) * elem;
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

// Note [Chunked cross-entropy]
// Each chunk runs the unchunked path's own kernels on its rows: logits in the
// compute dtype, cast to fp32, log_softmax; the loss sums -log p of the
// targets of non-ignored rows. Forward keeps nothing of a chunk but the
// inputs; the count of non-ignored targets is a () tensor (no host sync).
// Backward recomputes each chunk's log-softmax and forms d loss / d logits
// with _log_softmax_backward_data from nll_loss's gradient (-scale at each
// non-ignored target, scale = grad / count for the mean), so every row's
// gradient is the unchunked path's to the bit; it is cast to the compute
// dtype, as the unchunked cast's backward does, and multiplied into the
// gradients: d hidden = G W (this chunk's rows), d W += G^T hidden, and with a
// low-rank term d u = (G s) B, d B += (G s)^T u. Only the sums over chunks
// (the loss, d W, d B) add in another order than one matrix product would.
struct ChunkedCrossEntropy : torch::autograd::Function<ChunkedCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& u, const at::Tensor& b, const at::Tensor& targets, int64_t chunk_rows,
                            double scaling, bool mean) {
    const int64_t N = hidden.size(0);
    const at::Tensor valid = targets.ne(kIgnoreIndex);                 // (N) bool
    const at::Tensor safe = targets.masked_fill(valid.logical_not(), 0);  // (N) ignored rows read class 0
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t c = std::min(chunk_rows, N - r0);
      const at::Tensor logp = at::log_softmax(
          chunk_logits(hidden.narrow(0, r0, c), weight, has_low_rank(u) ? u.narrow(0, r0, c) : at::Tensor(), b,
                       scaling)
              .to(at::kFloat),
          1);  // (c, V) fp32
      const at::Tensor picked = logp.gather(1, safe.narrow(0, r0, c).unsqueeze(1)).squeeze(1);
      total.sub_(picked.masked_fill_(valid.narrow(0, r0, c).logical_not(), 0).sum());
    }
    const at::Tensor count = valid.sum().to(at::kFloat);
    ctx->save_for_backward({hidden, weight, u, b, safe, valid, count});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["mean"] = mean;
    return mean ? total / count : total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &u = saved[2], &b = saved[3];
    const at::Tensor &safe = saved[4], &valid = saved[5], &count = saved[6];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const bool mean = ctx->saved_data["mean"].toBool();
    at::NoGradGuard no_grad;

    // nll_loss's gradient at a non-ignored target: -grad (/ count for the mean); 0 for ignored rows.
    const at::Tensor scale = mean ? grad_outputs[0].to(at::kFloat) / count : grad_outputs[0].to(at::kFloat);
    const at::Tensor target_grad = (valid.to(at::kFloat) * scale).neg_().unsqueeze(1);  // (N, 1)
    const int64_t N = hidden.size(0);
    const bool low_rank = has_low_rank(u);
    const bool need_hidden = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1);
    const bool need_u = low_rank && ctx->needs_input_grad(2), need_b = low_rank && ctx->needs_input_grad(3);
    at::Tensor d_hidden = need_hidden ? at::empty_like(hidden) : at::Tensor();
    at::Tensor d_weight = need_weight ? at::zeros_like(weight) : at::Tensor();
    at::Tensor d_u = need_u ? at::empty_like(u) : at::Tensor();
    at::Tensor d_b = need_b ? at::zeros_like(b) : at::Tensor();
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t c = std::min(chunk_rows, N - r0);
      const at::Tensor h = hidden.narrow(0, r0, c);
      const at::Tensor u_c = low_rank ? u.narrow(0, r0, c) : at::Tensor();
      at::Tensor gc;  // d loss / d logits of this chunk, the compute dtype
      {
        const at::Tensor logp = at::log_softmax(chunk_logits(h, weight, u_c, b, scaling).to(at::kFloat), 1);
        at::Tensor grad_logp = at::zeros_like(logp);
        grad_logp.scatter_(1, safe.narrow(0, r0, c).unsqueeze(1), target_grad.narrow(0, r0, c));
        gc = at::_log_softmax_backward_data(grad_logp, logp, 1, at::kFloat).to(hidden.scalar_type());
      }
      if (need_hidden) {
        at::Tensor out = d_hidden.narrow(0, r0, c);
        at::mm_out(out, gc, weight);
      }
      if (need_weight) d_weight.addmm_(gc.t(), h);
      if (need_u || need_b) {
        const at::Tensor gs = gc * scaling;
        if (need_u) {
          at::Tensor out = d_u.narrow(0, r0, c);
          at::mm_out(out, gs, b);
        }
        if (need_b) d_b.addmm_(gs.t(), u_c);
      }
    }
    return {d_hidden, d_weight, d_u, d_b, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 LossReduction reduction, int64_t chunk_rows, const LowRankHead* lora) {
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
  return ChunkedCrossEntropy::apply(hidden.contiguous(), weight, u, b, targets.contiguous(), chunk_rows, scaling,
                                    reduction == LossReduction::kMean);
}

}  // namespace fsdp::models

// The output projection and cross-entropy of a language model, computed in
// chunks of rows so that the whole (N, V) logits never exist at once.
//
// Unchunked, a batch of N = B x T rows costs N x V logits in the compute dtype,
// their fp32 copy, log-softmax and gradient: 4 x 2048 x 128,256 fp32 is 4 GiB
// per buffer at Llama 3's vocabulary. Here each chunk of rows computes its
// logits in the compute dtype and their log-softmax and loss in fp32, and,
// when the loss will be differentiated, forms the chunk's share of the
// gradients of the hidden states, the weight and the optional low-rank (LoRA)
// term right then; backward only scales them by the upstream gradient. At
// most one chunk's logits (and their fp32 log-softmax) exist at any time;
// the gradients of the hidden states and the weight are held from forward to
// backward.
//
// The unchunked path's kernels on each chunk (logits in the compute dtype,
// cast to fp32, log_softmax and its backward in fp32, the logits' gradient
// cast back to the compute dtype before the matrix products): each row's
// gradient of the logits is the unchunked one's to the bit, and only sums over
// chunks (the loss, the weight's gradient) add in another order — within 1e-6
// relative in fp32 (tests/models/test_chunked_loss.cpp); in bf16/fp16 the
// weight's gradient is summed chunk by chunk in fp32 and rounded once, as the
// unchunked product's own accumulation is.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "fsdp/models/layer_kernels.h"

namespace fsdp::models {

// Targets equal to this are left out of the loss (HF / torch convention).
inline constexpr int64_t kIgnoreIndex = -100;

// Reduction of a cross-entropy over the non-ignored targets.
enum class LossReduction { kMean, kSum };

// Rows per chunk for a vocabulary of `vocab_size` on a device of type
// `device`, at least 16. CPU: the largest power of two whose fp32 logits take
// at most 64 MiB (2^24 elements) — 128 rows at V = 128,256, 512 rows at
// V = 32,000, every row of a small model's batch at V = 256. CUDA: sized from
// a budget of kCudaLossChunkBytes for one chunk's buffers (16 bytes per
// logit: chunked_loss_bytes' per-row part in bf16) — 2048 rows at V = 128,256
// — because each chunk adds into the weight's whole (V, D) fp32 gradient sum
// (Note [Chunked cross-entropy]): 64 chunks of 128 rows read and wrote it 64
// times a step (~67 GB at llama3.2-1b, batch 4). Requires: vocab_size >= 1.
inline constexpr int64_t kCudaLossChunkBytes = int64_t{4} << 30;
int64_t default_loss_chunk_rows(int64_t vocab_size, at::DeviceType device = at::kCPU);

// The rows per chunk a run uses: `asked` where > 0 (--loss-chunk-rows), else
// default_loss_chunk_rows(vocab_size, device). The models, fsdp-train's memory
// check and fsdp-inspect's plan all take it from here, so that the plan counts
// the chunk the run will hold (a CUDA run's, not the CPU's, for a GPU cluster).
int64_t loss_chunk_rows(int64_t asked, int64_t vocab_size, at::DeviceType device);

// The most the loss holds at once beyond its inputs, for `rows` rows per chunk
// (min(B x T, chunk rows)): in forward, a chunk's logits in `dtype` and their
// gradient in `dtype`, three fp32 buffers of the chunk (the logits, their
// log-softmax, its gradient), and the weight's (V, D) gradient in `dtype`
// until autograd adds it to the parameter's; below fp32, also the weight
// gradient's fp32 sum and one chunk's fp32 product (V, D) each, and (CPU) the
// chunk's gradient in fp32. (The hidden states' (B x T, D) gradient, held as
// long, is counted with the activations.) kFused: no fp32 buffer of the chunk
// — its logits, then their gradient, and one temporary in `dtype` (Note
// [Fused cross-entropy] in src/models/chunked_loss.cpp). Both: forward's count
// or backward's two (V, D) gradients in `dtype` (the saved one and its product
// by the upstream gradient), whichever is more.
int64_t chunked_loss_bytes(int64_t rows, int64_t vocab_size, int64_t hidden_size, at::ScalarType dtype,
                           LayerKernels kernels = LayerKernels::kReference);

// A LoRA adapter on the output projection, split where it is cheap: the
// (N, r) down-projection u = dropout(hidden) A^T is computed by the caller
// (ordinary autograd: its gradient flows back through A and the dropout);
// the up-projection B (V, r) is applied per chunk:
//   logits = hidden W^T + (u B^T) * scaling        (peft's order of operations)
struct LowRankHead {
  at::Tensor u;         // (N, r), the compute dtype
  at::Tensor b;         // (V, r), the compute dtype
  double scaling = 1;   // alpha / r
};

// Cross-entropy of logits = hidden W^T (+ the low-rank term) against `targets`,
// `chunk_rows` rows of logits at a time:
//   kMean: sum over non-ignored rows of (logsumexp(logits_i) - logits_i[t_i]) /
//          their count (NaN when every target is ignored, as torch);
//   kSum:  the same sum (0 when every target is ignored).
// hidden (N, D) and weight (V, D) in one floating dtype (the compute dtype);
// targets (N) int64 in [0, V) or kIgnoreIndex (the caller checks the range).
// Returns a () fp32 tensor, differentiable with respect to hidden, weight,
// lora->u and lora->b (those that require grad). chunk_rows >= 1; chunk_rows
// >= N computes the whole batch as one chunk. kernels: kReference the
// unchunked path's kernels per chunk (below); kFused the gradient of the
// logits written over them, without fp32 copies of the chunk (Note [Fused
// cross-entropy]): fp32 within rounding of kReference, bf16 within 1%.
at::Tensor chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 LossReduction reduction, int64_t chunk_rows, const LowRankHead* lora = nullptr,
                                 LayerKernels kernels = LayerKernels::kReference);

}  // namespace fsdp::models

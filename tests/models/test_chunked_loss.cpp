// The chunked output projection + cross-entropy (models/chunked_loss.h)
// against the unchunked path, cross_entropy(forward(tokens).float()): the loss
// and every parameter's gradient agree within 1e-6 relative in fp32 (the
// largest difference over the largest value of each gradient), and within
// bf16's resolution in bf16 — for untied and tied heads, ignored targets, the
// sum reduction of evaluation, a LoRA adapter on lm_head (with dropout) and
// Mixtral's auxiliary loss. A counting CPU allocator shows the memory: the
// chunked loss's peak is a fraction of the (N, V) logits the unchunked one holds.
#include <gtest/gtest.h>

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <map>
#include <string>

#include "fsdp/models/chunked_loss.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "support/counting_allocator.h"
#include "support/tiny_llama.h"

namespace fsdp::models {
namespace {

LlamaConfig config(int64_t vocab, bool tied, bool moe = false) {
  LlamaConfig c = moe ? fsdp::testing::tiny_mixtral("chunked-loss") : fsdp::testing::tiny_llama("chunked-loss");
  c.vocab_size = vocab;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.2;  // logits far from uniform: the softmax's gradient matters
  c.validate();
  return c;
}

at::Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(V, {B, T}, gen, at::kLong);
}

// The unchunked reference: full logits, fp32 log-softmax, torch's ignore_index.
at::Tensor unchunked_loss(LlamaForCausalLMImpl& m, const at::Tensor& tokens, const at::Tensor& targets,
                          at::Reduction::Reduction reduction) {
  const at::Tensor logits = m.forward(tokens).to(at::kFloat);
  return at::cross_entropy_loss(logits.reshape({-1, m.config().vocab_size}), targets.reshape({-1}), {}, reduction,
                                kIgnoreIndex);
}

struct Result {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
};

Result run(LlamaForCausalLMImpl& m, const std::function<at::Tensor()>& loss) {
  m.zero_grad();
  const at::Tensor l = loss();
  l.backward();
  Result r;
  r.loss = l.item<double>();
  for (auto& p : m.named_parameters(true)) {
    if (p.value().requires_grad()) r.grads[p.key()] = p.value().grad().to(at::kFloat).clone();
  }
  return r;
}

// max |a - b| / max |b| over every gradient, and the loss's relative difference.
void expect_close(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_NEAR(got.loss, want.loss, std::max(tol, 1e-6) * std::abs(want.loss)) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, w] : want.grads) {
    const at::Tensor& g = got.grads.at(name);
    const double scale = w.abs().max().item<double>();
    ASSERT_GT(scale, 0) << what << ": " << name << " got no gradient";
    const double rel = (g - w).abs().max().item<double>() / scale;
    if (rel > worst) {
      worst = rel;
      worst_name = name;
    }
  }
  std::cout << what << ": loss " << got.loss << " vs " << want.loss << ", worst gradient " << worst << " ("
            << worst_name << ")\n";
  EXPECT_LE(worst, tol) << what << ": " << worst_name;
}

TEST(ChunkedLoss, ChunkRowsFollowTheVocabulary) {
  EXPECT_EQ(default_loss_chunk_rows(128256), 128);
  EXPECT_EQ(default_loss_chunk_rows(32000), 512);
  EXPECT_EQ(default_loss_chunk_rows(256), 65536);
  EXPECT_EQ(default_loss_chunk_rows(int64_t{1} << 30), 16);
}

// On CUDA the chunk is sized from the budget kCudaLossChunkBytes: 16x the
// CPU's rows at Llama 3's vocabulary (4 chunks, not 64, at batch 4 x 2048),
// one chunk's buffers within the budget, and the count the memory check uses
// covers them with the (V, D) terms.
TEST(ChunkedLoss, CudaChunkRowsComeFromTheMemoryBudget) {
  const int64_t rows = default_loss_chunk_rows(128256, at::kCUDA);
  EXPECT_EQ(rows, 2048);
  EXPECT_EQ(default_loss_chunk_rows(32000, at::kCUDA), 8192);
  EXPECT_EQ(default_loss_chunk_rows(int64_t{1} << 30, at::kCUDA), 16);
  const int64_t per_chunk = rows * 128256 * (2 * 2 + 3 * 4);
  EXPECT_LE(per_chunk, kCudaLossChunkBytes);
  EXPECT_GT(2 * per_chunk, kCudaLossChunkBytes);  // the largest power of two that fits
  // bf16 at llama3.2-1b: the chunk's buffers, a (2048, V) fp32 copy on the CPU, and (V, D) x (2 + 4 + 4) bytes.
  EXPECT_EQ(chunked_loss_bytes(rows, 128256, 2048, at::kBFloat16),
            rows * 128256 * (16 + 4) + int64_t{128256} * 2048 * (2 + 8));
}

// fp32: 1e-6 relative, over chunk sizes that divide N, leave a short last
// chunk, or hold everything (then bit for bit: the same kernels on the same
// rows); untied and tied; means with ignored targets and the sum. Chunks of a
// few rows (below the default's minimum of 16) are matrix products of another
// shape, which round differently: within 3e-6.
TEST(ChunkedLoss, Fp32LossAndGradientsEqualTheUnchunkedPath) {
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = config(/*vocab=*/1000, tied);
    LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 3);
    const at::Tensor tokens = random_tokens(3, 10, cfg.vocab_size, 1);
    at::Tensor targets = random_tokens(3, 10, cfg.vocab_size, 2);
    targets.narrow(1, 7, 3).fill_(kIgnoreIndex);  // padding at the end of every row
    targets[1][0] = kIgnoreIndex;
    const Result want = run(m, [&] { return unchunked_loss(m, tokens, targets, at::Reduction::Mean); });
    const Result want_sum = run(m, [&] { return unchunked_loss(m, tokens, targets, at::Reduction::Sum); });
    for (const auto& [rows, tol] : std::vector<std::pair<int64_t, double>>{
             {16, 1e-6}, {10, 1e-6}, {30, 0.0}, {0, 0.0}, {1, 3e-6}, {7, 3e-6}}) {
      m.set_loss_chunk_rows(rows);
      const std::string what = std::string(tied ? "tied" : "untied") + ", " + std::to_string(m.loss_chunk_rows()) +
                               " rows per chunk";
      expect_close(run(m, [&] { return m.loss(tokens, targets); }), want, tol, what + ", mean");
      expect_close(run(m, [&] { return m.loss(tokens, targets, LossReduction::kSum); }), want_sum, tol,
                   what + ", sum");
    }
  }
}

// Every target ignored, with either kernels (Note [Fused cross-entropy]): the
// mean is NaN (as torch's), the sum 0 with zero gradients.
TEST(ChunkedLoss, EveryTargetIgnoredGivesNanMeanAndZeroSum) {
  const LlamaConfig cfg = config(100, false);
  for (LayerKernels kernels : {LayerKernels::kReference, LayerKernels::kFused}) {
    LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 3);
    m.set_loss_chunk_rows(3);
    m.set_kernels(kernels);
    const at::Tensor tokens = random_tokens(2, 5, cfg.vocab_size, 1);
    const at::Tensor ignored = at::full({2, 5}, kIgnoreIndex, at::kLong);
    EXPECT_TRUE(std::isnan(m.loss(tokens, ignored).item<double>())) << to_string(kernels);
    EXPECT_TRUE(std::isnan(unchunked_loss(m, tokens, ignored, at::Reduction::Mean).item<double>()));
    const at::Tensor sum = m.loss(tokens, ignored, LossReduction::kSum);
    EXPECT_EQ(sum.item<double>(), 0.0) << to_string(kernels);
    sum.backward();
    for (auto& p : m.named_parameters(true)) {
      EXPECT_EQ(p.value().grad().abs().max().item<double>(), 0.0) << to_string(kernels) << ": " << p.key();
    }
  }
}

// bf16 parameters: logits in bf16 as the unchunked path, fp32 loss; the
// gradients are rounded to bf16 (2^-8 relative per rounding; the weight's
// once, Bf16WeightGradientIsSummedInFp32AndRoundedOnce).
TEST(ChunkedLoss, Bf16AgreesWithinBf16Resolution) {
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = config(1000, tied);
    LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kBFloat16), 5);
    const at::Tensor tokens = random_tokens(4, 16, cfg.vocab_size, 3);
    const at::Tensor targets = random_tokens(4, 16, cfg.vocab_size, 4);
    const Result want = run(m, [&] { return unchunked_loss(m, tokens, targets, at::Reduction::Mean); });
    m.set_loss_chunk_rows(9);
    const Result got = run(m, [&] { return m.loss(tokens, targets); });
    // The loss reads the same bf16 logits: fp32 rounding only.
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss);
    expect_close(got, want, 2e-2, std::string("bf16, ") + (tied ? "tied" : "untied"));
  }
}

// The weight's gradient is summed over chunks in fp32 and rounded to bf16
// once, as the unchunked product's own fp32 accumulation is: with 64 chunks
// it equals the unchunked gradient but for the rounding of a different
// summation order — at most one bf16 ulp in at most 2% of the elements. (At
// 9fc8542 it was summed in bf16, rounded 64 times.) At one intra-op
// thread: the CPU's bf16 matrix product picks its kernel by shape and thread
// count, and at two threads a 2-row chunk's logits differ from the 128-row
// product's by one bf16 ulp in a few elements (3 of 128,000 for a 64-wide
// hidden), which moves a gradient sum that cancels by more than the
// summation order does (2 ulp in 12 elements) — a difference of the logits,
// not of the sum this test is about.
TEST(ChunkedLoss, Bf16WeightGradientIsSummedInFp32AndRoundedOnce) {
  struct OneThread {
    const int before = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(before); }
  } one_thread;
  const LlamaConfig cfg = config(1000, /*tied=*/false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kBFloat16), 5);
  const at::Tensor tokens = random_tokens(4, 32, cfg.vocab_size, 3);
  const at::Tensor targets = random_tokens(4, 32, cfg.vocab_size, 4);
  const Result want = run(m, [&] { return unchunked_loss(m, tokens, targets, at::Reduction::Mean); });
  m.set_loss_chunk_rows(2);  // 64 chunks of the 128 rows
  const Result got = run(m, [&] { return m.loss(tokens, targets); });
  const at::Tensor w = want.grads.at("lm_head.weight"), g = got.grads.at("lm_head.weight");  // bf16 values, as fp32
  // One bf16 ulp of each reference element: 2^(exponent - 7).
  const at::Tensor ulp = at::pow(2.0, at::floor(at::log2(w.abs().clamp_min(1e-30))) - 7);
  const double worst_ulps = ((g - w).abs() / ulp).max().item<double>();
  const double differ = (g != w).to(at::kDouble).mean().item<double>();
  std::cout << "bf16 lm_head.weight gradient, 64 chunks: " << 100 * differ << "% of elements differ, worst "
            << worst_ulps << " ulp\n";
  EXPECT_LE(worst_ulps, 1.0);
  EXPECT_LE(differ, 0.02);
}

// LoRA adapters (rank 4, alpha 8) on q_proj and lm_head, lora_B moved off
// zero (where it starts, no gradient would reach lora_A).
void add_lora_on_head(LlamaForCausalLMImpl& m, double dropout) {
  LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.dropout = dropout;
  lc.targets = {"q_proj", "lm_head"};
  apply_lora(m, lc, 11);
  at::NoGradGuard no_grad;
  for (auto& p : m.named_parameters(true)) {
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.1);
  }
}

// A LoRA adapter on lm_head (with dropout, training mode) and on q_proj: the
// chunked loss includes the adapter's output and gives lora_A and lora_B of
// the head the gradients of the unchunked path.
TEST(ChunkedLoss, LoraOnTheHeadTakesPartWithItsGradients) {
  const LlamaConfig cfg = config(500, false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 7);
  add_lora_on_head(m, 0.25);
  m.train();
  set_lora_dropout_key(m, 42);
  const at::Tensor tokens = random_tokens(2, 12, cfg.vocab_size, 5);
  const at::Tensor targets = random_tokens(2, 12, cfg.vocab_size, 6);
  const Result want = run(m, [&] { return unchunked_loss(m, tokens, targets, at::Reduction::Mean); });
  ASSERT_TRUE(want.grads.count("lm_head.lora_A.weight"));
  ASSERT_TRUE(want.grads.count("lm_head.lora_B.weight"));
  m.set_loss_chunk_rows(5);
  expect_close(run(m, [&] { return m.loss(tokens, targets); }), want, 1e-6, "LoRA on lm_head");
  // Without the adapter's output the loss differs: the adapter is not ignored.
  LlamaForCausalLMImpl plain(cfg, at::TensorOptions().dtype(at::kFloat), 7);
  EXPECT_GT(std::abs(plain.loss(tokens, targets).item<double>() - want.loss), 1e-4);
}

// Mixtral: the chunked cross-entropy plus router_aux_loss_coef x the
// load-balancing loss, as transformers' loss.
TEST(ChunkedLoss, MixtralAddsItsAuxiliaryLoss) {
  const LlamaConfig cfg = config(300, false, /*moe=*/true);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 9);
  const at::Tensor tokens = random_tokens(2, 8, cfg.vocab_size, 7);
  const at::Tensor targets = random_tokens(2, 8, cfg.vocab_size, 8);
  const Result want = run(m, [&] {
    const RouterOutputs r = m.forward_with_router_logits(tokens);
    const at::Tensor ce = at::cross_entropy_loss(r.logits.to(at::kFloat).reshape({-1, cfg.vocab_size}),
                                                 targets.reshape({-1}), {}, at::Reduction::Mean, kIgnoreIndex);
    return ce + cfg.router_aux_loss_coef * r.aux_loss;
  });
  m.set_loss_chunk_rows(3);
  expect_close(run(m, [&] { return m.loss(tokens, targets); }), want, 1e-6, "mixtral");
}

// ---- --kernels fused (Note [Fused cross-entropy]) -----------------------------

// fp32: the fused path's loss and every gradient (hidden states through the
// layers, the head's weight, untied and tied) are the reference's within 1e-6
// relative, over 3 chunks (30 rows by 10), 2 chunks with a short last one, one
// chunk; ignored targets, the mean and the sum.
TEST(ChunkedLoss, FusedEqualsTheReferenceInFp32) {
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = config(/*vocab=*/1000, tied);
    LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 3);
    const at::Tensor tokens = random_tokens(3, 10, cfg.vocab_size, 1);
    at::Tensor targets = random_tokens(3, 10, cfg.vocab_size, 2);
    targets.narrow(1, 7, 3).fill_(kIgnoreIndex);
    targets[1][0] = kIgnoreIndex;
    for (int64_t rows : {10, 16, 30}) {
      m.set_loss_chunk_rows(rows);
      const std::string what = std::string("fused, ") + (tied ? "tied" : "untied") + ", " + std::to_string(rows) +
                               " rows per chunk";
      for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
        m.set_kernels(LayerKernels::kReference);
        const Result want = run(m, [&] { return m.loss(tokens, targets, reduction); });
        m.set_kernels(LayerKernels::kFused);
        const Result got = run(m, [&] { return m.loss(tokens, targets, reduction); });
        expect_close(got, want, 1e-6, what + (reduction == LossReduction::kMean ? ", mean" : ", sum"));
        // The model ran the fused path (set_kernels reached its loss): its softmax rounds otherwise than
        // exp(log_softmax), so some gradient differs in its last bits.
        bool differs = false;
        for (const auto& [name, w] : want.grads) differs = differs || !at::equal(got.grads.at(name), w);
        EXPECT_TRUE(differs) << what;
      }
    }
  }
}

// bf16: the fused gradient rounds twice where the reference rounds once; the
// loss reads the same bf16 logits (its log-sum-exp sums bf16-rounded
// exponentials in fp32). The loss alone (hidden states and weight as leaves,
// 3 chunks, an ignored target): the loss and both gradients within 1% (the
// norm of the difference over the norm). Through a tiny Llama, every
// parameter's gradient within the 2% at which bf16's reference is held to
// the unchunked path (Bf16AgreesWithinBf16Resolution): deep in the layers a
// few elements move by bf16 roundings whichever path feeds them.
TEST(ChunkedLoss, FusedAgreesWithTheReferenceInBf16) {
  const int64_t N = 48, V = 1000, D = 64;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor hidden = at::randn({N, D}, gen).to(at::kBFloat16).requires_grad_();
  const at::Tensor weight = (at::randn({V, D}, gen) * 0.3).to(at::kBFloat16).requires_grad_();
  at::Tensor targets = at::randint(V, {N}, gen, at::kLong);
  targets[5] = kIgnoreIndex;
  std::vector<double> loss;
  std::vector<at::Tensor> dh, dw;
  for (LayerKernels kernels : {LayerKernels::kReference, LayerKernels::kFused}) {
    hidden.mutable_grad().reset();
    weight.mutable_grad().reset();
    const at::Tensor l = chunked_cross_entropy(hidden, weight, targets, LossReduction::kMean, 16, nullptr, kernels);
    l.backward();
    loss.push_back(l.item<double>());
    dh.push_back(hidden.grad().to(at::kFloat));
    dw.push_back(weight.grad().to(at::kFloat));
  }
  const auto rel = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>() / b.norm().item<double>(); };
  std::cout << "fused bf16, the loss alone: loss " << loss[1] << " vs " << loss[0] << ", hidden's gradient within "
            << rel(dh[1], dh[0]) << ", weight's " << rel(dw[1], dw[0]) << "\n";
  EXPECT_NEAR(loss[1], loss[0], 1e-2 * loss[0]);
  EXPECT_LE(rel(dh[1], dh[0]), 1e-2);
  EXPECT_LE(rel(dw[1], dw[0]), 1e-2);
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = config(1000, tied);
    LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kBFloat16), 5);
    const at::Tensor tokens = random_tokens(4, 12, cfg.vocab_size, 3);
    at::Tensor t = random_tokens(4, 12, cfg.vocab_size, 4);
    t[2][5] = kIgnoreIndex;
    m.set_loss_chunk_rows(16);  // 48 rows: 3 chunks
    const Result want = run(m, [&] { return m.loss(tokens, t); });
    m.set_kernels(LayerKernels::kFused);
    const Result got = run(m, [&] { return m.loss(tokens, t); });
    EXPECT_NEAR(got.loss, want.loss, 1e-2 * want.loss);
    expect_close(got, want, 2e-2, std::string("fused bf16, ") + (tied ? "tied" : "untied"));
  }
}

// A LoRA adapter on lm_head (no dropout): the fused path gives lora_A and
// lora_B the reference's gradients.
TEST(ChunkedLoss, FusedTakesTheLoraTermWithItsGradients) {
  const LlamaConfig cfg = config(500, false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 7);
  add_lora_on_head(m, 0.0);
  const at::Tensor tokens = random_tokens(2, 12, cfg.vocab_size, 5);
  const at::Tensor targets = random_tokens(2, 12, cfg.vocab_size, 6);
  m.set_loss_chunk_rows(8);  // 3 chunks
  const Result want = run(m, [&] { return m.loss(tokens, targets); });
  ASSERT_TRUE(want.grads.count("lm_head.lora_A.weight"));
  m.set_kernels(LayerKernels::kFused);
  expect_close(run(m, [&] { return m.loss(tokens, targets); }), want, 1e-6, "fused, LoRA on lm_head");
}

// The fused path's count has no fp32 buffer of the chunk.
TEST(ChunkedLoss, FusedCountsNoFp32CopyOfTheChunk) {
  const int64_t weight_part = int64_t{128256} * 2048 * (2 + 8);
  EXPECT_EQ(chunked_loss_bytes(2048, 128256, 2048, at::kBFloat16, LayerKernels::kFused),
            int64_t{2048} * 128256 * (4 + 4) + weight_part);
  // fp32 at a small chunk: backward's two (V, D) gradients exceed forward's chunk and one.
  EXPECT_EQ(chunked_loss_bytes(16, 1000, 64, at::kFloat, LayerKernels::kFused), 2 * 1000 * 64 * 4);
  EXPECT_EQ(chunked_loss_bytes(512, 1000, 64, at::kFloat, LayerKernels::kFused), 512 * 1000 * 8 + 1000 * 64 * 4);
}

// ---- memory -----------------------------------------------------------------

using fsdp::testing::CountingAllocator;

// V = 32768 classes for N = 256 tokens: 32 MiB per fp32 (N, V) buffer.
// Unchunked, loss + backward hold several of them at once; chunked at 16
// rows, a few 2 MiB chunks and the head's gradient — within what
// chunked_loss_bytes (the memory check's count) says.
TEST(ChunkedLoss, NeverHoldsTheWholeLogits) {
  const LlamaConfig cfg = config(32768, false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 1);
  const at::Tensor tokens = random_tokens(4, 64, cfg.vocab_size, 1);
  const at::Tensor targets = random_tokens(4, 64, cfg.vocab_size, 2);
  const int64_t logits_bytes = 4 * 64 * cfg.vocab_size * 4;
  c10::Allocator* original = c10::GetCPUAllocator();
  // Never destroyed: tensors allocated through it may outlive this test.
  static CountingAllocator& counting = *new CountingAllocator(original);
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  const auto peak_of = [&](const std::function<at::Tensor()>& loss) {
    m.zero_grad();
    counting.reset_peak();
    const int64_t before = counting.live();
    loss().backward();
    return counting.peak() - before;
  };
  const int64_t unchunked = peak_of([&] { return unchunked_loss(m, tokens, targets, at::Reduction::Mean); });
  m.set_loss_chunk_rows(16);
  const int64_t chunked = peak_of([&] { return m.loss(tokens, targets); });
  c10::SetCPUAllocator(original, /*priority=*/101);
  std::cout << "(N, V) fp32 logits " << logits_bytes << " bytes; peak above the weights: unchunked " << unchunked
            << ", chunked " << chunked << "\n";
  EXPECT_GE(unchunked, 2 * logits_bytes);
  // The weight's gradient (V x D fp32 = 4 MiB) and a few chunks: well under one (N, V) buffer.
  EXPECT_LT(chunked, logits_bytes / 2);
  // The count the memory check uses bounds it (+ the (N, D) gradient of the hidden states and small things).
  EXPECT_LE(chunked, chunked_loss_bytes(16, cfg.vocab_size, cfg.hidden_size, at::kFloat) + (int64_t{1} << 20));
}

// The most the loss alone holds (hidden states (N, D) and weight (V, D) as
// fp32 leaves, chunks of `rows`) through its forward and backward, above what
// was live before, on each path: the CPU allocator counted from `priority` on
// (SetCPUAllocator keeps an allocator of a higher priority: each test its own).
// `doubled`: the loss times 2, so that backward's product of the weight's
// gradient by the upstream gradient is a tensor of its own.
struct LossPeaks {
  int64_t reference = 0;
  int64_t fused = 0;
};
LossPeaks loss_peaks(int64_t N, int64_t V, int64_t D, int64_t rows, uint64_t seed, bool doubled, uint8_t priority) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor hidden = at::randn({N, D}, gen).requires_grad_();
  const at::Tensor weight = (at::randn({V, D}, gen) * 0.2).requires_grad_();
  const at::Tensor targets = at::randint(V, {N}, gen, at::kLong);
  c10::Allocator* original = c10::GetCPUAllocator();
  // Never destroyed: tensors allocated through it may outlive the call.
  static CountingAllocator& counting = *new CountingAllocator(original);
  const auto peak_of = [&](LayerKernels kernels) {
    hidden.mutable_grad().reset();
    weight.mutable_grad().reset();
    counting.reset_peak();
    const int64_t before = counting.live();
    const at::Tensor loss =
        chunked_cross_entropy(hidden, weight, targets, LossReduction::kMean, rows, nullptr, kernels);
    (doubled ? loss * 2 : loss).backward();
    return counting.peak() - before;
  };
  c10::SetCPUAllocator(&counting, priority);
  LossPeaks out;
  out.reference = peak_of(LayerKernels::kReference);
  out.fused = peak_of(LayerKernels::kFused);
  c10::SetCPUAllocator(original, static_cast<uint8_t>(priority + 1));
  return out;
}

// Chunks of 64 rows of V = 32768 (8 MiB of fp32 logits each) and a narrow D,
// where the chunk's buffers are the most the loss holds: the fused path holds
// less than the reference, and within its own count. (With a wide D and small
// chunks the largest moment is backward's, the next test's.)
TEST(ChunkedLoss, FusedHoldsLessThanTheReferenceWithinItsCount) {
  const int64_t N = 256, V = 32768, D = 16, rows = 64;
  const LossPeaks peak = loss_peaks(N, V, D, rows, /*seed=*/5, /*doubled=*/false, /*priority=*/200);
  ASSERT_GT(peak.fused, 0);
  const int64_t count = chunked_loss_bytes(rows, V, D, at::kFloat, LayerKernels::kFused);
  std::cout << "loss alone, peak: reference " << peak.reference << ", fused " << peak.fused << " bytes (count "
            << count << ")\n";
  EXPECT_LT(peak.fused, peak.reference);
  // + the (N, D) gradient of the hidden states, twice (saved and scaled), and small things.
  EXPECT_LE(peak.fused, count + 2 * N * D * 4 + (int64_t{1} << 16));
}

// fp32 at small chunks and a wide D: the most the loss holds is backward's
// moment, the weight's saved (V, D) gradient and its product by the upstream
// gradient, more than forward's chunk and one (V, D). The count covers it on
// both paths (until it took the larger of the two moments for the reference
// too, it counted forward's alone there: llama3.1-8b on the CPU, 2.4 of 4.2 GB).
TEST(ChunkedLoss, BackwardsTwoWeightGradientsAreCounted) {
  const int64_t N = 64, V = 4096, D = 256, rows = 16;
  const LossPeaks peaks = loss_peaks(N, V, D, rows, /*seed=*/7, /*doubled=*/true, /*priority=*/210);
  // Forward's count: the chunk's buffers (2 x 4 + 12 bytes per logit) and one (V, D) in fp32.
  const int64_t forward_count = rows * V * 20 + V * D * 4;
  for (const LayerKernels kernels : {LayerKernels::kReference, LayerKernels::kFused}) {
    SCOPED_TRACE(kernels == LayerKernels::kFused ? "fused" : "reference");
    const int64_t peak = kernels == LayerKernels::kFused ? peaks.fused : peaks.reference;
    const int64_t count = chunked_loss_bytes(rows, V, D, at::kFloat, kernels);
    std::cout << "peak " << peak << " bytes, count " << count << ", forward's alone " << forward_count << "\n";
    EXPECT_GT(peak, forward_count);  // the shape is one where backward's moment is the larger
    EXPECT_EQ(count, 2 * V * D * 4);
    // + the (N, D) gradient of the hidden states, twice (saved and scaled), and small things.
    EXPECT_LE(peak, count + 2 * N * D * 4 + (int64_t{1} << 16));
  }
}

}  // namespace
}  // namespace fsdp::models

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

TEST(ChunkedLoss, EveryTargetIgnoredGivesNanMeanAndZeroSum) {
  const LlamaConfig cfg = config(100, false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 3);
  m.set_loss_chunk_rows(3);
  const at::Tensor tokens = random_tokens(2, 5, cfg.vocab_size, 1);
  const at::Tensor ignored = at::full({2, 5}, kIgnoreIndex, at::kLong);
  EXPECT_TRUE(std::isnan(m.loss(tokens, ignored).item<double>()));
  EXPECT_TRUE(std::isnan(unchunked_loss(m, tokens, ignored, at::Reduction::Mean).item<double>()));
  const at::Tensor sum = m.loss(tokens, ignored, LossReduction::kSum);
  EXPECT_EQ(sum.item<double>(), 0.0);
  sum.backward();
  for (auto& p : m.named_parameters(true)) EXPECT_EQ(p.value().grad().abs().max().item<double>(), 0.0) << p.key();
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

// A LoRA adapter on lm_head (with dropout, training mode) and on q_proj: the
// chunked loss includes the adapter's output and gives lora_A and lora_B of
// the head the gradients of the unchunked path.
TEST(ChunkedLoss, LoraOnTheHeadTakesPartWithItsGradients) {
  const LlamaConfig cfg = config(500, false);
  LlamaForCausalLMImpl m(cfg, at::TensorOptions().dtype(at::kFloat), 7);
  LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  lc.dropout = 0.25;
  lc.targets = {"q_proj", "lm_head"};
  apply_lora(m, lc, 11);
  // lora_B starts at zero (no gradient reaches lora_A): move it.
  {
    at::NoGradGuard no_grad;
    for (auto& p : m.named_parameters(true)) {
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.1);
    }
  }
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

}  // namespace
}  // namespace fsdp::models

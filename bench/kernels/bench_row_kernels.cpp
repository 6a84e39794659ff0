// The row kernels' CPU twins (models/row_kernels.h) against the LibTorch
// operations they replace, one thread, the median of several runs each, in
// turn: the cross-entropy of one 128-row chunk of a 128,256-word vocabulary
// (the CPU's default chunk at Llama 3's vocabulary) and the FP8 quantizer of a
// (4096, 2048) activation. Prints milliseconds and twin / LibTorch.
//
//   bench_row_kernels [--runs N]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fsdp/models/row_kernels.h"

namespace {

double median_ms(int runs, const std::function<void()>& setup, const std::function<void()>& f) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    setup();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_row_kernels [--runs N]\n");
      return 2;
    }
  }
  at::set_num_threads(1);
  std::printf("| kernel | dtype | LibTorch ms | twin ms | twin / LibTorch |\n|---|---|---|---|---|\n");
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const char* name = dtype == at::kFloat ? "fp32" : "bf16";
    // Cross-entropy with its gradient written over the logits.
    const at::Tensor x = at::randn({128, 128256}).to(dtype);
    const at::Tensor target = at::randint(128256, {128}, at::kLong);
    const at::Tensor scale = at::full({128}, 1.0f / 128);
    at::Tensor logits;
    const auto fresh = [&] { logits = x.clone(); };
    // The composite of Note [Fused cross-entropy] (src/models/chunked_loss.cpp).
    const double torch_ce = median_ms(runs, fresh, [&] {
      at::Tensor lse = at::empty({128}, logits.options().dtype(at::kFloat));
      at::logsumexp_out(lse, logits, {1}, false);
      const at::Tensor t = target.unsqueeze(1);
      const at::Tensor nll = lse - logits.gather(1, t).squeeze(1).to(at::kFloat);
      const at::Tensor at_target = nll.neg().exp_().sub_(1).mul_(scale);
      at::_softmax_out(logits, logits, 1, false);
      logits.mul_(scale.unsqueeze(1));
      logits.scatter_(1, t, at_target.unsqueeze(1).to(logits.scalar_type()));
    });
    const double twin_ce =
        median_ms(runs, fresh, [&] { fsdp::models::online_softmax_cross_entropy(logits, target, scale); });
    std::printf("| cross-entropy, 128 x 128256 | %s | %.1f | %.1f | %.2f |\n", name, torch_ce, twin_ce,
                twin_ce / torch_ce);
    // The quantizer (models::quantize_rowwise's composite, src/models/fp8.cpp).
    const at::Tensor a = at::randn({4096, 2048}).to(dtype);
    const double torch_q = median_ms(runs, [] {}, [&] {
      const at::Tensor a32 = a.to(at::kFloat).contiguous();
      const at::Tensor amax = a32.abs().amax(1, true).clamp_min(1e-12f);
      const at::Tensor s = at::reciprocal(amax).mul_(448.0f);
      (void)(a32 * s).clamp(-448.0f, 448.0f).to(at::kFloat8_e4m3fn);
      (void)at::reciprocal(s);
    });
    const double twin_q = median_ms(runs, [] {}, [&] { (void)fsdp::models::quantize_rows_e4m3(a); });
    std::printf("| e4m3 quantizer, 4096 x 2048 | %s | %.1f | %.1f | %.2f |\n", name, torch_q, twin_q, twin_q / torch_q);
  }
  return 0;
}

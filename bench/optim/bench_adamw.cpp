// The optimizer's step on flat shards: the fused kernel (at::_fused_adamw_,
// AdamWOptions::fused, the default) against the loop of ATen operations it
// replaces, in the same run (docs/benchmarks.md: benchmarks print ratios against a
// reference measured in the same run). Not part of the test suite.
//
//   bench_adamw [--params N,...] [--ranks W,...] [--steps K] [--threads T]
//
// For each model size N (default: the CPU head-to-head's small and 100m
// models, 25.7M and 99.9M parameters) and rank count W, one rank's fp32 shard
// of N / W elements in units of ~N/16 (a decoder layer's size) with two
// settings per unit (decay and no decay, as the trainer's parameter groups),
// K steps after one warm-up, with the cores / W threads a rank of the
// head-to-head gets (--threads overrides); prints the median milliseconds per
// step of each and the ratio loop / fused. Pure bf16 (Kahan) keeps the loop: not measured.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/optim/adamw.h"

namespace {

std::vector<int64_t> parse_list(const std::string& v) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start < v.size()) {
    const size_t comma = std::min(v.find(',', start), v.size());
    out.push_back(std::stoll(v.substr(start, comma - start)));
    start = comma + 1;
  }
  return out;
}

double median_ms(fsdp::optim::AdamW& opt, int steps) {
  opt.step();  // warm-up: first touch of the moments
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return fsdp::run_main("bench_adamw", [&] {
    std::vector<int64_t> params = {25'700'000, 99'900'000};
    std::vector<int64_t> ranks = {1, 2};
    int steps = 10;
    int threads = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      FSDP_CHECK(i + 1 < argc, "bench_adamw: ", arg, " needs a value (see the header of bench_adamw.cpp)");
      const std::string v = argv[++i];
      if (arg == "--params") {
        params = parse_list(v);
      } else if (arg == "--ranks") {
        ranks = parse_list(v);
      } else if (arg == "--steps") {
        steps = std::stoi(v);
      } else if (arg == "--threads") {
        threads = std::stoi(v);
      } else {
        FSDP_CHECK(false, "bench_adamw: unknown flag ", arg, " (use --params, --ranks, --steps, --threads)");
      }
    }
    FSDP_CHECK(steps >= 1, "bench_adamw: --steps must be >= 1, got ", steps);
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    std::printf("| params | ranks x threads | shard elements | loop ms/step | fused ms/step | loop / fused |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (int64_t n : params) {
      for (int64_t w : ranks) {
        // As the head-to-head's ranks: the cores shared among W processes.
        at::set_num_threads(threads > 0 ? threads : std::max(1, static_cast<int>(cores / w)));
        const int64_t shard = n / w;
        const int64_t unit = std::max<int64_t>(1, shard / 16);
        double result[2] = {0, 0};
        for (int fused = 0; fused < 2; ++fused) {
          fsdp::optim::AdamWOptions o;
          o.lr = 3e-4;
          o.weight_decay = 0.01;
          o.fused = fused == 1;
          fsdp::optim::AdamW opt(o);
          std::vector<at::Tensor> keep;
          for (int64_t at = 0; at < shard; at += unit) {
            const int64_t len = std::min(unit, shard - at);
            at::Tensor p = at::randn({len});
            at::Tensor g = at::randn({len}) * 1e-3;
            keep.push_back(g);
            const int64_t norm = std::min<int64_t>(len, 1537);  // a no-decay part: a norm's weight
            opt.add("unit", p, [g] { return g; },
                    {{0, norm, {false, 1.0}}, {norm, len - norm, {true, 1.0}}});
          }
          result[fused] = median_ms(opt, steps);
        }
        std::printf("| %.1fM | %lld x %d | %lld | %.1f | %.1f | %.2f |\n", static_cast<double>(n) / 1e6,
                    static_cast<long long>(w), at::get_num_threads(), static_cast<long long>(shard), result[0],
                    result[1], result[0] / result[1]);
        std::fflush(stdout);
      }
    }
    return 0;
  });
}

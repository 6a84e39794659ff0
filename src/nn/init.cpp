#include "fsdp/nn/init.h"

#include <algorithm>

#include <torch/nn/module.h>

#include <cmath>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"

namespace fsdp::nn {
namespace {

// Uniform in the open interval (0, 1) from 32 random bits.
inline double unit_open(uint32_t bits) { return (static_cast<double>(bits) + 0.5) * (1.0 / 4294967296.0); }

}  // namespace

namespace {
void fill_slice(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name, int64_t first);
}  // namespace

void init_slice(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name,
                int64_t first) {
  FSDP_ASSERT(out.is_contiguous(), "init_slice needs a contiguous tensor");
  fill_slice(out, rule, seed, name, first);
  // The zero range's overlap with this slice.
  const int64_t lo = std::max(rule.zero_begin, first);
  const int64_t hi = std::min(rule.zero_end, first + out.numel());
  if (hi > lo) {
    at::NoGradGuard no_grad;
    out.view({out.numel()}).narrow(0, lo - first, hi - lo).zero_();
  }
}

namespace {
void fill_slice(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name, int64_t first) {
  const int64_t n = out.numel();
  if (n == 0) return;
  switch (rule.kind) {
    case InitRule::Kind::kZeros: out.zero_(); return;
    case InitRule::Kind::kOnes: out.fill_(1.0); return;
    case InitRule::Kind::kConstant: out.fill_(rule.a); return;
    default: break;
  }
  const uint64_t key = splitmix64(seed ^ fnv1a64(name));
  const bool normal = rule.kind == InitRule::Kind::kNormal;
  const double a = rule.a;
  // The values are made in double, a chunk at a time, in one small buffer
  // reused for every chunk. A double copy of the whole slice would take 8
  // bytes per element while a shard is filled (1 GiB for one rank's share of
  // Llama 3 70B's embedding at 8 ranks), and each of them, freed between the
  // shards, raised glibc's mmap threshold: the 100M-parameter benchmark's
  // shards then came from the heap, which grew by 13 MB for each 7 MB shard.
  constexpr int64_t kChunk = int64_t{1} << 15;
  at::Tensor host = at::empty({std::min(n, kChunk)}, at::TensorOptions().dtype(at::kDouble));
  double* v = host.data_ptr<double>();
  at::NoGradGuard no_grad;
  const at::Tensor flat = out.view({n});
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    at::parallel_for(0, len, 1 << 13, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const uint64_t r = splitmix64(key ^ splitmix64(static_cast<uint64_t>(first + c0 + j)));
        const double u1 = unit_open(static_cast<uint32_t>(r >> 32));
        const double u2 = unit_open(static_cast<uint32_t>(r));
        if (normal) {
          v[j] = a * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        } else {
          v[j] = a * (2.0 * u1 - 1.0);
        }
      }
    });
    flat.narrow(0, c0, len).copy_(host.narrow(0, 0, len));
  }
}
}  // namespace

void init_module(torch::nn::Module& module, const InitRuleFn& rules, uint64_t seed) {
  at::NoGradGuard no_grad;
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    at::Tensor t = p.value();
    FSDP_CHECK(!t.is_meta(), "init_module: parameter '", p.key(),
               "' is on the meta device; materialize the module first (or shard it, which materializes shards)");
    if (t.is_contiguous()) {
      init_slice(t, rules(p.key()), seed, p.key(), 0);
    } else {
      at::Tensor tmp = at::empty_like(t, at::MemoryFormat::Contiguous);
      init_slice(tmp, rules(p.key()), seed, p.key(), 0);
      t.copy_(tmp);
    }
  }
}

}  // namespace fsdp::nn

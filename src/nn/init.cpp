#include "fsdp/nn/init.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/TypeCast.h>
#include <torch/nn/module.h>

#include <algorithm>
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
// Note [Initialization in large blocks]
// The values are made in double and rounded to the destination's dtype as
// copy_ rounds them (c10::convert), in blocks of kBlock elements, each split
// over every intra-op thread: straight into a CPU destination, else into one
// host buffer of the destination's dtype, copied to the device once per block.
// Until 9fc8542 blocks were 32768 doubles (at most 4 threads of 8192, a
// host-to-device copy of 256 KB each, with the conversion): ~38,000
// synchronous copies for llama3.2-1b, 10-12 s of start-up by the GPU issue's
// estimate. The buffer stays one block, not the slice: a whole slice in double
// (1 GiB for one rank's share of Llama 3 70B's embedding at 8 ranks), freed
// between shards, raised glibc's mmap threshold, and the 100M-parameter
// benchmark's heap grew by 13 MB for each 7 MB shard.
constexpr int64_t kBlock = int64_t{1} << 20;

template <typename T>
void generate(T* dst, int64_t len, int64_t index0, uint64_t key, bool normal, double a) {
  at::parallel_for(0, len, int64_t{1} << 12, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const uint64_t r = splitmix64(key ^ splitmix64(static_cast<uint64_t>(index0 + j)));
      const double u1 = unit_open(static_cast<uint32_t>(r >> 32));
      const double u2 = unit_open(static_cast<uint32_t>(r));
      const double v = normal ? a * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) : a * (2.0 * u1 - 1.0);
      dst[j] = c10::convert<T>(v);
    }
  });
}

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
  at::NoGradGuard no_grad;
  const at::Tensor flat = out.view({n});
  const bool direct = out.is_cpu();
  const at::Tensor host =
      direct ? at::Tensor() : at::empty({std::min(n, kBlock)}, at::TensorOptions().dtype(out.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "init_slice", [&] {
    for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
      const int64_t len = std::min(kBlock, n - b0);
      scalar_t* dst = direct ? flat.data_ptr<scalar_t>() + b0 : host.data_ptr<scalar_t>();
      generate(dst, len, first + b0, key, normal, rule.a);
      if (!direct) flat.narrow(0, b0, len).copy_(host.narrow(0, 0, len));
    }
  });
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

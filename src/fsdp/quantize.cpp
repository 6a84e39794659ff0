#include "fsdp/quantize.h"

#include "fsdp/common/error.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace fsdp::detail {

namespace {

constexpr float kQMax = 127.0f;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The blocks of a chunk on the flat grid (Note [Block int8]): block b covers
// chunk elements [lo, hi).
struct Grid {
  int64_t n, phase, block;  // phase: how far into its grid block the chunk starts
  int64_t count() const { return n == 0 ? 0 : (phase + n + block - 1) / block; }
  int64_t lo(int64_t b) const { return std::max<int64_t>(0, b * block - phase); }
  int64_t hi(int64_t b) const { return std::min(n, (b + 1) * block - phase); }
};

Grid grid(int64_t n, int64_t start, int64_t block) {
  FSDP_ASSERT(block >= 1 && n >= 0 && start >= 0, "int8 chunk: block ", block, ", n ", n, ", start ", start);
  const Grid g{n, start % block, block};
  FSDP_ASSERT(g.count() <= int8_scale_count(n, block), "int8 chunk of ", n, " elements at ", start,
              " holds more blocks of ", block, " than its ", int8_scale_count(n, block), " scale slots");
  return g;
}

// Blocks [b0, b1) of a chunk, in parallel when there are many (each block is
// independent, and the stochastic stream of a block depends only on the seed
// and the block's index: the result does not depend on the thread count).
template <typename F>
void for_blocks(int64_t blocks, int64_t block, F f) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / block);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
}

}  // namespace

int64_t int8_scale_count(int64_t n, int64_t block) {
  // B | n: chunks start on the grid. Else the worst start, B - 1 past a grid line.
  return n % block == 0 ? n / block : (n + 2 * block - 2) / block;
}

int64_t int8_chunk_bytes(int64_t n, int64_t block) {
  const int64_t bytes = 4 * int8_scale_count(n, block) + n;
  return (bytes + 7) / 8 * 8;
}

void quantize_int8(const float* x, int64_t n, int64_t start, int64_t block, Rounding rounding, uint64_t seed,
                   uint8_t* out) {
  const Grid g = grid(n, start, block);
  const int64_t slots = int8_scale_count(n, block);
  auto* scales = reinterpret_cast<float*>(out);
  auto* q = reinterpret_cast<int8_t*>(out + 4 * slots);
  // Slots this chunk does not use, and the padding after its values, go out as zeros (deterministic bytes).
  std::memset(out + 4 * g.count(), 0, static_cast<size_t>(4 * (slots - g.count())));
  std::memset(out + 4 * slots + n, 0, static_cast<size_t>(int8_chunk_bytes(n, block) - 4 * slots - n));
  for_blocks(g.count(), block, [&](int64_t b) {
    const int64_t i0 = g.lo(b);
    const int64_t len = g.hi(b) - i0;
    const float* xb = x + i0;
    float amax = 0.0f;
    float probe = 0.0f;  // NaN when any value is NaN or infinite (inf * 0 is NaN)
    for (int64_t i = 0; i < len; ++i) {
      amax = std::max(amax, std::fabs(xb[i]));
      probe += xb[i] * 0.0f;
    }
    const bool finite = probe == 0.0f;
    // A non-finite block arrives as NaN (0 * NaN): the gradient norm shows it.
    const float scale = finite ? amax / kQMax : std::numeric_limits<float>::quiet_NaN();
    std::memcpy(scales + b, &scale, sizeof(scale));
    int8_t* qb = q + i0;
    if (!finite || amax == 0.0f) {
      std::memset(qb, 0, static_cast<size_t>(len));
      return;
    }
    const float inv = kQMax / amax;
    if (rounding == Rounding::kNearest) {
      for (int64_t i = 0; i < len; ++i) qb[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
      return;
    }
    // xorshift64* seeded per block: cheap, and independent of how blocks are split over threads.
    uint64_t s = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(b)));
    s = s == 0 ? 1 : s;
    for (int64_t i = 0; i < len; ++i) {
      s ^= s >> 12;
      s ^= s << 25;
      s ^= s >> 27;
      const float u = static_cast<float>((s * 0x2545F4914F6CDD1DULL) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      const float v = std::floor(xb[i] * inv + u);
      qb[i] = static_cast<int8_t>(std::clamp(v, -kQMax, kQMax));
    }
  });
}

namespace {
// out[i] = x_i (kAdd false) or out[i] += x_i, x_i the chunk's values.
template <bool kAdd>
void dequantize(const uint8_t* in, int64_t n, int64_t start, int64_t block, float* out) {
  const Grid g = grid(n, start, block);
  const auto* scales = reinterpret_cast<const float*>(in);
  const auto* q = reinterpret_cast<const int8_t*>(in + 4 * int8_scale_count(n, block));
  for_blocks(g.count(), block, [&](int64_t b) {
    float scale;
    std::memcpy(&scale, scales + b, sizeof(scale));
    for (int64_t i = g.lo(b); i < g.hi(b); ++i) {
      const float x = scale * static_cast<float>(q[i]);
      out[i] = kAdd ? out[i] + x : x;
    }
  });
}
}  // namespace

void dequantize_int8(const uint8_t* in, int64_t n, int64_t start, int64_t block, float* out) {
  dequantize<false>(in, n, start, block, out);
}

void dequantize_int8_add(const uint8_t* in, int64_t n, int64_t start, int64_t block, float* acc) {
  dequantize<true>(in, n, start, block, acc);
}

}  // namespace fsdp::detail

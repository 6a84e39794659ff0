// Kernels of the compressed collectives (Note [Wire formats] in
// compressed_collectives.cpp): 8-bit integers with one fp32 scale per block
// of elements, quantized on the sender and dequantized on arrival. CPU.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fsdp::detail {

// Note [Block int8]
// A chunk of n values travels as ceil(n / B) fp32 scales followed by n int8
// values, padded to a multiple of 8 bytes (so the next chunk's scales stay
// aligned): int8_chunk_bytes(n, B) = 4 * ceil(n / B) + n, rounded up to 8.
// Block b (elements [bB, min((b+1)B, n))) has scale s_b = max|x| / 127 over
// the block, and x_i = s_b * q_i on arrival, q_i in [-127, 127] (-128 is not
// used, so that the range is symmetric). Rounding of x_i / s_b:
//  - kNearest: |x_i - s_b q_i| <= s_b / 2 (+ float rounding): parameters,
//    where every rank must see the same values and no bias accumulates (the
//    master copy stays fp32 and is re-quantized at every gather).
//  - kStochastic: q_i = floor(x_i / s_b + u_i), u_i uniform in [0, 1) from a
//    counter-based generator keyed by (seed, i): E[s_b q_i] = x_i and
//    |x_i - s_b q_i| < s_b. Gradients: a sum of many steps' rounded
//    gradients has no systematic error, without the per-rank residual buffer
//    (the size of the unsharded gradients) that error feedback needs.
// A block of zeros has scale 0 and dequantizes to exact zeros; a block with a
// NaN or an infinity gets a NaN scale and arrives as NaN, so the gradient
// norm shows it (no silent clipping of an overflow).
enum class Rounding { kNearest, kStochastic };

int64_t int8_scale_count(int64_t n, int64_t block);
int64_t int8_chunk_bytes(int64_t n, int64_t block);

// x: n contiguous float32 values -> `out` (int8_chunk_bytes(n, block) bytes).
void quantize_int8(const float* x, int64_t n, int64_t block, Rounding rounding, uint64_t seed, uint8_t* out);
// The chunk at `in` (n values) -> out[0, n) (float32), overwritten.
void dequantize_int8(const uint8_t* in, int64_t n, int64_t block, float* out);
// acc[0, n) += the chunk's values, in float32.
void dequantize_int8_add(const uint8_t* in, int64_t n, int64_t block, float* acc);

}  // namespace fsdp::detail

// Kernels of the compressed collectives (Note [Wire formats] in
// compressed_collectives.cpp): 8-bit integers with one fp32 scale per block
// of elements, quantized on the sender and dequantized on arrival. CPU.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fsdp::detail {

// Note [Block int8]
// Blocks follow the flat parameter's index grid, not the chunk: block k is
// flat elements [kB, (k+1)B), cut where a rank's chunk begins and ends. A
// chunk of n values that starts at flat index `start` holds
// ceil((start mod B + n) / B) blocks, the first and last possibly partial.
// Why the grid: a parameter whose offset and size are multiples of B (every
// Llama weight at B = 256) then never shares a scale with its neighbour, at
// any world size. Cut per chunk instead, a chunk starting mid-grid (the 100m
// row at 4 ranks: 1,769,856 elements a chunk, 128 past a multiple of 256)
// puts the end of an RMSNorm weight (~1.0) and the start of a projection
// (~0.02) in one block, whose scale is then ~50x too coarse for the latter.
// A chunk travels as int8_scale_count(n, B) fp32 scales (the most blocks any
// chunk of n elements starting at a multiple of n can hold, so every rank's
// chunk has the same size; slots a chunk does not use are zero) followed by n
// int8 values, padded to a multiple of 8 bytes (so the next chunk's scales
// stay aligned): int8_chunk_bytes(n, B) = 4 * int8_scale_count(n, B) + n,
// rounded up to 8. Block b has scale s_b = max|x| / 127 over the block, and
// x_i = s_b * q_i on arrival, q_i in [-127, 127] (-128 is not used, so that
// the range is symmetric). Rounding of x_i / s_b:
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

// Scale slots of a chunk of n elements: n / B when B divides n (every chunk
// then starts on the grid), else the most a chunk starting anywhere can hold.
int64_t int8_scale_count(int64_t n, int64_t block);
int64_t int8_chunk_bytes(int64_t n, int64_t block);

// x: n contiguous float32 values, flat elements [start, start + n) ->
// `out` (int8_chunk_bytes(n, block) bytes). Requires: when block divides n,
// it divides start (true of a rank's chunk, which starts at a multiple of n).
void quantize_int8(const float* x, int64_t n, int64_t start, int64_t block, Rounding rounding, uint64_t seed,
                   uint8_t* out);
// The chunk at `in` (n values from flat index `start`) -> out[0, n) (float32),
// overwritten.
void dequantize_int8(const uint8_t* in, int64_t n, int64_t start, int64_t block, float* out);
// acc[0, n) += the chunk's values, in float32.
void dequantize_int8_add(const uint8_t* in, int64_t n, int64_t start, int64_t block, float* acc);

}  // namespace fsdp::detail

// Rank-order reductions (private to comm/): the local sum of the groups that
// reduce on the host, so that every CPU group gives the same bits.
// See Note [Reduce-scatter by alltoall] in tcp_group.cpp.
#pragma once

#include "fsdp/comm/process_group.h"

#include <ATen/ATen.h>

#include <vector>

namespace fsdp::comm {

// bfloat16 or float16: summed in fp32 and rounded once.
bool is_half(at::ScalarType t);

// A view of `t`'s bytes with no autograd metadata and its own version counter:
// collectives write through it so the caller's tensors keep their version (a
// collective refilling an FSDP flat buffer must not invalidate saved tensors).
at::Tensor raw(const at::Tensor& t);

// out (n elements) = op over parts[0..w) (each n elements, w >= 2) in that
// order; bf16/fp16 sums accumulate in `acc_scratch` (fp32, >= n elements) and
// round once; kAvg divides the sum by w before that rounding. `out` may not
// alias any part.
void reduce_in_rank_order(const std::vector<at::Tensor>& parts, at::Tensor out, ReduceOp op,
                          const at::Tensor& acc_scratch);

}  // namespace fsdp::comm

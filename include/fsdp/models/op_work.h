// What a part of a model does on a device, by operation class, for the
// step-time model's roofline (fsdp-inspect --estimate on a GPU cluster;
// docs/estimate.md, "What the model does"): matrix products in FLOPs,
// attention in FLOPs, everything else in bytes moved through device memory.
#pragma once

#include <cstdint>

#include "fsdp/models/layer_kernels.h"
#include "fsdp/nn/recompute_policy.h"

namespace fsdp::models {

// One pass's work. Products and attention are FLOPs (a multiply-add is 2);
// memory_bytes are the bytes the memory-bound kernels read and write (each
// reads its inputs and writes its outputs once, unless stated where counted).
struct OpWork {
  double product_flops = 0;      // in the compute dtype
  double attention_flops = 0;
  double memory_bytes = 0;
  double fp8_product_flops = 0;  // rowwise-scaled e4m3 products (WorkShape::fp8_linears)

  OpWork& operator+=(const OpWork& o) {
    product_flops += o.product_flops;
    fp8_product_flops += o.fp8_product_flops;
    attention_flops += o.attention_flops;
    memory_bytes += o.memory_bytes;
    return *this;
  }
};

// A unit's work for one micro-batch: its forward, its backward and, when it
// is checkpointed, backward's second forward under the recompute policy.
struct UnitWork {
  OpWork forward, backward, recompute;
};

// The micro-batch and how the model runs it.
struct WorkShape {
  int64_t tokens = 1;            // B x T of one micro-batch
  int64_t seq_len = 1;           // T
  int64_t activation_bytes = 2;  // bytes per element of the compute dtype (bf16: 2)
  int64_t loss_chunk_rows = 1;   // rows per chunk of the chunked loss (loss_chunk_rows)
  bool checkpointed = false;     // the unit is recomputed in backward
  nn::RecomputePolicy policy = nn::RecomputePolicy::kTail;
  LayerKernels kernels = LayerKernels::kReference;  // StepOptions::kernels
  // StepOptions::fp8_linear is kRowwise: the decoder's trainable products in
  // FP8 (models/fp8.h), their quantization counted as memory traffic.
  bool fp8_linears = false;
};

}  // namespace fsdp::models

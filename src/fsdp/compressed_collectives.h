// The engine's collectives with a compressed wire format (FsdpOptions::
// compression; Note [Wire formats] in compressed_collectives.cpp): the same
// handles as collectives.h, whose all_gather_copy_in and issue_reduction
// route here when the unit's Wire asks for it. Free functions over flat
// buffers, like collectives.h.
#pragma once

#include "fsdp/collectives.h"
#include "fsdp/fsdp.h"
#include "fsdp/quantize.h"

#include <cstdint>
#include <string>

namespace fsdp::detail {

// What one unit's collectives put on the wire in this iteration.
struct Wire {
  WireFormat gather = WireFormat::kNative;  // parameter all-gather
  WireFormat reduce = WireFormat::kNative;  // gradient reduce-scatter
  int64_t block = 256;                      // int8: elements per scale
  uint64_t seed = 0;                        // stochastic rounding of this reduction's gradients
};

// The Wire of unit `unit` in iteration `iteration`: the seed of its
// stochastic rounding differs per unit, iteration and rank, and is the same
// in every run of the same job (reproducible).
Wire wire_for(const FsdpOptions& options, int64_t iteration, const std::string& unit, int rank);

// Bytes this rank sends per peer in one all-gather of a shard of `shard_numel`
// elements whose unsharded parameters are `param_dtype` (what the wire
// format promises; the transport's counters are held to it by tests).
int64_t gather_wire_bytes(WireFormat f, int64_t shard_numel, at::ScalarType param_dtype, int64_t block);
// Bytes this rank sends per peer in one reduce-scatter whose output shard has
// `shard_numel` elements of gradients in `reduce_dtype`.
int64_t reduce_wire_bytes(WireFormat f, int64_t shard_numel, at::ScalarType reduce_dtype, int64_t block);

// all_gather_copy_in with a bf16 or int8 wire: the shard is encoded into this
// rank's chunk of a wire buffer, the wire buffers are gathered, and on
// arrival (wait_all_gather) every chunk, ours included, is decoded into
// `full`, so every rank computes with the same values.
AllGather all_gather_encoded(comm::ProcessGroup& group, const at::Tensor& shard, const at::Tensor& full,
                             const Wire& wire);

// issue_reduction with a bf16 or int8 wire (a shard group, not replicated):
// chunk j of `input` is encoded and sent to rank j (all_to_all); on arrival
// (finish_reduction) the W chunks received are decoded and summed in fp32 in
// rank order 0..W-1, then divided by W: the mean, in fp32, lands in
// `grad_shard` when it is fp32 and `may_land_in_shard`, else in a scratch.
void issue_encoded_reduction(Reduction& r, const at::Tensor& input, comm::ProcessGroup& group,
                             const at::Tensor& grad_shard, bool may_land_in_shard, MemoryLedger& ledger,
                             UnshardedPool* pool, const Wire& wire);

}  // namespace fsdp::detail

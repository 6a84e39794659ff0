// Which shard of the padded flat index space a rank holds, and whether it
// writes it (internal to the checkpoint layer: shard_files.cpp and dcp.cpp).
#pragma once

#include <cstdint>

#include "fsdp/comm/process_group.h"
#include "fsdp/fsdp.h"

namespace fsdp::checkpoint {

// S shards; this rank holds index k. HYBRID_SHARD's replicas hold identical
// shards, so only replicate rank 0 (the first shard group) writes; a
// replicated model (NO_SHARD, or a world of one) is written by rank 0.
struct ShardPosition {
  int64_t count = 1;  // S
  int64_t index = 0;  // k
  bool writer = false;
};

ShardPosition shard_position(const ShardedModel& model, const comm::ProcessGroup& group);

}  // namespace fsdp::checkpoint

#include "shard_position.h"

namespace fsdp::checkpoint {

ShardPosition shard_position(const ShardedModel& model, const comm::ProcessGroup& group) {
  ShardPosition p;
  for (const auto& u : model.units()) {
    if (u.shard_numel > 0) {
      p.count = u.padded_numel / u.shard_numel;
      p.index = u.shard_offset / u.shard_numel;
      break;
    }
  }
  const ShardingStrategy s = model.options().strategy;
  if (s == ShardingStrategy::kHybridShard && model.replicate_group()) {
    p.writer = model.replicate_group()->rank() == 0;
  } else if (p.count == 1) {
    p.writer = group.rank() == 0;  // replicated (NO_SHARD, or a world of one)
  } else {
    p.writer = true;
  }
  return p;
}

}  // namespace fsdp::checkpoint

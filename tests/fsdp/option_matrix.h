// The matrix of engine options that the schedule and memory-contract tests
// run every model through: sharding strategy x precision x prefetch x
// activation checkpointing, each combination with a name for messages.
#pragma once

#include <string>
#include <vector>

#include "fsdp/fsdp.h"

namespace fsdp::testing {

// The axes; each test names the values it runs (the default: every strategy,
// fp32 and bf16, checkpointing off and on).
struct OptionAxes {
  std::vector<ShardingStrategy> strategies = {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                              ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard};
  std::vector<std::string> precisions = {"fp32", "bf16"};  // MixedPrecision::preset names
  std::vector<bool> checkpointing = {false, true};
  // limit_all_gathers of the forward-prefetch setting (the others keep the
  // default): 1 makes forward prefetch wait for the previous gather.
  int forward_prefetch_limit = FsdpOptions{}.limit_all_gathers;
};

struct NamedOptions {
  std::string name;  // "full, bf16, prefetch pre+forward, checkpointing"
  FsdpOptions options;
};

// Every combination of `axes`, strategies outermost, checkpointing innermost,
// with the four prefetch settings (none, BACKWARD_PRE, BACKWARD_POST,
// BACKWARD_PRE + forward prefetch) between precision and checkpointing. HYBRID
// runs as shards of 2 (at 4 ranks: 2 x 2); the other options are defaults.
inline std::vector<NamedOptions> option_matrix(const OptionAxes& axes = {}) {
  struct Prefetch {
    std::string name;
    BackwardPrefetch backward;
    bool forward;
    int limit;
  };
  const int limit = FsdpOptions{}.limit_all_gathers;
  const int forward_limit = axes.forward_prefetch_limit;
  const Prefetch prefetches[] = {
      {"none", BackwardPrefetch::kNone, false, limit},
      {"pre", BackwardPrefetch::kPre, false, limit},
      {"post", BackwardPrefetch::kPost, false, limit},
      {"pre+forward" + (forward_limit == limit ? std::string() : ", limit " + std::to_string(forward_limit)),
       BackwardPrefetch::kPre, true, forward_limit}};
  std::vector<NamedOptions> out;
  for (ShardingStrategy s : axes.strategies) {
    for (const std::string& precision : axes.precisions) {
      for (const Prefetch& pf : prefetches) {
        for (bool ckpt : axes.checkpointing) {
          FsdpOptions o;
          o.strategy = s;
          o.hybrid_shard_size = 2;
          o.mixed_precision = MixedPrecision::preset(precision);
          o.backward_prefetch = pf.backward;
          o.forward_prefetch = pf.forward;
          o.limit_all_gathers = pf.limit;
          o.checkpoint_all_units = ckpt;
          out.push_back({std::string(to_string(s)) + ", " + precision + ", prefetch " + pf.name +
                             (ckpt ? ", checkpointing" : ""),
                         o});
        }
      }
    }
  }
  return out;
}

}  // namespace fsdp::testing

#include "option_names.h"

#include <utility>

#include "fsdp/common/error.h"

namespace fsdp::cli {
namespace {

// Library option -> flag, longest names first where one is a prefix of another.
const std::pair<const char*, const char*> kFlagNames[] = {
    {"FsdpOptions::offload_checkpoint_inputs", "--offload-activations"},
    {"FsdpOptions::compression.block_size", "--quant-block"},
    {"FsdpOptions::compression.reduce_scatter", "--reduce-scatter-wire"},
    {"FsdpOptions::compression.all_gather", "--all-gather-wire"},
    {"FsdpOptions::mixed_precision.reduce_dtype", "--reduce-dtype"},
    {"FsdpOptions::compression", "--all-gather-wire / --reduce-scatter-wire"},
    {"FsdpOptions::checkpoint_types", "--activation-checkpointing"},
    {"FsdpOptions::hybrid_shard_size", "--hybrid-shard-size"},
    {"FsdpOptions::reshard_after_forward", "--reshard-after-forward"},
    {"FsdpOptions::limit_all_gathers", "--limit-all-gathers"},
    {"FsdpOptions::wrap", "--wrap"},
    {"plan_sharding: world_size", "--world-size"},
    {"plan_sharding: rank", "--rank"},
};

}  // namespace

std::string in_flag_terms(const std::string& message) {
  std::string out = message;
  for (const auto& [name, flag] : kFlagNames) {
    const std::string n = name;
    for (size_t at = out.find(n); at != std::string::npos; at = out.find(n, at)) {
      out.replace(at, n.size(), flag);
      at += std::string(flag).size();
    }
  }
  return out;
}

int with_flag_names(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    throw UsageError(in_flag_terms(e.what()));
  }
}

}  // namespace fsdp::cli

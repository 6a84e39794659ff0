#include "option_names.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "fsdp/common/error.h"
#include "train_options_table.h"

namespace fsdp::cli {
namespace {

// Names the library uses in its messages that no row binds, each with why.
const std::pair<const char*, const char*> kOtherNames[] = {
    // One engine field that two rows set between them.
    {"FsdpOptions::compression", "--all-gather-wire / --reduce-scatter-wire"},
    // The engine's list of checkpointed types, which the trainer fills from the switch.
    {"FsdpOptions::checkpoint_types", "--activation-checkpointing"},
    // The conversion mode is fsdp-train's subcommand, not a row.
    {"Mode::kConvert", "fsdp-train convert"},
    // fsdp-inspect's own flags, which the plan's function names by its parameters.
    {"plan_sharding: world_size", "--world-size"},
    {"plan_sharding: rank", "--rank"},
    {"cluster_preset: name", "--cluster"},
};

// Library name -> flag: each row's field and other names (OptionRow::also),
// and the names above, longest first, so that a name that is a prefix of
// another (FsdpOptions::mixed_precision, FsdpOptions::mixed_precision.reduce_dtype)
// never takes the longer one's place.
std::vector<std::pair<std::string, std::string>> flag_names() {
  std::vector<std::pair<std::string, std::string>> names;
  for (const OptionRow& row : train_option_table()) {
    if (!row.field.empty()) names.emplace_back(row.field, row.name());
    for (const std::string& name : row.also) names.emplace_back(name, row.name());
  }
  for (const auto& [name, flag] : kOtherNames) names.emplace_back(name, flag);
  std::stable_sort(names.begin(), names.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return names;
}

}  // namespace

std::string in_flag_terms(const std::string& message) {
  static const std::vector<std::pair<std::string, std::string>> kNames = flag_names();
  std::string out = message;
  for (const auto& [name, flag] : kNames) {
    for (size_t at = out.find(name); at != std::string::npos; at = out.find(name, at)) {
      out.replace(at, name.size(), flag);
      at += flag.size();
    }
  }
  return out;
}

int with_flag_names(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    throw UsageError(in_flag_terms(e.what()));
  } catch (const Failure& e) {  // a run's failure names its options too (LogOptions::metrics_file ...)
    throw Failure(in_flag_terms(e.what()));
  }
}

}  // namespace fsdp::cli

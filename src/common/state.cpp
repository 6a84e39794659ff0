#include "fsdp/common/state.h"

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"

namespace fsdp {

int64_t saved_optimizer_step(const nlohmann::json& saved, const std::string& type) {
  FSDP_CHECK(saved.is_object(), "the checkpoint holds no optimizer state; it cannot resume training (start a new run "
             "from its weights instead)");
  const nlohmann::json type_saved = saved.value("type", nlohmann::json());
  if (!type_saved.is_string()) throw MalformedState(detail::cat("the optimizer's type ", type_saved.dump(), " is not a name"));
  const std::string was = type_saved.get<std::string>();
  FSDP_CHECK(was == type, "the checkpoint holds the state of a ", was, " optimizer; this run uses ", type, ": resume "
             "with the optimizer it was saved with, or start a new run from its weights");
  const nlohmann::json step = saved.value("step", nlohmann::json());
  if (!step.is_number_integer() || step.get<int64_t>() < 0) {
    throw MalformedState(detail::cat("the ", type, " step count ", step.dump(), " is not a count of steps"));
  }
  return step.get<int64_t>();
}

struct MetadataState::Values {
  nlohmann::json metadata;
  nlohmann::json loaded;
  Check check;
};

MetadataState::MetadataState(std::string key, const nlohmann::json& metadata, Check check)
    : key_(std::move(key)), values_(std::make_unique<Values>()) {
  values_->metadata = metadata;
  values_->check = std::move(check);
}

MetadataState::MetadataState(MetadataState&& other) noexcept = default;
MetadataState& MetadataState::operator=(MetadataState&& other) noexcept = default;
MetadataState::~MetadataState() = default;

nlohmann::json MetadataState::state_metadata() const { return values_->metadata; }

void MetadataState::load_state_metadata(const nlohmann::json& saved) {
  if (values_->check) values_->check(saved);
  values_->loaded = saved;
}

const nlohmann::json& MetadataState::loaded() const { return values_->loaded; }

}  // namespace fsdp

#include "fsdp/common/json_value.h"

#include <nlohmann/json.hpp>

#include <utility>

namespace fsdp {

JsonValue::JsonValue() : value_(std::make_unique<nlohmann::json>()) {}
JsonValue::JsonValue(const nlohmann::json& value) : value_(std::make_unique<nlohmann::json>(value)) {}
JsonValue::JsonValue(const JsonValue& other) : value_(std::make_unique<nlohmann::json>(*other.value_)) {}
// The moved-from object holds a null value, so that `*` stays valid on every object.
JsonValue::JsonValue(JsonValue&& other)
    : value_(std::exchange(other.value_, std::make_unique<nlohmann::json>())) {}
JsonValue& JsonValue::operator=(const JsonValue& other) {
  if (this != &other) *value_ = *other.value_;
  return *this;
}
JsonValue& JsonValue::operator=(JsonValue&& other) noexcept {
  if (this != &other) std::swap(value_, other.value_);
  return *this;
}
JsonValue::~JsonValue() = default;

JsonValue JsonValue::object() { return JsonValue(nlohmann::json::object()); }

}  // namespace fsdp

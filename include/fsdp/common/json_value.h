// A JSON value that public headers can hold with only <nlohmann/json_fwd.hpp>.
//
// nlohmann::json is a large template: a header that holds one by value must
// include all of json.hpp, and every file that includes that header compiles
// it. JsonValue keeps the value behind a pointer, so a struct in a public
// header can carry JSON (a checkpoint's manifest, extra config keys) while
// only the files that read or build the value include json.hpp.
//
// Value semantics: copies are deep. Access is through `*` and `->`; a
// nlohmann::json converts implicitly (`options.extra_config = j;`).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>

namespace fsdp {

class JsonValue {
 public:
  JsonValue();  // null
  JsonValue(const nlohmann::json& value);  // NOLINT(google-explicit-constructor): a value type
  JsonValue(const JsonValue& other);
  JsonValue(JsonValue&& other);  // leaves `other` null
  JsonValue& operator=(const JsonValue& other);
  JsonValue& operator=(JsonValue&& other) noexcept;  // swaps
  ~JsonValue();

  static JsonValue object();  // {}

  nlohmann::json& operator*() { return *value_; }
  const nlohmann::json& operator*() const { return *value_; }
  nlohmann::json* operator->() { return value_.get(); }
  const nlohmann::json* operator->() const { return value_.get(); }

 private:
  std::unique_ptr<nlohmann::json> value_;  // never null
};

}  // namespace fsdp

// Typed access to a config.json's fields, with errors naming the file and the
// field (the readers of registry.cpp and t5_config.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "fsdp/common/error.h"

namespace fsdp::models {

class Fields {
 public:
  // `prefix`: the dotted path of a nested object ("rope_scaling."); `instead`:
  // the alternative a "missing field" error offers ("use a preset (tiny, ...)").
  Fields(const nlohmann::json& j, std::string origin, std::string prefix, std::string instead)
      : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)), instead_(std::move(instead)) {}

  const nlohmann::json* find(const char* f) const {
    auto it = j_.find(f);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }
  const nlohmann::json& required(const char* f) const {
    const nlohmann::json* v = find(f);
    FSDP_CHECK(v != nullptr, where(), "required field '", prefix_, f, "' is missing",
               " — add it (see the config.json published with the checkpoint) or ", instead_);
    return *v;
  }
  int64_t to_int(const char* f, const nlohmann::json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
    }
    FSDP_CHECK(false, where(), "field '", prefix_, f, "' must be an integer, got ", v.dump());
    return 0;
  }
  double to_double(const char* f, const nlohmann::json& v) const {
    FSDP_CHECK(v.is_number(), where(), "field '", prefix_, f, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  int64_t req_int(const char* f) const { return to_int(f, required(f)); }
  double req_double(const char* f) const { return to_double(f, required(f)); }
  int64_t int_or(const char* f, int64_t d) const {
    const nlohmann::json* v = find(f);
    return v ? to_int(f, *v) : d;
  }
  double double_or(const char* f, double d) const {
    const nlohmann::json* v = find(f);
    return v ? to_double(f, *v) : d;
  }
  bool bool_or(const char* f, bool d) const {
    const nlohmann::json* v = find(f);
    if (!v) return d;
    FSDP_CHECK(v->is_boolean(), where(), "field '", prefix_, f, "' must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::string string_or(const char* f, const std::string& d) const {
    const nlohmann::json* v = find(f);
    if (!v) return d;
    FSDP_CHECK(v->is_string(), where(), "field '", prefix_, f, "' must be a string, got ", v->dump());
    return v->get<std::string>();
  }
  std::string where() const { return "config.json '" + origin_ + "': "; }

 private:
  const nlohmann::json& j_;
  std::string origin_;
  std::string prefix_;
  std::string instead_;
};

}  // namespace fsdp::models

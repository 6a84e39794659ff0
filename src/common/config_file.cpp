#include "fsdp/common/config_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>

// Header-only: no run-time library to ship (Debian's package also builds a shared one).
#define TOML_HEADER_ONLY 1
#define TOML_ENABLE_FORMATTERS 0
#include <toml++/toml.h>

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"

namespace fsdp {

namespace {

// The whole of a regular file of at most kMaxConfigBytes (Note [Input files]).
std::string read_config_text(const std::string& path, const std::string& flag) {
  return read_input_file(path, flag, kMaxConfigBytes,
                         "give a TOML file of options (a few lines such as seq-len = 2048)");
}

std::string where(const std::string& flag, const std::string& path, const toml::source_region& at) {
  return detail::cat(flag, " ", path, " line ", at.begin.line, ", column ", at.begin.column);
}

// A scalar's option text and type; UsageError for anything else (tables,
// nested arrays, dates).
std::pair<ConfigType, std::string> scalar(const toml::node& n, const std::string& key, const std::string& at) {
  if (const auto* s = n.as_string()) {
    // A path or name with a NUL would be cut there by the system, while its
    // suffix still chose the format (issue 39): no option takes one.
    FSDP_CHECK(s->get().find('\0') == std::string::npos, at, ": '", key, "' holds a NUL character (\\u0000), which "
               "no option takes — remove it");
    return {ConfigType::kString, s->get()};
  }
  if (const auto* i = n.as_integer()) return {ConfigType::kInteger, std::to_string(i->get())};
  if (const auto* f = n.as_floating_point()) return {ConfigType::kFloat, toml_float(f->get())};
  if (const auto* b = n.as_boolean()) return {ConfigType::kBool, b->get() ? "true" : "false"};
  FSDP_CHECK(!n.is_table(), at, ": '", key, "' is a table (a [section], a dotted key or { ... }); options are "
             "top-level keys, e.g. seq-len = 2048");
  FSDP_CHECK(!n.is_array(), at, ": '", key, "' holds an array inside an array; give one array of strings");
  FSDP_CHECK(false, at, ": '", key, "' is a date or time, which no option takes");
  return {};
}

}  // namespace

const char* to_string(ConfigType t) {
  switch (t) {
    case ConfigType::kString: return "a string";
    case ConfigType::kInteger: return "an integer";
    case ConfigType::kFloat: return "a float";
    case ConfigType::kBool: return "true or false";
    case ConfigType::kArray: return "an array";
  }
  return "?";
}

std::vector<ConfigEntry> read_config_file(const std::string& path, const std::string& flag) {
  const std::string text = read_config_text(path, flag);
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    FSDP_CHECK(false, where(flag, path, e.source()), ": ", e.description(),
               " (the file must be TOML, toml.io: key = value, each key once, strings quoted)");
  }
  std::vector<ConfigEntry> entries;
  for (auto&& [key, node] : table) {
    ConfigEntry e;
    e.key = std::string(key.str());
    const toml::source_region& src = key.source().begin.line > 0 ? key.source() : node.source();
    e.line = static_cast<int64_t>(src.begin.line);
    e.column = static_cast<int64_t>(src.begin.column);
    const std::string at = where(flag, path, src);
    if (const auto* array = node.as_array()) {
      e.type = ConfigType::kArray;
      for (size_t i = 0; i < array->size(); ++i) {
        const auto [type, value] = scalar(*array->get(i), e.key, at);
        FSDP_CHECK(i == 0 || type == e.element_type, at, ": '", e.key, "' mixes ", to_string(e.element_type),
                   " and ", to_string(type), " in one array");
        e.element_type = type;
        e.texts.push_back(value);
      }
    } else {
      const auto [type, value] = scalar(node, e.key, at);
      e.type = type;
      e.texts.push_back(value);
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const ConfigEntry& a, const ConfigEntry& b) {
    return a.line != b.line ? a.line < b.line : a.column < b.column;
  });
  return entries;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04X", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);  // the shortest text that reads back to v
  std::string s(buf, r.ptr);
  if (const size_t e = s.find('e'); e != std::string::npos) {
    // 3e-04 -> 3e-4: the exponent without leading zeros (both are TOML).
    size_t digits = e + 1 + (e + 1 < s.size() && (s[e + 1] == '-' || s[e + 1] == '+'));
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);
  } else if (s.find('.') == std::string::npos) {
    s += ".0";
  }
  return s;
}

}  // namespace fsdp

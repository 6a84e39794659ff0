#include "fsdp/common/json_input.h"

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"

namespace fsdp {
namespace {

// The byte offset where nesting first passes kMaxJsonDepth, if it does; brackets
// inside strings do not count.
std::optional<size_t> too_deep_at(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

// The key whose value the parser was reading when it failed: parsed again with
// a callback that remembers keys (only on the error path: it is slower).
std::string last_key(std::string_view text) {
  std::string key;
  const auto remember = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key) key = parsed.get<std::string>();
    return true;
  };
  try {
    (void)nlohmann::json::parse(text.begin(), text.end(), remember);
  } catch (const nlohmann::json::exception&) {
  }
  return key;
}

}  // namespace

std::optional<nlohmann::json> parse_json_input(std::string_view text, std::string& why) {
  if (const auto at = too_deep_at(text)) {
    why = detail::cat("nesting deeper than ", kMaxJsonDepth, " levels at byte ", *at);
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    why = e.what();
    if (const std::string key = last_key(text); !key.empty()) why += detail::cat(" (after the key \"", key, "\")");
  }
  return std::nullopt;
}

}  // namespace fsdp

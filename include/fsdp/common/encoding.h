// Small encodings, hashes and string tests shared by several layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fsdp {

// Whether `s` ends with `suffix` (std::string::ends_with before C++20).
inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Standard base64 (RFC 4648 alphabet) with '=' padding.
std::string base64_encode(std::string_view bytes);
// Accepts the output of base64_encode and unpadded input; std::nullopt for a
// character outside the alphabet, '=' before the end, or a dangling character.
std::optional<std::string> base64_decode(std::string_view text);

// SplitMix64's finalizer: a bijective 64-bit mix (Steele, Lea & Flood 2014).
// The project's counter-based streams (initialization, data order) use it.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 64-bit FNV-1a of a string.
inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // the FNV offset basis
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace fsdp

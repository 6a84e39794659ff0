// fsdp-train's --config FILE: options from a TOML file (toml.io, v1.0).
//
// Note [Config files]
// A config file is read as TOML by a conforming parser (toml++), never by a
// line scanner: an unclosed string, a duplicate key, an invalid escape or
// invalid UTF-8 is an error naming the line and column. Rules on top of TOML:
//  - top-level `key = value` pairs only, keys the long flag names without
//    "--" (`seq-len = 2048`); [tables], dotted keys and inline tables are
//    refused, as is a key that names no option;
//  - each value has the option's type: a string for text options
//    (`model = "tiny"`, `timeout = "30"`), an integer for whole-number options
//    (`seq-len = 2048`; a value past 2^63 - 1, only --seed's, as a string of
//    digits), an integer or float for real-number options (`lr = 3e-4`), true
//    or false for switches (`activation-checkpointing = true`), an array of
//    strings (or one string) for repeatable options (`lr-scale = ["lora_B=4"]`);
//  - the file must be a regular file of at most kMaxConfigBytes: a device
//    (/dev/zero), a FIFO or a directory is refused by kind before it is opened.
// Command-line flags override the file. fsdp-train --print-config writes the
// effective configuration in this form, so it reads back unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

inline constexpr int64_t kMaxConfigBytes = 1 << 20;

// The first line of every configuration fsdp-train writes (--print-config and
// the copies beside its records) starts so: a file that does not is a user's.
inline constexpr const char* kEffectiveConfigMarker = "# fsdp-train's effective configuration";

enum class ConfigType { kString, kInteger, kFloat, kBool, kArray };

// "a string", "an integer", "a float", "true or false", "an array".
const char* to_string(ConfigType t);

struct ConfigEntry {
  std::string key;
  ConfigType type = ConfigType::kString;
  ConfigType element_type = ConfigType::kString;  // kArray: its elements' type (all alike)
  // The value as option text: a string as it is, an integer in decimal, a float
  // as the shortest text that reads back to the same double, a bool as
  // "true"/"false"; an array: one text per element.
  std::vector<std::string> texts;
  int64_t line = 0;  // of the key, 1-based
  int64_t column = 0;
};

// The entries of TOML file `path`, in file order. UsageError naming `flag` and
// the path (with line:column where there is one) for every violation of the
// Note's rules but the key names and types, which the caller checks against
// its options.
std::vector<ConfigEntry> read_config_file(const std::string& path, const std::string& flag);

// TOML spellings for writing a config file: a basic string with TOML's
// escapes; a float that reads back to `v` exactly (always with '.' or 'e').
std::string toml_string(const std::string& s);
std::string toml_float(double v);

}  // namespace fsdp

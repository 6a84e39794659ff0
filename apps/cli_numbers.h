// Strict numbers for every numeric option of a command line (fsdp-train, fsdp-inspect).
//
// CLI11 2.1 reads integers with strtoll/strtoull in base 0 and floats with
// strtold: "010" is octal 8, "0x10" is 16, a value beyond 64 bits is clamped
// to the largest one (--seed 2^64 runs with 18446744073709551615, --warmup-steps
// 2^64 with 9223372036854775807), "-1" wraps around for unsigned options, and
// "inf", "nan" or "1e999" pass as floats. strict_numbers() puts a check in
// front of CLI11's conversion of every INT, UINT and FLOAT option: integers are
// decimal (leading zeros mean nothing) and within 64 bits, floats are finite;
// anything else is a usage error naming the flag, the value and the range.
// Narrower types (int) are still range-checked by CLI11 after this.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace fsdp::cli {

// "" when `text` is a decimal integer within 64 bits (signed or not), which it
// rewrites without leading zeros; else the reason.
inline std::string strict_integer(std::string& text, bool is_unsigned) {
  size_t i = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) i = 1;
  if (i == text.size() || text.find_first_not_of("0123456789", i) != std::string::npos) {
    return "'" + text + "' is not a whole number in decimal digits";
  }
  if (negative && is_unsigned) return "'" + text + "' is negative; this value is 0 or more";
  const size_t digits = std::min(text.find_first_not_of('0', i), text.size() - 1);
  const std::string canonical = (negative ? "-" : "") + text.substr(digits);
  errno = 0;
  if (is_unsigned) {
    (void)std::strtoull(canonical.c_str(), nullptr, 10);
  } else {
    (void)std::strtoll(canonical.c_str(), nullptr, 10);
  }
  if (errno == ERANGE) {
    return "'" + text + "' is out of range: the " + std::string(negative ? "smallest" : "largest") + " value is " +
           (is_unsigned ? std::to_string(std::numeric_limits<uint64_t>::max())
            : negative  ? std::to_string(std::numeric_limits<int64_t>::min())
                        : std::to_string(std::numeric_limits<int64_t>::max()));
  }
  text = canonical;
  return "";
}

// "" when `text` is a finite number; else the reason.
inline std::string strict_float(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
  if (!std::isfinite(v) || errno == ERANGE) return "'" + text + "' is not a finite number in double precision";
  return "";
}

// Adds the checks to every numeric option of `app` and its option groups.
inline void strict_numbers(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) {
      const bool is_unsigned = type.rfind("UINT", 0) == 0;
      opt->transform(CLI::Validator([is_unsigned](std::string& v) { return strict_integer(v, is_unsigned); }, ""));
    } else if (type.rfind("FLOAT", 0) == 0) {
      opt->transform(CLI::Validator([](std::string& v) { return strict_float(v); }, ""));
    }
  }
  for (CLI::App* group : app.get_subcommands([](CLI::App*) { return true; })) strict_numbers(*group);
}

}  // namespace fsdp::cli

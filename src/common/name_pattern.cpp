#include "fsdp/common/name_pattern.h"

#include <re2/re2.h>

#include "fsdp/common/error.h"

namespace fsdp {

namespace {

// The pattern as a message shows it: whole when short, else its start.
std::string shown(const std::string& pattern) {
  constexpr size_t kShown = 80;
  if (pattern.size() <= kShown) return "'" + pattern + "'";
  return "'" + pattern.substr(0, kShown) + "...' (" + std::to_string(pattern.size()) + " characters)";
}

}  // namespace

NamePattern::NamePattern(const std::string& pattern, const std::string& flag) : text_(pattern) {
  FSDP_CHECK(!pattern.empty(), flag, " needs a non-empty regular expression, e.g. 'lora_B' or 'layers\\.0\\.'");
  FSDP_CHECK(pattern.size() <= kMaxPatternBytes, flag, " ", shown(pattern), " is longer than ", kMaxPatternBytes,
             " characters; a pattern over parameter names needs far fewer (e.g. 'layers\\.(1[0-9]|2[0-3])\\.')");
  RE2::Options options;
  options.set_log_errors(false);  // the reason goes into our one error line, not to stderr
  options.set_max_mem(kMaxProgramBytes);
  options.set_never_capture(true);  // only whether it matches counts
  auto re = std::make_shared<const RE2>(pattern, options);
  if (!re->ok()) {
    if (re->error_code() == RE2::ErrorPatternTooLarge) {
      FSDP_CHECK(false, flag, " ", shown(pattern), " is too large to compile (over ", kMaxProgramBytes >> 20,
                 " MiB of program; repetition counts multiply); simplify it, e.g. list fewer alternatives");
    }
    FSDP_CHECK(false, flag, " ", shown(pattern), " is not a valid regular expression (", re->error(),
               "); the syntax is RE2's (github.com/google/re2/wiki/Syntax): no backreferences or lookaround, "
               "e.g. 'embed_tokens|layers\\.[0-3]\\.'");
  }
  re_ = std::move(re);
}

bool NamePattern::found_in(const std::string& name) const { return RE2::PartialMatch(name, *re_); }

}  // namespace fsdp

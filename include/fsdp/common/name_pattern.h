// Regular expressions a user gives to select parameters by name (fsdp-train's
// and fsdp-inspect's --freeze, fsdp-train's --lr-scale REGEX=FACTOR).
//
// Note [User patterns]
// A pattern is the user's: it must neither run without bound nor crash the
// process. std::regex backtracks (`^([a-z_.0-9]+)+!` ran for minutes on one
// parameter name) and recurses per nested group (20,000 of them overflowed the
// stack). NamePattern uses RE2 instead: matching takes time linear in the
// name, and compiling is bounded by kMaxPatternBytes of text and
// kMaxProgramBytes of compiled program; beyond them the pattern is refused
// with a UsageError that names the flag.
//
// Accepted syntax: RE2's (the common Perl/Python/ECMAScript subset): literals,
// `.`, classes `[a-z]` `\d` `\w` `\s` and `\p{L}`, anchors `^` `$` `\b`,
// alternation `|`, groups `(...)` `(?:...)`, repetition `* + ? {n,m}` (m <=
// 1000) and their lazy forms, flags `(?i)`. Not accepted (refused by name):
// backreferences `\1` and lookaround `(?=` `(?!` `(?<=` `(?<!`, which no
// linear-time engine can offer. A pattern is searched anywhere in the
// qualified name (`lora_B` finds `model.layers.0.self_attn.q_proj.lora_B.weight`);
// anchor it with ^ and $ to match a whole name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace re2 {
class RE2;
}

namespace fsdp {

class NamePattern {
 public:
  // Longest pattern text accepted: no name selection needs more, and RE2's
  // parser is only quiet and quick within such sizes.
  static constexpr size_t kMaxPatternBytes = 16 * 1024;
  // RE2's max_mem: the compiled program's budget (`(a{1000}){1000}` and
  // 200,000 alternatives exceed it).
  static constexpr int64_t kMaxProgramBytes = 8 << 20;

  // Compiles `pattern`. UsageError naming `flag` and the pattern (cut to 80
  // characters) when it is empty, longer than kMaxPatternBytes, not RE2 syntax
  // (with RE2's reason and the syntax page), or too large to compile.
  NamePattern(const std::string& pattern, const std::string& flag);

  // Whether the pattern matches somewhere in `name` (RE2::PartialMatch).
  // Time linear in name.size(). Thread-safe.
  bool found_in(const std::string& name) const;

  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::shared_ptr<const re2::RE2> re_;  // shared: NamePattern is copied into rules
};

}  // namespace fsdp

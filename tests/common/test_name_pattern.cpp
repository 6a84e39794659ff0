// User patterns (--freeze, --lr-scale) run in linear time with bounded
// compilation (Note [User patterns]): the patterns that hung or crashed
// std::regex are answered at once, refused patterns name the flag.
#include <gtest/gtest.h>

#include <string>

#include "fsdp/common/name_pattern.h"
#include "support/errors.h"

using fsdp::NamePattern;
using fsdp::testing::usage_error_of;

TEST(NamePattern, SearchesAnywhereInTheName) {
  const NamePattern p("layers\\.[0-3]\\.|embed", "--freeze");
  EXPECT_TRUE(p.found_in("model.layers.2.mlp.up_proj.weight"));
  EXPECT_TRUE(p.found_in("model.embed_tokens.weight"));
  EXPECT_FALSE(p.found_in("model.layers.4.mlp.up_proj.weight"));
  EXPECT_TRUE(NamePattern("^model\\.norm\\.weight$", "--freeze").found_in("model.norm.weight"));
  EXPECT_FALSE(NamePattern("^norm", "--freeze").found_in("model.norm.weight"));
  EXPECT_TRUE(NamePattern("(?i)LORA_b", "--lr-scale").found_in("q_proj.lora_B.weight"));
}

// std::regex backtracked exponentially on this pattern (a run killed after 30 s
// on one parameter name); RE2 answers in time linear in the name.
TEST(NamePattern, CatastrophicBacktrackingPatternIsLinear) {
  const NamePattern p("^([a-z_.0-9]+)+!", "--freeze");
  const std::string name = "model.layers.0.self_attn.q_proj.weight" + std::string(100000, 'a');
  EXPECT_FALSE(p.found_in(name));
  EXPECT_FALSE(p.found_in("model.layers.0.self_attn.q_proj.weight"));
}

// 20,000 nested groups overflowed std::regex's recursion (SIGSEGV).
TEST(NamePattern, DeeplyNestedGroupsNeitherCrashNorHang) {
  const std::string nested = std::string(5000, '(') + "proj" + std::string(5000, ')');
  EXPECT_TRUE(NamePattern(nested, "--freeze").found_in("q_proj.weight"));
  const std::string deeper = std::string(20000, '(') + "proj" + std::string(20000, ')');
  EXPECT_CONTAINS(usage_error_of([&] { NamePattern(deeper, "--freeze"); }), "longer than 16384 characters");
}

TEST(NamePattern, RefusalsNameTheFlagAndTheSyntax) {
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("(a)\\1", "--freeze"); }), "--freeze '(a)\\1' is not a valid");
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("(?=lookahead)", "--lr-scale"); }), "RE2");
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("(unclosed", "--lr-scale"); }), "--lr-scale '(unclosed'");
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("", "--freeze"); }), "--freeze needs a non-empty");
  // Nested repetition counts multiply beyond RE2's bound of 1000.
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("((((a{100}){100}){100}){100})", "--freeze"); }),
                  "invalid repetition size");
  // A large class repeated: compiled, it would exceed the program budget.
  EXPECT_CONTAINS(usage_error_of([] { NamePattern("\\pL{1000}", "--lr-scale"); }), "too large to compile");
}

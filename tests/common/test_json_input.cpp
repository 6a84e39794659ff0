// JSON a user hands us: nesting is bounded before parsing (printing and walking
// a value recurse), and every parser error names where it happened (issue 16).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "fsdp/common/json_input.h"

namespace {

std::string why_not(const std::string& text) {
  std::string why;
  const auto parsed = fsdp::parse_json_input(text, why);
  EXPECT_FALSE(parsed.has_value()) << text.substr(0, 80);
  return why;
}

TEST(JsonInput, ParsesWhatNlohmannParses) {
  std::string why;
  const auto j = fsdp::parse_json_input(R"({"a": [1, 2, {"b": "x]]]"}], "c": 1e300})", why);
  ASSERT_TRUE(j.has_value()) << why;
  EXPECT_EQ((*j)["a"][2]["b"], "x]]]");
  EXPECT_DOUBLE_EQ((*j)["c"].get<double>(), 1e300);
}

TEST(JsonInput, DeepNestingIsRefusedBeforeParsing) {
  // 200,000 levels overflowed the stack when printed (the tokenizer's SIGSEGV).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_NE(why_not(deep).find("nesting deeper than 256 levels at byte 256"), std::string::npos);
  // The limit itself is fine; brackets inside strings and escaped quotes do not count.
  const int limit = fsdp::kMaxJsonDepth;
  std::string why;
  EXPECT_TRUE(fsdp::parse_json_input(std::string(limit, '[') + std::string(limit, ']'), why).has_value()) << why;
  EXPECT_TRUE(fsdp::parse_json_input("[\"\\\"" + std::string(1000, '[') + "\"]", why).has_value()) << why;
}

TEST(JsonInput, NumberOverflowNamesTheKey) {
  const std::string why = why_not(R"({"hidden_size": 64, "vocab_size": 1e400})");
  EXPECT_NE(why.find("number overflow"), std::string::npos) << why;
  EXPECT_NE(why.find("(after the key \"vocab_size\")"), std::string::npos) << why;
}

TEST(JsonInput, SyntaxErrorsSayWhere) {
  const std::string why = why_not(R"({"a": 1,)");
  EXPECT_NE(why.find("parse error"), std::string::npos) << why;
  EXPECT_NE(why.find("\"a\""), std::string::npos) << why;
}

}  // namespace

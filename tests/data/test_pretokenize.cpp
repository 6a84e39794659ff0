// The Llama 3 pre-tokenizer and its Unicode classes. Expected splits were checked
// against the regex itself (Python's `regex` module, which has \p{L}).
#include <gtest/gtest.h>

#include "fsdp/data/pretokenize.h"

#include <random>
#include <string>
#include <vector>

using namespace fsdp::data;

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  for (auto piece : llama3_pretokenize(text)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(split("I'm you're we've he'll she'd it's don't"),
            (Pieces{"I", "'m", " you", "'re", " we", "'ve", " he", "'ll", " she", "'d", " it", "'s", " don", "'t"}));
  EXPECT_EQ(split("HE'S don'T"), (Pieces{"HE", "'S", " don", "'T"}));
  EXPECT_EQ(split("'hello"), (Pieces{"'hello"}));  // not a contraction: prefix + letters
  EXPECT_EQ(split("it'\xC5\xBF"), (Pieces{"it", "'\xC5\xBF"}));  // U+017F folds to s
}

TEST(Pretokenize, NumbersInGroupsOfThree) {
  EXPECT_EQ(split("1234567 89"), (Pieces{"123", "456", "7", " ", "89"}));
  EXPECT_EQ(split("$100.50"), (Pieces{"$", "100", ".", "50"}));
  EXPECT_EQ(split("12abc a1b"), (Pieces{"12", "abc", " a", "1", "b"}));
  // Arabic-Indic digits (Nd), a Roman numeral (Nl) and a vulgar fraction (No).
  EXPECT_EQ(split("٣٤٥٦ Ⅻ½"), (Pieces{"٣٤٥", "٦", " ", "Ⅻ½"}));
}

TEST(Pretokenize, PunctuationAndNewlines) {
  EXPECT_EQ(split("Hello, world!!!\n\nNext"), (Pieces{"Hello", ",", " world", "!!!\n\n", "Next"}));
  EXPECT_EQ(split("(hello)"), (Pieces{"(hello", ")"}));
  EXPECT_EQ(split("..."), (Pieces{"..."}));
  EXPECT_EQ(split(" ..."), (Pieces{" ..."}));
  EXPECT_EQ(split("  ..."), (Pieces{" ", " ..."}));
  EXPECT_EQ(split("line1\r\nline2"), (Pieces{"line", "1", "\r\n", "line", "2"}));
  EXPECT_EQ(split("abc\n"), (Pieces{"abc", "\n"}));
}

TEST(Pretokenize, LeadingSpacesAndWhitespaceRuns) {
  EXPECT_EQ(split("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(split("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split("x \n y"), (Pieces{"x", " \n", " y"}));
  EXPECT_EQ(split("  \n  hello"), (Pieces{"  \n", " ", " hello"}));
  EXPECT_EQ(split("\t\tindent"), (Pieces{"\t", "\tindent"}));
  EXPECT_EQ(split("a\u00A0b"), (Pieces{"a", "\u00A0b"}));                       // NBSP is \s
  EXPECT_EQ(split("x\u3000\u3000y"), (Pieces{"x", "\u3000", "\u3000y"}));        // ideographic space
}

TEST(Pretokenize, NonAsciiLetters) {
  EXPECT_EQ(split("über café naïve"), (Pieces{"über", " café", " naïve"}));
  EXPECT_EQ(split("日本語のテキスト"), (Pieces{"日本語のテキスト"}));
  EXPECT_EQ(split("Ωμέγα Утро"), (Pieces{"Ωμέγα", " Утро"}));
  EXPECT_EQ(split("👋 hi 🌍!"), (Pieces{"👋", " hi", " 🌍!"}));
  // A combining accent (Mn) is not a letter: it becomes the prefix of what follows.
  EXPECT_EQ(split("e\u0301t\u00E9"), (Pieces{"e", "\u0301t\u00E9"}));
}

TEST(Pretokenize, InvalidUtf8BytesAreOtherCharacters) {
  EXPECT_EQ(split("a\xFF" "b"), (Pieces{"a", "\xFF" "b"}));
  EXPECT_EQ(split("\xC3"), (Pieces{"\xC3"}));              // truncated sequence
  EXPECT_EQ(split("\xE0\x80\x80!"), (Pieces{"\xE0\x80\x80!"}));  // overlong form
  EXPECT_EQ(split("\xED\xA0\x80"), (Pieces{"\xED\xA0\x80"}));    // UTF-16 surrogate
}

TEST(Pretokenize, PiecesCoverTheInputOnRandomText) {
  const std::vector<std::string> alphabet = {"a", "Z", "é", "日", "7", "٣", " ", "  ", "\n", "\r", "\t", "'", "s",
                                             "ll", "!", ".", "👋", "\u00A0", "\u0301", "\xFF", "\xC3"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (auto piece : llama3_pretokenize(text)) {
      ASSERT_FALSE(piece.empty());
      joined += piece;
    }
    ASSERT_EQ(joined, text);
  }
}

TEST(Unicode, Classes) {
  using namespace unicode;
  for (uint32_t cp : {0x41u, 0x7Au, 0xE9u, 0x3A9u, 0x416u, 0x65E5u, 0x30C6u, 0xAC00u, 0x1D400u, 0x2B740u})
    EXPECT_TRUE(is_letter(cp)) << std::hex << cp;
  for (uint32_t cp : {0x30u, 0x39u, 0x663u, 0x216Bu, 0xBDu, 0x1D7CEu}) EXPECT_TRUE(is_number(cp)) << std::hex << cp;
  for (uint32_t cp : {0x20u, 0x0Au, 0x0Du, 0x85u, 0xA0u, 0x1680u, 0x2003u, 0x2028u, 0x202Fu, 0x3000u})
    EXPECT_TRUE(is_space(cp)) << std::hex << cp;
  for (uint32_t cp : {0x21u, 0x301u, 0x1F44Bu, 0x200Bu, 0x1Cu, kInvalidCodePoint}) {
    EXPECT_FALSE(is_letter(cp)) << std::hex << cp;
    EXPECT_FALSE(is_number(cp)) << std::hex << cp;
    EXPECT_FALSE(is_space(cp)) << std::hex << cp;
  }
  int len = 0;
  EXPECT_EQ(decode_utf8("\xF0\x9F\x91\x8B", 0, len), 0x1F44Bu);
  EXPECT_EQ(len, 4);
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80", 0, len), kInvalidCodePoint);  // above U+10FFFF
  EXPECT_EQ(len, 1);
}

// Qwen2's regex: the Llama 3 one with every number its own piece.
TEST(Pretokenize, Qwen2SplitsEveryNumber) {
  std::vector<std::string> got;
  for (auto p : qwen2_pretokenize("x1234 56, y")) got.emplace_back(p);
  EXPECT_EQ(got, (Pieces{"x", "1", "2", "3", "4", " ", "5", "6", ",", " y"}));
}

// GPT-2's regex (ByteLevel use_regex), checked against the tokenizers library's
// ByteLevel pre-tokenizer: case-sensitive contractions, a space only before a
// letter, number or "other" run.
TEST(Pretokenize, Gpt2Regex) {
  std::vector<std::string> got;
  for (auto p : gpt2_pretokenize("I'm  don'T 'S hello123 x\u00a0y   end")) got.emplace_back(p);
  EXPECT_EQ(got, (Pieces{"I", "'m", " ", " don", "'", "T", " '", "S", " hello", "123", " x", "\u00a0", "y", "  ",
                         " end"}));
}

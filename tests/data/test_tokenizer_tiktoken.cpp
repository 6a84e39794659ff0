// TiktokenTokenizer: a small rank file built in the test, the BPE merge order
// against a direct transcription of tiktoken's algorithm, specials, file errors.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/pretokenize.h"
#include "fsdp/data/tokenizer.h"

#include <algorithm>
#include <climits>
#include <map>
#include <random>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

std::string b64(const std::string& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

// Ranks 0..255: the single bytes in a scrambled order (b -> 7b+3 mod 256, so no code
// may assume rank == byte); then `merges` in order.
std::vector<std::string> rank_table(const std::vector<std::string>& merges) {
  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[(7 * b + 3) % 256] = std::string(1, static_cast<char>(b));
  tokens.insert(tokens.end(), merges.begin(), merges.end());
  return tokens;
}

std::string rank_file(const std::vector<std::string>& tokens) {
  std::string out;
  for (size_t r = 0; r < tokens.size(); ++r) out += b64(tokens[r]) + " " + std::to_string(r) + "\n";
  return out;
}

// tiktoken's _byte_pair_merge, transcribed: rescan all pairs, merge the lowest rank
// (leftmost on ties), until no pair has a rank.
std::vector<int32_t> reference_bpe(const std::map<std::string, int32_t>& ranks, const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<long>(at) + 1);
  }
  std::vector<int32_t> out;
  for (const auto& p : parts) out.push_back(ranks.at(p));
  return out;
}

std::map<std::string, int32_t> rank_map(const std::vector<std::string>& tokens) {
  std::map<std::string, int32_t> m;
  for (size_t r = 0; r < tokens.size(); ++r) m[tokens[r]] = static_cast<int32_t>(r);
  return m;
}

const std::vector<std::string> kMerges = {
    "th", "he", "the", " t", " the", "in", "ing", "aa",
    "\xC3\xA9",               // é
    "\xE6\x97", "\xE6\x97\xA5",  // 日
    "\xE6\x9C", "\xE6\x9C\xAC",  // 本
    "\xE6\x97\xA5\xE6\x9C\xAC",  // 日本
    " c", "ca", " ca", "caf", " caf", " caf\xC3\xA9",  // " café"
    "12", "123",
};

class TiktokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = rank_table(kMerges);
    path_ = dir_.file("tokenizer.model");
    write_file(path_, rank_file(tokens_));
  }
  int32_t rank(const std::string& s) const { return rank_map(tokens_).at(s); }

  TempDir dir_;
  std::vector<std::string> tokens_;
  std::string path_;
};

}  // namespace

TEST_F(TiktokenTest, MergesByLowestRankLeftmostFirst) {
  TiktokenTokenizer tok(path_);
  EXPECT_EQ(tok.num_ranks(), 256 + static_cast<int32_t>(kMerges.size()));
  EXPECT_EQ(tok.encode_piece("the"), (std::vector<int32_t>{rank("the")}));  // whole piece in the table
  // t,h,i,n,g: th (lowest) -> in -> ing; "thing" itself has no rank.
  EXPECT_EQ(tok.encode_piece("thing"), (std::vector<int32_t>{rank("th"), rank("ing")}));
  // h,e,t,h,e: th first (rank below he), then he, then "the" — not "he"+"the" order dependent.
  EXPECT_EQ(tok.encode_piece("hethe"), (std::vector<int32_t>{rank("he"), rank("the")}));
  // Ties go to the leftmost pair: aa + a, not a + aa.
  EXPECT_EQ(tok.encode_piece("aaa"), (std::vector<int32_t>{rank("aa"), rank("a")}));
  EXPECT_EQ(tok.encode_piece("aaaaa"), (std::vector<int32_t>{rank("aa"), rank("aa"), rank("a")}));
  EXPECT_EQ(tok.encode_piece("\xE6\x97\xA5\xE6\x9C\xAC"), (std::vector<int32_t>{rank("\xE6\x97\xA5\xE6\x9C\xAC")}));
}

TEST_F(TiktokenTest, EncodeIsPretokenizeThenBpe) {
  TiktokenTokenizer tok(path_);
  const auto ranks = rank_map(tokens_);
  const std::string text = "The theory of things: 12345 cafés in 日本!\n\n  the end";
  std::vector<int32_t> expected;
  for (auto piece : llama3_pretokenize(text)) {
    const auto part = reference_bpe(ranks, std::string(piece));
    expected.insert(expected.end(), part.begin(), part.end());
  }
  EXPECT_EQ(tok.encode(text), expected);
  // " the" is one piece and one token; "12345" splits as "123" "45".
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{rank(" the")}));
  EXPECT_EQ(tok.encode("12345"), (std::vector<int32_t>{rank("123"), rank("4"), rank("5")}));
  EXPECT_EQ(tok.encode(" café"), (std::vector<int32_t>{rank(" caf\xC3\xA9")}));
}

TEST_F(TiktokenTest, RoundTripsNonAsciiAndArbitraryBytes) {
  TiktokenTokenizer tok(path_);
  const std::string cases[] = {
      "über café naïve — déjà vu", "日本語のテキスト", "山上的雪慢慢融化", "Ωμέγα Утро 한국어",
      "emoji 👋🌍🦀 and ZWJ 👩‍💻", "tabs\tand\r\nCRLF  and   spaces   ", "invalid \xFF\xFE\xC3 bytes",
      "I'm sure they'll say it's 1,234,567.89!", "",
  };
  for (const auto& text : cases) {
    const auto ids = tok.encode(text);
    for (int32_t id : ids) ASSERT_LT(id, tok.num_ranks());
    EXPECT_EQ(tok.decode(ids), text);
  }
}

TEST_F(TiktokenTest, HeapMergeMatchesTiktokenOnRandomTables) {
  std::mt19937 rng(1234);
  const std::string alphabet = "abc";
  for (int table = 0; table < 20; ++table) {
    // Random merges: strings of length 2..4 over {a,b,c}, each kept with p = 1/2,
    // in random rank order.
    std::vector<std::string> merges;
    std::vector<std::string> all = {""};
    for (int len = 1; len <= 4; ++len) {
      std::vector<std::string> next;
      for (const auto& s : all)
        for (char c : alphabet) next.push_back(s + c);
      all = next;
      if (len >= 2)
        for (const auto& s : all)
          if (rng() % 2) merges.push_back(s);
    }
    std::shuffle(merges.begin(), merges.end(), rng);
    const auto tokens = rank_table(merges);
    const auto ranks = rank_map(tokens);
    TempDir dir;
    write_file(dir.file("r.model"), rank_file(tokens));
    TiktokenTokenizer tok(dir.file("r.model"));
    for (int trial = 0; trial < 200; ++trial) {
      std::string piece;
      const int len = 1 + static_cast<int>(rng() % 40);
      for (int i = 0; i < len; ++i) piece += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(tok.encode_piece(piece), reference_bpe(ranks, piece)) << "table " << table << " piece " << piece;
    }
  }
}

TEST_F(TiktokenTest, Llama3SpecialTokensFollowTheRanks) {
  TiktokenTokenizer tok(path_);
  const int32_t n = tok.num_ranks();
  EXPECT_EQ(tok.vocab_size(), n + 256);
  // For Llama 3 (n = 128000) these are 128000, 128001, 128006, 128007, 128009.
  EXPECT_EQ(tok.bos_id(), n);
  EXPECT_EQ(tok.eos_id(), n + 1);
  EXPECT_EQ(tok.special_id("<|begin_of_text|>"), n);
  EXPECT_EQ(tok.special_id("<|end_of_text|>"), n + 1);
  EXPECT_EQ(tok.special_id("<|start_header_id|>"), n + 6);
  EXPECT_EQ(tok.special_id("<|end_header_id|>"), n + 7);
  EXPECT_EQ(tok.special_id("<|eom_id|>"), n + 8);
  EXPECT_EQ(tok.special_id("<|eot_id|>"), n + 9);
  EXPECT_EQ(tok.special_id("<|python_tag|>"), n + 10);
  EXPECT_EQ(tok.special_id("<|reserved_special_token_0|>"), n + 2);
  EXPECT_EQ(tok.special_id("<|reserved_special_token_2|>"), n + 11);
  EXPECT_EQ(tok.special_id("<|reserved_special_token_246|>"), n + 255);
  EXPECT_EQ(tok.special_id("<|reserved_special_token_247|>"), -1);
  EXPECT_EQ(tok.decode({tok.bos_id(), rank("the"), tok.special_id("<|eot_id|>")}), "<|begin_of_text|>the<|eot_id|>");
  // Special text in the input is encoded as ordinary text.
  for (int32_t id : tok.encode("<|eot_id|>")) EXPECT_LT(id, n);
  const auto msg = error_of<fsdp::UsageError>([&] { tok.decode({n + 256}); });
  EXPECT_CONTAINS(msg, "cannot decode id " + std::to_string(n + 256));
}

TEST_F(TiktokenTest, MakeTokenizerDetectsTheRankFile) {
  EXPECT_TRUE(looks_like_tiktoken_file(path_));
  const auto tok = make_tokenizer(path_);
  EXPECT_EQ(tok->name(), "tiktoken:" + path_);
  EXPECT_EQ(tok->decode(tok->encode("the café")), "the café");
}

TEST(TiktokenFile, ErrorsNameTheLine) {
  TempDir dir;
  const auto tokens = rank_table({"th"});
  auto load = [&](const std::string& content) {
    write_file(dir.file("t.model"), content);
    return error_of<fsdp::UsageError>([&] { TiktokenTokenizer tok(dir.file("t.model")); });
  };
  std::string good = rank_file(tokens);
  // Bad base64 on line 3.
  std::string bad = good;
  bad.replace(bad.find('\n', bad.find('\n') + 1) + 1, 1, "!");
  auto msg = load(bad);
  EXPECT_CONTAINS(msg, "line 3");
  EXPECT_CONTAINS(msg, "base64");
  // A repeated rank.
  msg = load(good + b64("zz") + " 5\n");
  EXPECT_CONTAINS(msg, "rank 5 repeats line 6");
  // A gap: rank 300 with 258 entries.
  msg = load(good + b64("zz") + " 300\n");
  EXPECT_CONTAINS(msg, "line 258: rank 300");
  // A missing single byte: drop the line of rank 0 and renumber.
  std::string missing;
  for (size_t r = 1; r < tokens.size(); ++r) missing += b64(tokens[r]) + " " + std::to_string(r - 1) + "\n";
  msg = load(missing);
  EXPECT_CONTAINS(msg, "no token for the byte 0x");
  // The same token twice.
  msg = load(good + b64("th") + " 257\n");
  EXPECT_CONTAINS(msg, "repeats the token of rank 256");
  // Not a number.
  msg = load(good + b64("zz") + " x7\n");
  EXPECT_CONTAINS(msg, "line 258");
  msg = load("");
  EXPECT_CONTAINS(msg, "is empty");
}

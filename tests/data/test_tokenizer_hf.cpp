// tokenizer.json loading, resolution and input checks on small hand-written files.
// Tokenization itself is compared id for id with the tokenizers library in
// tests/tokenizers/test_hf_tokenizers.py.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/pretokenize.h"
#include "fsdp/data/tokenizer.h"

#include <filesystem>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

// A character-level BPE: "a" "b" "c" merge as (a b) then (ab c); <unk> for the rest.
const char* const kTiny = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 5, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4}, "merges": [["a", "b"]]}
})";

}  // namespace

TEST(HfTokenizer, TinyBpeEncodesAndDecodes) {
  TempDir dir;
  write_file(dir.file("tokenizer.json"), kTiny);
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "<eos>", "bos_token": null})");
  const auto tok = make_tokenizer(dir.path());  // a model directory
  EXPECT_EQ(tok->name(), "hf:" + dir.file("tokenizer.json"));
  EXPECT_EQ(tok->encode("abcab"), (std::vector<int32_t>{4, 3, 4}));
  EXPECT_EQ(tok->encode("xyab<eos>"), (std::vector<int32_t>{0, 4, 5}));  // unknowns fused; the special
  EXPECT_EQ(tok->encode(""), std::vector<int32_t>{});
  EXPECT_EQ(tok->vocab_size(), 6);
  EXPECT_EQ(tok->eos_id(), 5);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->decode({4, 3, 5}), "ab c <eos>");  // no decoder: the library joins with spaces
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { tok->decode({6}); }), "cannot decode id 6");
}

TEST(HfTokenizer, InvalidUtf8IsAnErrorWithTheOffset) {
  TempDir dir;
  write_file(dir.file("tokenizer.json"), kTiny);
  HfTokenizer tok(dir.file("tokenizer.json"));
  const auto msg = error_of<fsdp::UsageError>([&] { tok.encode(std::string("ab\xC3(", 4)); });
  EXPECT_CONTAINS(msg, "not valid UTF-8 at byte 2");
}

TEST(HfTokenizer, UnkTokenOutsideTheVocabularyFailsWhenNeeded) {
  TempDir dir;
  std::string json = kTiny;
  json.replace(json.find("\"unk_token\": \"<unk>\""), 20, "\"unk_token\": \"<UNK>\"");
  write_file(dir.file("tokenizer.json"), json);
  HfTokenizer tok(dir.file("tokenizer.json"));
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{4}));  // as the library: only an unknown character fails
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { tok.encode("abz"); }), "unk_token \"<UNK>\" is not in the vocabulary");
}

TEST(HfTokenizer, FilesAndDirectoriesAreRecognised) {
  TempDir dir;
  write_file(dir.file("bad.json"), "{\"model\": ");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("bad.json")); }), "is not valid JSON");
  write_file(dir.file("other.json"), "  {\"vocab\": {}}");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("other.json")); }), "has no \"model\"");
  std::filesystem::create_directory(dir.file("empty"));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(dir.file("empty")); }),
                  "has neither tokenizer.json nor tokenizer.model");
  // A directory with only a (tiktoken) tokenizer.model uses it.
  std::filesystem::create_directory(dir.file("llama3"));
  std::string ranks;
  const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int b = 0; b < 256; ++b) {
    const unsigned v = static_cast<unsigned>(b);
    ranks += std::string{b64[v >> 2], b64[(v & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  write_file(dir.file("llama3/tokenizer.model"), ranks);
  EXPECT_EQ(make_tokenizer(dir.file("llama3"))->name(), "tiktoken:" + dir.file("llama3/tokenizer.model"));
}

TEST(HfUnicode, NfcAsTheLibrary) {
  using unicode::nfc;
  EXPECT_EQ(nfc("abc"), "abc");
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");                 // composes
  EXPECT_EQ(nfc("\u212b"), "\u00c5");                  // singleton decomposition (Angstrom sign)
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");    // canonical order, nothing to compose
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");      // Hangul L V T
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");            // composition exclusion stays decomposed
  // U+1DF6 (Unicode 10) is unknown to the library's Unicode 9.0 tables: a starter, so
  // U+0301 after it does not move before it (Python's unicodedata would reorder).
  EXPECT_EQ(nfc("a\u1df6\u0301"), "a\u1df6\u0301");
  EXPECT_EQ(unicode::utf8_lossy(std::string("a\xE2\x82", 3) + "b\xFF"), "a\uFFFDb\uFFFD");
  EXPECT_EQ(unicode::find_invalid_utf8("ok \u00e9"), std::string_view::npos);
}

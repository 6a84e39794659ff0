// Token datasets: every source type, packing with EOS, validation and errors.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"

#include <filesystem>
#include <numeric>

#include <unistd.h>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

std::vector<int32_t> all_tokens(const TokenDataset& d) {
  std::vector<int32_t> out(static_cast<size_t>(d.size()));
  d.read(0, d.size(), out.data());
  return out;
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<int32_t> iota(int32_t n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

constexpr int32_t kEos = ByteTokenizer::kEos;
constexpr int32_t kBos = ByteTokenizer::kBos;

}  // namespace

TEST(Dataset, PlainTextIsOneDocumentEndedByEos) {
  TempDir dir;
  const std::string text = "First paragraph.\n\nSecond paragraph, same document. Ünïcödé 日本\n";
  write_file(dir.file("book.txt"), text);
  ByteTokenizer tok;
  const auto d = load_dataset({dir.file("book.txt")}, &tok);
  EXPECT_EQ(all_tokens(*d), concat({bytes_of(text), {kEos}}));
  EXPECT_CONTAINS(d->describe(), "text");
  EXPECT_CONTAINS(d->describe(), "1 documents");
}

TEST(Dataset, JsonLinesPackDocumentsWithEosBetween) {
  TempDir dir;
  write_file(dir.file("c.jsonl"),
             "{\"text\": \"ab\", \"id\": 1}\n"
             "\n"                               // blank lines are skipped
             "{\"text\": \"\"}\n"               // empty documents are skipped
             "{\"text\": \"c\\nd \\u00e9\"}\r\n"  // escapes, CRLF
             "{\"id\": 3, \"text\": \"xyz\"}\n");
  ByteTokenizer tok;
  const auto d = load_dataset({dir.file("c.jsonl")}, &tok);
  EXPECT_EQ(all_tokens(*d),
            concat({bytes_of("ab"), {kEos}, bytes_of("c\nd \xC3\xA9"), {kEos}, bytes_of("xyz"), {kEos}}));
  EXPECT_CONTAINS(d->describe(), "3 documents");

  DatasetOptions o{dir.file("c.jsonl")};
  o.add_bos = true;
  EXPECT_EQ(all_tokens(*load_dataset(o, &tok)), concat({{kBos}, bytes_of("ab"), {kEos}, {kBos},
                                                         bytes_of("c\nd \xC3\xA9"), {kEos}, {kBos}, bytes_of("xyz"),
                                                         {kEos}}));
}

TEST(Dataset, JsonLinesConfigurableField) {
  TempDir dir;
  write_file(dir.file("c.data"), "{\"content\": \"hi\"}\n{\"content\": \"yo\"}\n");
  ByteTokenizer tok;
  DatasetOptions o{dir.file("c.data")};
  o.format = DataFormat::kJsonl;  // the extension would say text
  o.text_field = "content";
  EXPECT_EQ(all_tokens(*load_dataset(o, &tok)), concat({bytes_of("hi"), {kEos}, bytes_of("yo"), {kEos}}));
}

TEST(Dataset, BinaryUint16AndUint32) {
  TempDir dir;
  const std::vector<int32_t> small = {0, 1, 255, 256, 65535, 42};
  write_token_file(dir.file("a.bin"), small, TokenDtype::kUint16);
  EXPECT_EQ(std::filesystem::file_size(dir.file("a.bin")), small.size() * 2);
  const auto d16 = load_dataset({dir.file("a.bin")}, nullptr);
  EXPECT_EQ(all_tokens(*d16), small);
  EXPECT_EQ(d16->at(4), 65535);

  const std::vector<int32_t> big = {0, 70000, 128255, 1 << 30, 7};
  write_token_file(dir.file("b.bin"), big, TokenDtype::kUint32);
  DatasetOptions o{dir.file("b.bin")};
  o.token_dtype = TokenDtype::kUint32;
  EXPECT_EQ(all_tokens(*load_dataset(o, nullptr)), big);
  // Raw little-endian layout on disk.
  write_file(dir.file("raw.bin"), std::string("\x01\x02\x03\x04", 4));
  EXPECT_EQ(all_tokens(*load_dataset({dir.file("raw.bin")}, nullptr)), (std::vector<int32_t>{0x0201, 0x0403}));
  o.path = dir.file("raw.bin");
  EXPECT_EQ(all_tokens(*load_dataset(o, nullptr)), (std::vector<int32_t>{0x04030201}));
  // uint16 ids do not fit a bigger vocabulary.
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { write_token_file(dir.file("c.bin"), big, TokenDtype::kUint16); }),
                  "does not fit uint16");
}

TEST(Dataset, DirectoryOfShardsIsConcatenatedByName) {
  TempDir dir;
  const auto shards = dir.file("shards");
  std::filesystem::create_directory(shards);
  // Written out of order; read in name order. Other files are ignored.
  write_token_file(shards + "/shard_002.bin", iota(5, 200), TokenDtype::kUint32);
  write_token_file(shards + "/shard_000.bin", iota(3, 0), TokenDtype::kUint32);
  write_token_file(shards + "/shard_001.bin", iota(4, 100), TokenDtype::kUint32);
  write_file(shards + "/README.txt", "not a shard");
  std::filesystem::create_directory(shards + "/sub.bin");  // a directory, not a shard
  DatasetOptions o{shards};
  o.token_dtype = TokenDtype::kUint32;
  const auto d = load_dataset(o, nullptr);
  ASSERT_EQ(d->size(), 12);
  EXPECT_EQ(all_tokens(*d), concat({iota(3, 0), iota(4, 100), iota(5, 200)}));
  // Reads that cross shard boundaries.
  std::vector<int32_t> mid(6);
  d->read(2, 6, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{2, 100, 101, 102, 103, 200}));
  EXPECT_CONTAINS(d->locate(8), "shard_002.bin, token 1 of the file");
  EXPECT_CONTAINS(d->describe(), "3 files");
  // A sampler over shards returns exactly the windows of the concatenation.
  BatchSampler s(d, {/*seq_len=*/3, /*batch_size=*/3, 1, 0, 1, 0, /*shuffle=*/false});
  const auto b = s.get(0, 0);
  EXPECT_EQ(b.inputs[1][0].item<int64_t>(), 100);
  EXPECT_EQ(b.targets[1][2].item<int64_t>(), 103);  // t[6]
}

TEST(Dataset, ValidateReportsTheFirstOutOfVocabularyToken) {
  TempDir dir;
  const auto shards = dir.file("shards");
  std::filesystem::create_directory(shards);
  write_token_file(shards + "/a.bin", {1, 2, 3}, TokenDtype::kUint16);
  write_token_file(shards + "/b.bin", {4, 511, 512, 9000}, TokenDtype::kUint16);
  const auto d = load_dataset({shards}, nullptr);
  EXPECT_NO_THROW(d->validate(9001));
  const auto msg = error_of<fsdp::UsageError>([&] { d->validate(512); });
  EXPECT_CONTAINS(msg, "token id 512 at position 5");
  EXPECT_CONTAINS(msg, "b.bin, token 2 of the file");
  EXPECT_CONTAINS(msg, "[0, 512)");
  EXPECT_CONTAINS(msg, "DatasetOptions::token_dtype");
  // Text data tokenized with a bigger vocabulary than the model's.
  ByteTokenizer tok;
  write_file(dir.file("t.txt"), "hello");
  const auto t = load_dataset({dir.file("t.txt")}, &tok);
  EXPECT_NO_THROW(t->validate(tok.vocab_size()));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { t->validate(256); }), "token id 257 at position 5");
  // uint32 ids above 2^31 are reported as their unsigned value.
  write_file(dir.file("huge.bin"), std::string("\xFF\xFF\xFF\xFF", 4));
  DatasetOptions o{dir.file("huge.bin")};
  o.token_dtype = TokenDtype::kUint32;
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset(o, nullptr)->validate(1000); }),
                  "token id 4294967295");
}

TEST(Dataset, ErrorsNameTheFile) {
  TempDir dir;
  ByteTokenizer tok;
  auto msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("missing.jsonl")}, &tok); });
  EXPECT_CONTAINS(msg, "missing.jsonl");
  EXPECT_CONTAINS(msg, "does not exist");

  write_file(dir.file("empty.txt"), "");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("empty.txt")}, &tok); }), "empty.txt' is empty");
  write_file(dir.file("empty.bin"), "");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("empty.bin")}, nullptr); }), "empty.bin' is empty");
  write_file(dir.file("empty.jsonl"), "\n\n{\"text\": \"\"}\n");
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("empty.jsonl")}, &tok); });
  EXPECT_CONTAINS(msg, "empty.jsonl' has no documents");

  write_file(dir.file("odd.bin"), "abc");
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("odd.bin")}, nullptr); });
  EXPECT_CONTAINS(msg, "odd.bin' has 3 bytes, not a multiple of 2");

  std::filesystem::create_directory(dir.file("nobins"));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("nobins")}, nullptr); }), "no *.bin files");

  write_file(dir.file("t.txt"), "text");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("t.txt")}, nullptr); }), "needs a tokenizer");

  write_file(dir.file("noread.bin"), "abcd");
  std::filesystem::permissions(dir.file("noread.bin"), std::filesystem::perms::none);
  if (::geteuid() != 0) {  // root reads anything
    EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("noread.bin")}, nullptr); }),
                    "cannot open it");
  }
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([] { parse_token_dtype("int8"); }), "choose u16 or u32");
  EXPECT_EQ(parse_token_dtype("u32"), TokenDtype::kUint32);
  EXPECT_EQ(parse_data_format("bin"), DataFormat::kBinary);
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([] { parse_data_format("csv"); }), "choose auto, text, jsonl or bin");
}

TEST(Dataset, BadJsonLineGivesTheLineNumber) {
  TempDir dir;
  ByteTokenizer tok;
  write_file(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  auto msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("bad.jsonl")}, &tok); });
  EXPECT_CONTAINS(msg, "bad.jsonl' line 3 is not valid JSON");
  write_file(dir.file("field.jsonl"), "{\"text\": \"ok\"}\n{\"body\": \"x\", \"n\": 1}\n");
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("field.jsonl")}, &tok); });
  EXPECT_CONTAINS(msg, "line 2: no field \"text\"");
  EXPECT_CONTAINS(msg, "\"body\", \"n\"");
  write_file(dir.file("type.jsonl"), "{\"text\": 5}\n");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("type.jsonl")}, &tok); }),
                  "line 1: field \"text\" is not a string");
  write_file(dir.file("array.jsonl"), "[1, 2]\n");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("array.jsonl")}, &tok); }),
                  "line 1 is JSON but not an object");
}

TEST(Dataset, TooShortForOneWindow) {
  const auto d = make_token_dataset(iota(10), "tiny");
  EXPECT_NO_THROW(BatchSampler(d, {9, 1}));
  const auto msg = error_of<fsdp::UsageError>([&] { BatchSampler(d, {10, 1}); });
  EXPECT_CONTAINS(msg, "10 tokens < SamplerOptions::seq_len + 1 = 11");
  EXPECT_CONTAINS(msg, "use SamplerOptions::seq_len <= 9");
}

TEST(Dataset, FallbackCorpusLoads) {
  ByteTokenizer tok;
  const auto train = load_dataset({repo_data_dir() + "/fallback_corpus.jsonl"}, &tok);
  const auto val = load_dataset({repo_data_dir() + "/fallback_corpus.val.jsonl"}, &tok);
  EXPECT_GT(train->size(), 5000);
  EXPECT_GT(val->size(), 500);
  EXPECT_NO_THROW(train->validate(512));  // fits the tiny model
  EXPECT_CONTAINS(train->describe(), "38 documents");
  EXPECT_CONTAINS(val->describe(), "6 documents");
}

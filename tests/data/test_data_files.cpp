// Data as the seed corpora ship it: gzip-compressed text and JSON lines (c4's
// .json.gz), directories of them, patterns; damaged gzip named with its offset.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"

#include <zlib.h>

#include <filesystem>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

// One gzip member holding `data` (zlib's deflate with the gzip wrapper).
std::string gzip(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::vector<int32_t> all_tokens(const TokenDataset& d) {
  std::vector<int32_t> out(static_cast<size_t>(d.size()));
  d.read(0, d.size(), out.data());
  return out;
}

std::vector<int32_t> docs(std::initializer_list<std::string> texts) {
  std::vector<int32_t> out;
  for (const auto& t : texts) {
    for (char c : t) out.push_back(static_cast<unsigned char>(c));
    out.push_back(ByteTokenizer::kEos);
  }
  return out;
}

std::string lines(std::initializer_list<std::string> texts) {
  std::string out;
  for (const auto& t : texts) out += "{\"text\": \"" + t + "\", \"url\": \"https://example.com\"}\n";
  return out;
}

}  // namespace

TEST(DataFiles, GzipJsonLinesReadAsPlain) {
  TempDir dir;
  ByteTokenizer tok;
  const std::string content = lines({"first doc", "second doc", "third"});
  write_file(dir.file("plain.jsonl"), content);
  write_file(dir.file("c4-train.00000-of-01024.json.gz"), gzip(content));
  const auto plain = load_dataset({dir.file("plain.jsonl")}, &tok);
  const auto packed = load_dataset({dir.file("c4-train.00000-of-01024.json.gz")}, &tok);
  EXPECT_EQ(all_tokens(*packed), docs({"first doc", "second doc", "third"}));
  EXPECT_EQ(all_tokens(*packed), all_tokens(*plain));
  EXPECT_CONTAINS(packed->describe(), "jsonl");
  EXPECT_CONTAINS(packed->describe(), "3 documents");
  // Plain text compressed is still one document; the name's .gz is looked through.
  write_file(dir.file("book.txt.gz"), gzip("one\nbook\n"));
  EXPECT_EQ(all_tokens(*load_dataset({dir.file("book.txt.gz")}, &tok)), docs({"one\nbook\n"}));
}

TEST(DataFiles, MultiMemberGzipIsOneStream) {
  TempDir dir;
  ByteTokenizer tok;
  // Members cut mid-line, as `cat a.gz b.gz` gives, then zero padding.
  const std::string content = lines({"alpha", "beta", "gamma", "delta"});
  const size_t cut = content.size() / 2 + 3;
  write_file(dir.file("multi.jsonl.gz"),
             gzip(content.substr(0, cut)) + gzip(content.substr(cut, 10)) + gzip(content.substr(cut + 10)) +
                 std::string(512, '\0'));
  EXPECT_EQ(all_tokens(*load_dataset({dir.file("multi.jsonl.gz")}, &tok)),
            docs({"alpha", "beta", "gamma", "delta"}));
  // An empty member in between is fine too.
  write_file(dir.file("empty-member.jsonl.gz"), gzip(lines({"a"})) + gzip("") + gzip(lines({"b"})));
  EXPECT_EQ(all_tokens(*load_dataset({dir.file("empty-member.jsonl.gz")}, &tok)), docs({"a", "b"}));
}

TEST(DataFiles, DirectoryMixingPlainAndCompressedInNameOrder) {
  TempDir dir;
  ByteTokenizer tok;
  const std::string c4 = dir.file("c4");
  std::filesystem::create_directory(c4);
  write_file(c4 + "/c4-train.00002-of-00003.json", lines({"c"}));              // plain
  write_file(c4 + "/c4-train.00000-of-00003.json.gz", gzip(lines({"a1", "a2"})));
  write_file(c4 + "/c4-train.00001-of-00003.json.gz", gzip(lines({"b"})));
  write_file(c4 + "/notes.txt", "plain text, one document");                  // text, by its name
  write_file(c4 + "/README.md", "not data");                                  // ignored
  write_file(c4 + "/.hidden.jsonl", lines({"never"}));                        // ignored
  std::filesystem::create_directory(c4 + "/sub.jsonl");                       // not a file
  const auto d = load_dataset({c4}, &tok);
  EXPECT_EQ(all_tokens(*d), docs({"a1", "a2", "b", "c", "plain text, one document"}));
  EXPECT_CONTAINS(d->describe(), "text+jsonl");
  EXPECT_CONTAINS(d->describe(), "5 documents from 4 files");
  EXPECT_CONTAINS(d->locate(6), "c4-train.00001-of-00003.json.gz, token 0 of the file");
  EXPECT_EQ(data_files({c4}).size(), 4u);

  // A pattern picks the train shards (c4/en also holds validation shards).
  write_file(c4 + "/c4-validation.00000-of-00001.json.gz", gzip(lines({"val"})));
  const auto train = load_dataset({c4 + "/c4-train.*.json*"}, &tok);
  EXPECT_EQ(all_tokens(*train), docs({"a1", "a2", "b", "c"}));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({c4 + "/c4-test.*"}, &tok); }),
                  "matches no file");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("nodir/*.json")}, &tok); }),
                  "does not exist");

  // With an explicit format every (non-hidden) file is read in it: README.md too.
  DatasetOptions o{c4};
  o.format = DataFormat::kJsonl;
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset(o, &tok); }), "README.md' line 1 is not valid JSON");
  o.format = DataFormat::kText;
  EXPECT_CONTAINS(load_dataset(o, &tok)->describe(), "text " + c4 + ": ");
  EXPECT_CONTAINS(load_dataset(o, &tok)->describe(), "6 documents from 6 files");
}

TEST(DataFiles, DamagedGzipNamesTheFileAndOffset) {
  TempDir dir;
  ByteTokenizer tok;
  std::string content;
  for (int i = 0; i < 200; ++i) content += lines({"document number " + std::to_string(i)});
  const std::string good = gzip(content);

  write_file(dir.file("truncated.json.gz"), good.substr(0, good.size() / 2));
  auto msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("truncated.json.gz")}, &tok); });
  EXPECT_CONTAINS(msg, "truncated.json.gz' is truncated");
  EXPECT_CONTAINS(msg, "compressed byte offset " + std::to_string(good.size() / 2));

  // The trailer holds CRC-32 then the length (little endian).
  std::string bad_crc = good;
  bad_crc[bad_crc.size() - 8] = static_cast<char>(bad_crc[bad_crc.size() - 8] ^ 0x5A);
  write_file(dir.file("crc.json.gz"), bad_crc);
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("crc.json.gz")}, &tok); });
  EXPECT_CONTAINS(msg, "crc.json.gz' is not a valid gzip file: incorrect data check (CRC-32 mismatch)");
  EXPECT_CONTAINS(msg, "compressed byte offset");

  std::string bad_data = good;
  for (size_t i = 20; i < 40; ++i) bad_data[i] = static_cast<char>(0xFF);
  write_file(dir.file("data.json.gz"), bad_data);
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("data.json.gz")}, &tok); });
  EXPECT_CONTAINS(msg, "data.json.gz' is not a valid gzip file");
  EXPECT_CONTAINS(msg, "gzip member 1");

  write_file(dir.file("garbage.json.gz"), good + "trailing words");
  msg = error_of<fsdp::UsageError>([&] { load_dataset({dir.file("garbage.json.gz")}, &tok); });
  EXPECT_CONTAINS(msg, "bytes after gzip member 1 are not another gzip member at compressed byte offset " +
                           std::to_string(good.size()));

  write_file(dir.file("header.json.gz"), good.substr(0, 5));  // ends inside the header
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("header.json.gz")}, &tok); }),
                  "is truncated");
  // A damaged file in a directory is named, not the directory.
  std::filesystem::create_directory(dir.file("d"));
  write_file(dir.file("d/a.jsonl"), lines({"ok"}));
  write_file(dir.file("d/b.jsonl.gz"), good.substr(0, 100));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("d")}, &tok); }), "b.jsonl.gz' is truncated");
}

TEST(DataFiles, BinaryAndTextDoNotMix) {
  TempDir dir;
  ByteTokenizer tok;
  write_token_file(dir.file("a.bin"), {1, 2, 3}, TokenDtype::kUint16);
  write_file(dir.file("b.jsonl"), lines({"x"}));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("*")}, &tok); }), "mixes binary token files");
  // A directory with shards is binary: its text files are ignored, as before.
  EXPECT_EQ(load_dataset({dir.path()}, &tok)->size(), 3);
  write_file(dir.file("c.bin.gz"), gzip("abcd"));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("c.bin.gz")}, &tok); }),
                  "compressed binary token file");
  std::filesystem::create_directory(dir.file("empty"));
  write_file(dir.file("empty/notes.md"), "x");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({dir.file("empty")}, &tok); }), "has no data files");
}

// Data and tokenizer paths that are not regular files, and token files that
// shrink under a running job (issue 16, finding 4).
#include <gtest/gtest.h>

#include <filesystem>

#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

// /dev/zero would be read until memory runs out, a FIFO without a writer blocks
// in open(): both are refused by kind before anything opens them.
TEST(HostileFiles, DataPathsMustBeRegularFiles) {
  TempDir dir;
  const std::string fifo = dir.file("corpus.jsonl");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [path, kind] : {std::pair<std::string, std::string>{"/dev/zero", "a character device"},
                                   {fifo, "a FIFO (named pipe)"}}) {
    const std::string msg = error_of<fsdp::UsageError>([&] { data_files({path}); });
    EXPECT_CONTAINS(msg, "data file " + path + " is " + kind + ", not a regular file");
    ByteTokenizer tok;
    EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_dataset({path}, &tok); }), kind);
  }
  // In a directory, an entry that would be read but is no regular file is named,
  // not skipped (issue 30, finding 9): training on the rest would be silent.
  write_file(dir.file("real.jsonl"), "{\"text\": \"hello\"}\n");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { data_files({dir.path()}); }),
                  "holds 'corpus.jsonl', which is a FIFO (named pipe), not a regular file");
  std::filesystem::remove(fifo);
  std::filesystem::create_symlink(dir.file("gone.jsonl"), dir.file("link.jsonl"));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { data_files({dir.path()}); }),
                  "holds 'link.jsonl', which is a symbolic link to nothing (-> " + dir.file("gone.jsonl") + ")");
  std::filesystem::remove(dir.file("link.jsonl"));
  std::filesystem::create_directory(dir.file("sub.jsonl"));  // subdirectories and hidden files are skipped
  write_file(dir.file(".hidden.jsonl"), "not read");
  EXPECT_EQ(data_files({dir.path()}), std::vector<std::string>{dir.file("real.jsonl")});
}

TEST(HostileFiles, TokenizerPathsMustBeRegularFiles) {
  TempDir dir;
  const std::string fifo = dir.file("tokenizer.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [spec, kind] : {std::pair<std::string, std::string>{"/dev/zero", "a character device"},
                                   {fifo, "a FIFO (named pipe)"},
                                   {dir.path(), "a FIFO (named pipe)"}}) {  // the directory's tokenizer.json
    EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(spec); }), "tokenizer file");
    EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { make_tokenizer(spec); }), kind + ", not a regular file");
  }
  EXPECT_EQ(tokenizer_file("byte"), "byte");
}

// A memory-mapped .bin cut short by another process: SIGBUS used to kill the
// job without a word (exit 135); the read now fails naming the file and sizes.
TEST(HostileFiles, ShrunkTokenFileIsAnErrorNotSigbus) {
  TempDir dir;
  const std::string bin = dir.file("shard.bin");
  std::vector<int32_t> tokens(100000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 50000);
  write_token_file(bin, tokens, TokenDtype::kUint16);
  const auto d = load_dataset({bin, DataFormat::kBinary}, nullptr);
  std::vector<int32_t> out(64);
  d->read(90000, 64, out.data());
  EXPECT_EQ(out[0], 40000);

  ASSERT_EQ(::truncate(bin.c_str(), 8192), 0);  // 200000 bytes -> 2 pages
  const std::string msg = error_of<fsdp::Failure>([&] { d->read(90000, 64, out.data()); });
  EXPECT_CONTAINS(msg, "token file '" + bin + "' shrank while it was being read: 200000 bytes when the run "
                       "started, now 8192 bytes");
  // What is still there reads as before, on this thread and on others.
  d->read(0, 64, out.data());
  EXPECT_EQ(out[5], 5);
  std::string other;
  std::thread([&] { other = error_of<fsdp::Failure>([&] { d->read(50000, 8, out.data()); }); }).join();
  EXPECT_CONTAINS(other, "shrank");
}

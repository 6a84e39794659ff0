// scripts/prepare_data.sh on a fake fortune directory (no fortunes package needed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"

#include <sys/wait.h>

#include <filesystem>
#include <fstream>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<std::string> texts(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(PrepareData, ConvertsFortuneFilesDeterministically) {
  if (run("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not installed";
  TempDir dir;
  const std::string src = dir.file("fortunes");
  std::filesystem::create_directories(src + "/off");
  write_file(src + "/alpha", "First fortune.\n%\nSecond\nline two\n%\n\n%\nTrailing spaces   \n  indented\n%\n");
  write_file(src + "/alpha.dat", std::string("\x00\x01\x02\x03", 4));
  std::filesystem::create_symlink("alpha", src + "/alpha.u8");
  write_file(src + "/beta", "_\bu_\bn_\bd_\be_\br line and b\bbo\bol\bld\bd\n%\nBell\a here, caf\xC3\xA9\n%\nLast one");
  write_file(src + "/off/rude", "never\n%\nincluded\n");
  const std::string out = dir.file("out/corpus.jsonl");
  const std::string script = repo_root() + "/scripts/prepare_data.sh";
  const std::string cmd = "bash " + script + " --src " + src + " --out " + out + " --val-every 2";
  ASSERT_EQ(run(cmd + " > " + dir.file("log1") + " 2>&1"), 0) << slurp(dir.file("log1"));

  // Documents in file order: alpha (3), beta (3); every 2nd goes to validation.
  EXPECT_EQ(texts(out), (std::vector<std::string>{"First fortune.", "Trailing spaces\n  indented", "Bell here, café"}));
  EXPECT_EQ(texts(dir.file("out/corpus.val.jsonl")),
            (std::vector<std::string>{"Second\nline two", "under line and bold", "Last one"}));
  EXPECT_CONTAINS(slurp(dir.file("log1")), "2 fortune files");
  EXPECT_CONTAINS(slurp(dir.file("log1")), "6 documents");

  // Byte-identical on a second run, and loadable as a dataset.
  const std::string first = slurp(out);
  ASSERT_EQ(run(cmd + " > /dev/null 2>&1"), 0);
  EXPECT_EQ(slurp(out), first);
  ByteTokenizer tok;
  EXPECT_CONTAINS(load_dataset({out}, &tok)->describe(), "3 documents");
}

TEST(PrepareData, MissingSourceIsAUsageError) {
  TempDir dir;
  const std::string script = repo_root() + "/scripts/prepare_data.sh";
  const std::string log = dir.file("log");
  EXPECT_EQ(run("bash " + script + " --src " + dir.file("none") + " --out " + dir.file("c.jsonl") + " > " + log +
                " 2>&1"),
            2);
  EXPECT_CONTAINS(slurp(log), "apt-get install fortunes");
  EXPECT_CONTAINS(slurp(log), "data/fallback_corpus.jsonl");
}

// --config files are TOML read by a conforming parser (Note [Config files]):
// syntax errors name the line and column, duplicate keys and tables are
// refused, devices and FIFOs are refused by kind before anything opens them.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "fsdp/common/config_file.h"
#include "support/errors.h"
#include "support/multiproc.h"

using fsdp::ConfigType;
using fsdp::read_config_file;
using fsdp::testing::usage_error_of;

namespace {

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

TEST(ConfigFile, ReadsTypedEntriesInFileOrder) {
  const std::string dir = fsdp::testing::temp_dir("config");
  const auto entries = read_config_file(write(dir, "a.toml", "# options\nmodel = \"tiny\"\nseq-len = 16\nlr = 3e-4\n"
                                                               "activation-checkpointing = true\n"
                                                               "lr-scale = ['lora_B=4', \"embed\\\\.x=0.5\"]\n"),
                                        "--config");
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0].key, "model");
  EXPECT_EQ(entries[0].type, ConfigType::kString);
  EXPECT_EQ(entries[0].texts.front(), "tiny");
  EXPECT_EQ(entries[1].type, ConfigType::kInteger);
  EXPECT_EQ(entries[1].texts.front(), "16");
  EXPECT_EQ(entries[1].line, 3);
  EXPECT_EQ(entries[2].type, ConfigType::kFloat);
  EXPECT_EQ(std::stod(entries[2].texts.front()), 3e-4);
  EXPECT_EQ(entries[3].texts.front(), "true");
  EXPECT_EQ(entries[4].type, ConfigType::kArray);
  EXPECT_EQ(entries[4].texts, (std::vector<std::string>{"lora_B=4", "embed\\.x=0.5"}));
}

TEST(ConfigFile, SyntaxErrorsNameLineAndColumn) {
  const std::string dir = fsdp::testing::temp_dir("config");
  // A line scanner took this as the value "tiny.
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "u.toml", "seq-len = 16\nmodel = \"tiny\n"), "--config"); }),
                  "line 2, column");
  // TOML forbids a key twice; a line scanner let the last one win.
  const std::string dup = usage_error_of([&] { read_config_file(write(dir, "d.toml", "lr = 1\nlr = 2\n"), "--config"); });
  EXPECT_CONTAINS(dup, "line 2");
  EXPECT_CONTAINS(dup, "lr");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "e.toml", "freeze = \"a\\.b\"\n"), "--config"); }),
                  "line 1, column");  // \. is no TOML escape: 'a\.b' (a literal string) is the way
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "t.toml", "[train]\nlr = 1\n"), "--config"); }),
                  "'train' is a table");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "k.toml", "a.b = 1\n"), "--config"); }),
                  "'a' is a table");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "m.toml", "x = [1, \"a\"]\n"), "--config"); }),
                  "mixes an integer and a string");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(write(dir, "b.toml", std::string("x = \"\xff\"\n")), "--config"); }),
                  "line 1");
}

TEST(ConfigFile, DevicesFifosAndHugeFilesAreRefusedWithoutReading) {
  const std::string dir = fsdp::testing::temp_dir("config");
  EXPECT_CONTAINS(usage_error_of([] { read_config_file("/dev/zero", "--config"); }),
                  "--config /dev/zero is a character device");
  const std::string fifo = dir + "/fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);  // no writer: opening it would block forever
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(fifo, "--config"); }), "is a FIFO (named pipe)");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(dir, "--config"); }), "is a directory");
  EXPECT_CONTAINS(usage_error_of([&] { read_config_file(dir + "/missing.toml", "--config"); }), "missing.toml");
  EXPECT_CONTAINS(usage_error_of([&] {
                    read_config_file(write(dir, "big.toml", "# " + std::string(fsdp::kMaxConfigBytes, 'x') + "\n"),
                                     "--config");
                  }),
                  "larger than 1 MiB");
}

TEST(ConfigFile, TomlSpellingsReadBack) {
  const std::string dir = fsdp::testing::temp_dir("config");
  const std::string odd = "a\"b\\c\td\ne\x01";
  const std::string text = "s = " + fsdp::toml_string(odd) + "\nf = " + fsdp::toml_float(0.1 + 0.2) +
                           "\ng = " + fsdp::toml_float(3.0) + "\nh = " + fsdp::toml_float(1e300) + "\n";
  const auto entries = read_config_file(write(dir, "rt.toml", text), "--config");
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].texts.front(), odd);
  EXPECT_EQ(std::stod(entries[1].texts.front()), 0.1 + 0.2);
  EXPECT_EQ(entries[2].type, ConfigType::kFloat);
  EXPECT_EQ(std::stod(entries[2].texts.front()), 3.0);
  EXPECT_EQ(std::stod(entries[3].texts.front()), 1e300);
}

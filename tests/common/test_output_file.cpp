// Writers never replace, truncate or rename over what is not a regular file
// (Note [Output targets]): device nodes made for the test (mknod in a
// temporary folder: the tests run as root) stay the same node, written in
// place or refused with the flag named; a FIFO nobody reads is refused at
// once; nothing is written beside a node.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <cerrno>
#include <cstring>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/common/output_file.h"
#include "support/errors.h"
#include "support/multiproc.h"

namespace fs = std::filesystem;
using fsdp::testing::error_of;
using fsdp::testing::usage_error_of;

namespace {

// A character device like /dev/null (1, 3) or /dev/full (1, 7), at `path`.
void make_node(const std::string& path, mode_t kind, unsigned major, unsigned minor) {
  ASSERT_EQ(::mknod(path.c_str(), kind | 0666, makedev(major, minor)), 0)
      << "mknod " << path << " failed (these tests run as root): " << std::strerror(errno);
}

// The node is still the node it was: same kind and device numbers.
void expect_node(const std::string& path, mode_t kind, unsigned major, unsigned minor) {
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path << " is gone";
  EXPECT_EQ(st.st_mode & S_IFMT, kind) << path << " is no longer the node it was";
  EXPECT_EQ(st.st_rdev, makedev(major, minor)) << path;
}

}  // namespace

TEST(OutputFile, RegularFilesAreReplacedAtomically) {
  const std::string dir = fsdp::testing::temp_dir("out");
  const std::string path = dir + "/trace.json";
  fsdp::write_output_file(path, "first", "--profile-file");
  fsdp::write_output_file(path, "second", "--profile-file");
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "second");
  // A link to a regular file: the file is replaced, the link kept.
  fs::create_symlink(path, dir + "/link.json");
  fsdp::write_output_file(dir + "/link.json", "third", "--profile-file");
  EXPECT_TRUE(fs::is_symlink(dir + "/link.json"));
  std::ifstream again(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(again), {}), "third");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2) << "a temporary was left";
}

// --profile-file renamed its trace over a node: run as root, `--profile-file
// /dev/null` replaced the system's /dev/null with a regular file.
TEST(OutputFile, CharacterDevicesAreWrittenInPlace) {
  const std::string dir = fsdp::testing::temp_dir("out");
  const std::string null = dir + "/null";
  make_node(null, S_IFCHR, 1, 3);
  fsdp::write_output_file(null, "a trace", "--profile-file");
  expect_node(null, S_IFCHR, 1, 3);
  std::ofstream metrics;
  fsdp::open_output_for_append(metrics, null, "--metrics-file");
  metrics << "{}\n" << std::flush;
  EXPECT_TRUE(metrics.good());
  metrics.close();
  expect_node(null, S_IFCHR, 1, 3);
  EXPECT_FALSE(fsdp::may_write_beside(null));  // no null.config.toml beside it
  EXPECT_TRUE(fsdp::may_write_beside(dir + "/metrics.jsonl"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1) << "something was created";

  const std::string full = dir + "/full";
  make_node(full, S_IFCHR, 1, 7);
  const std::string error = error_of<fsdp::Failure>([&] { fsdp::write_output_file(full, "x", "--profile-file"); });
  EXPECT_CONTAINS(error, "--profile-file " + full + ": writing failed (No space left on device)");
  expect_node(full, S_IFCHR, 1, 7);
}

TEST(OutputFile, OtherKindsAreRefusedUnchanged) {
  const std::string dir = fsdp::testing::temp_dir("out");
  const std::string block = dir + "/disk";
  make_node(block, S_IFBLK, 7, 0);  // a loop device: writing a trace there would overwrite a disk
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::write_output_file(block, "x", "--profile-file"); }),
                  "--profile-file " + block + " is a block device, not a file");
  expect_node(block, S_IFBLK, 7, 0);
  std::ofstream out;
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::open_output_for_append(out, block, "--metrics-file"); }),
                  "--metrics-file " + block + " is a block device");
  expect_node(block, S_IFBLK, 7, 0);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::write_output_file(dir, "x", "--write-hf-config"); }), "is a directory");
  fs::create_symlink(dir + "/nowhere", dir + "/dangling");
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::write_output_file(dir + "/dangling", "x", "--profile-file"); }),
                  "a symbolic link to nothing");
  EXPECT_TRUE(fs::is_symlink(dir + "/dangling"));
  EXPECT_FALSE(fs::exists(dir + "/nowhere"));
}

// A FIFO with no reader: an error at once, never a wait (the test would hang).
TEST(OutputFile, FifoWithoutReaderIsRefusedAtOnce) {
  const std::string dir = fsdp::testing::temp_dir("out");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::write_output_file(fifo, "x", "--profile-file"); }),
                  "is a FIFO (named pipe) that no process reads");
  std::ofstream out;
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::open_output_for_append(out, fifo, "--metrics-file"); }),
                  "that no process reads");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // With a reader, the text goes through the pipe.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  fsdp::write_output_file(fifo, "through the pipe", "--profile-file");
  char buf[64] = {0};
  EXPECT_EQ(::read(reader, buf, sizeof(buf) - 1), 16);
  EXPECT_EQ(std::string(buf), "through the pipe");
  ::close(reader);
}

namespace {
std::string content_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

// Derived names (issue 39): a copy is written where nothing is or an earlier
// copy is; a user's file, a device node or the file `never` stays as it is.
TEST(OutputFile, DerivedFilesAreWrittenOnlyOverTheirOwnKind) {
  const std::string dir = fsdp::testing::temp_dir("derived");
  const std::string marker = "# written by us";
  const std::string copy = dir + "/run.config.toml";
  EXPECT_EQ(fsdp::write_derived_output_file(copy, marker + " 1\n", "--metrics-file", marker, ""), "");
  EXPECT_EQ(fsdp::write_derived_output_file(copy, marker + " 2\n", "--metrics-file", marker, ""), "");
  EXPECT_EQ(content_of(copy), marker + " 2\n");

  const std::string users = dir + "/users.config.toml";
  std::ofstream(users) << "seed = 7  # mine\n";
  EXPECT_CONTAINS(fsdp::write_derived_output_file(users, marker + "\n", "--metrics-file", marker, ""),
                  "was not written by fsdp-cpp");
  EXPECT_EQ(content_of(users), "seed = 7  # mine\n");

  // The options' own file, even when it is an earlier copy (a --print-config output), through a link too.
  fs::create_symlink(copy, dir + "/alias.toml");
  EXPECT_CONTAINS(fsdp::write_derived_output_file(copy, marker + " 3\n", "--metrics-file", marker,
                                                  dir + "/alias.toml"),
                  "the file the options were read from");
  EXPECT_EQ(content_of(copy), marker + " 2\n");

  const std::string node = dir + "/null.config.toml";
  make_node(node, S_IFCHR, 1, 3);
  EXPECT_CONTAINS(fsdp::write_derived_output_file(node, marker + "\n", "--metrics-file", marker, ""),
                  "a character device");
  expect_node(node, S_IFCHR, 1, 3);
}

// Streams (a log, an event file): a new file only, or a log emptied in place;
// never through a dangling link or onto a directory.
TEST(OutputFile, StreamsOpenByTheSameRules) {
  const std::string dir = fsdp::testing::temp_dir("stream");
  const int fd = fsdp::open_output_fd(dir + "/events", "--tensorboard", fsdp::StreamMode::kCreateNew);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::open_output_fd(dir + "/events", "--tensorboard",
                                                            fsdp::StreamMode::kCreateNew); }),
                  "exists; a new file is needed");
  std::ofstream(dir + "/rank0.log") << "old run\n";
  const int log = fsdp::open_output_fd(dir + "/rank0.log", "log", fsdp::StreamMode::kTruncate);
  ::close(log);
  EXPECT_EQ(content_of(dir + "/rank0.log"), "");
  fs::create_symlink(dir + "/nowhere", dir + "/dangling.log");
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::open_output_fd(dir + "/dangling.log", "log", fsdp::StreamMode::kTruncate); }),
                  "symbolic link to nothing");
  EXPECT_FALSE(fs::exists(dir + "/nowhere"));
  // Where a measurement goes is checked before it runs: a missing directory is named.
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::check_output_writable(dir + "/nodir/cal.json", "--calibrate"); }),
                  "nodir is nothing (it does not exist), not a directory");
}

// Inputs must be regular files: devices, FIFOs and sockets are refused by kind
// before anything opens them (issue 16, finding 4).
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fsdp/common/files.h"
#include "support/errors.h"
#include "support/multiproc.h"

using fsdp::testing::usage_error_of;

TEST(Files, RegularFilesPassOthersAreNamedByKind) {
  const std::string dir = fsdp::testing::temp_dir("files");
  const std::string file = dir + "/a.txt";
  std::ofstream(file) << "text";
  EXPECT_NO_THROW(fsdp::require_regular_file(file, "--data", "give a file"));
  EXPECT_EQ(fsdp::path_kind(file), "a regular file");

  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string sock = dir + "/sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::filesystem::create_symlink(dir + "/nowhere", dir + "/dangling");

  const std::pair<std::string, std::string> cases[] = {
      {"/dev/zero", "is a character device, not a regular file"},
      {fifo, "is a FIFO (named pipe), not a regular file"},
      {sock, "is a socket, not a regular file"},
      {dir, "is a directory, not a regular file"},
      {dir + "/dangling", "is a symbolic link to nothing"},
      {dir + "/missing", "is nothing (it does not exist)"},
  };
  for (const auto& [path, kind] : cases) {
    const std::string msg = usage_error_of([&] { fsdp::require_regular_file(path, "--data", "give a file"); });
    EXPECT_CONTAINS(msg, "--data " + path + " " + kind);
    EXPECT_CONTAINS(msg, "give a file");
  }
  ::close(fd);
}

// The one reader (Note [Input files], issue 39): whole reads are bounded per
// kind of file, special files never opened, and a file is read whole.
TEST(Files, TheReaderReadsRegularFilesWithinTheirLimit) {
  const std::string dir = fsdp::testing::temp_dir("reader");
  const std::string file = dir + "/c.json";
  std::ofstream(file) << "{\"a\": 1}\n";
  EXPECT_EQ(fsdp::read_input_file(file, "--cluster", 64, "give a file"), "{\"a\": 1}\n");
  EXPECT_EQ(fsdp::read_input_file(file, "--cluster", 9, "give a file"), "{\"a\": 1}\n");  // exactly the limit
  EXPECT_EQ(fsdp::read_input_head(file, "--cluster", 4, "give a file"), "{\"a\"");
  const std::string big = usage_error_of([&] { fsdp::read_input_file(file, "--cluster", 8, "give a file"); });
  EXPECT_CONTAINS(big, "--cluster " + file + " is larger than 8 bytes");
  // /dev/zero would be read until memory runs out, a FIFO without a writer would block: refused by kind.
  EXPECT_CONTAINS(usage_error_of([] { fsdp::read_input_file("/dev/zero", "--cluster", 1 << 20, "give a file"); }),
                  "--cluster /dev/zero is a character device");
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::read_input_file(fifo, "--calibrate-link", 1 << 20, "give a file"); }),
                  "is a FIFO (named pipe)");
  // The system's own files (size 0 in stat) are read to their end; a missing one reads as "".
  EXPECT_NE(fsdp::read_system_file("/proc/self/status").find("VmRSS"), std::string::npos);
  EXPECT_EQ(fsdp::read_system_file(dir + "/missing"), "");
  EXPECT_EQ(fsdp::read_system_file(fifo), "");
}

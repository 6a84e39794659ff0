// Temporaries carry the ownership marker from creation until they are in
// place or gone (Note [Marked until in place] in file_io.h), so a kill at any
// instant of an export's commit leaves nothing that blocks the next export;
// the lock file is never a device node's replacement.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "checkpoint/file_io.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/ownership.h"
#include "support/errors.h"
#include "support/multiproc.h"

namespace fsdp::checkpoint {
namespace {

namespace fs = std::filesystem;

// One export's commit as export_dir does it: a marked .tmp-out with the
// files, moved over out (a previous export) with the marker removed last.
void export_once(const fs::path& parent, int round) {
  const std::string tmp = (parent / ".tmp-out").string();
  remove_owned_directory(tmp);  // left by an interrupted export
  create_owned_directory(tmp);
  for (const char* name : {"config.json", "model.safetensors", "generation_config.json"}) {
    io::write_text_file(tmp + "/" + name, "round " + std::to_string(round) + "\n");
  }
  io::fsync_dir(tmp);
  io::replace_directory(tmp, (parent / "out").string(), /*keep_marker=*/false);
}

// What the next export checks before it writes anything.
std::string blocked(const fs::path& parent) {
  try {
    check_export_dir((parent / "out").string());  // also: .tmp-out and .old-out removable
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The reported case: a SIGKILL during --export-hf left .tmp-OUT holding the
// files without the marker, and every later export to OUT was refused. Kill
// a process exporting in a loop at many random instants; after each kill the
// next export must find nothing in its way, and must succeed.
TEST(Ownership, AKillAtAnyInstantOfAnExportBlocksNothing) {
  const fs::path parent = testing::temp_dir("kill-export");
  // Kills spread over a whole export (its fsyncs make it last milliseconds here):
  // the commit at its end is a small part of it.
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 0; round < 3; ++round) export_once(parent, round);
  const auto one = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0) / 3;
  std::mt19937 rng(30);
  std::uniform_int_distribution<int64_t> delay_us(0, std::max<int64_t>(2 * one.count(), 1000));
  int killed_mid_commit = 0;
  constexpr int kKills = 60;
  for (int kill = 0; kill < kKills; ++kill) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int round = 1;; ++round) export_once(parent, round);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the exporting child died by itself (status " << status << ")";
    std::error_code ec;
    killed_mid_commit += fs::exists(parent / ".tmp-out", ec) || fs::exists(parent / ".old-out", ec);
    const std::string why = blocked(parent);
    ASSERT_EQ(why, "") << "after kill " << kill << " the next export is refused";
    ASSERT_NO_THROW(export_once(parent, -1)) << "after kill " << kill;
    EXPECT_FALSE(fs::exists(parent / "out" / kOwnedMarker)) << "an export kept the marker";
  }
  std::cout << "[ownership] " << kKills << " kills within " << 2 * one.count() << " us of an export's start (one "
            << "export: " << one.count() << " us), " << killed_mid_commit << " of them left a temporary behind; every "
            << "next export went through\n";
}

// A previous export holding the marker (a kill just after it moved in) is
// accepted and replaced; its marker does not stay.
TEST(Ownership, AMarkedPreviousExportIsReplaced) {
  const fs::path parent = testing::temp_dir("marked-export");
  export_once(parent, 0);
  mark_owned((parent / "out").string());
  EXPECT_EQ(blocked(parent), "");
  export_once(parent, 1);
  EXPECT_FALSE(fs::exists(parent / "out" / kOwnedMarker));
  // A checkpoint keeps its marker (keep_marker true).
  create_owned_directory((parent / ".tmp-step").string());
  io::replace_directory((parent / ".tmp-step").string(), (parent / "step").string());
  EXPECT_TRUE(is_owned_directory((parent / "step").string()));
}

TEST(Ownership, DiscardRemovesTheMarkerLast) {
  const fs::path dir = fs::path(testing::temp_dir("discard")) / ".del-x";
  create_owned_directory(dir.string());
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "f") << "x";
  EXPECT_TRUE(discard_owned_directory(dir.string()));
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(discard_owned_directory(dir.string()));  // absent: nothing to do
}

// `--export-hf .` named fsdp-train's own lock file as the user's content.
TEST(Ownership, ExportToTheCurrentDirectoryIsRefusedPlainly) {
  for (const char* dir : {".", "./", "..", "/", "a/.."}) {
    const std::string why = testing::usage_error_of([&] { check_export_dir(dir); });
    EXPECT_EQ(why.find(".lock"), std::string::npos) << why;
    EXPECT_CONTAINS(why, "which an export cannot be");
  }
}

// A device node (or a link) where the lock file goes is refused, and stays.
TEST(Ownership, ALockFileThatIsNoRegularFileIsRefusedUnchanged) {
  const std::string dir = testing::temp_dir("lock");
  const std::string lock = dir + "/.lock";
  ASSERT_EQ(::mknod(lock.c_str(), S_IFCHR | 0666, makedev(1, 3)), 0) << std::strerror(errno) << " (run as root)";
  EXPECT_CONTAINS(testing::usage_error_of([&] { DirectoryLock l(lock, "--checkpoint-dir " + dir); }),
                  "is a character device, not a regular file");
  struct stat st {};
  ASSERT_EQ(::lstat(lock.c_str(), &st), 0) << "the node was removed";
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(1, 3));
  fs::remove(lock);
  fs::create_symlink(dir + "/elsewhere", lock);
  EXPECT_CONTAINS(testing::usage_error_of([&] { DirectoryLock l(lock, "--checkpoint-dir " + dir); }),
                  "is a symbolic link");
  EXPECT_FALSE(fs::exists(dir + "/elsewhere"));
}

}  // namespace
}  // namespace fsdp::checkpoint

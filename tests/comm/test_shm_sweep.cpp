// The stale shared-memory sweep (issue 39, finding 5): it removes a name only
// when it is exactly one this program makes, from this pid namespace, a
// regular file of this user, and its creator is gone.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "comm/shm_transport.h"

namespace shm = fsdp::comm::shm;

namespace {

pid_t dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

bool exists(const std::string& name) { return std::filesystem::exists(std::filesystem::symlink_status("/dev/shm/" + name)); }

void make(const std::string& name) {
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  close(fd);
}

}  // namespace

TEST(ShmSweep, RemovesOnlyDeadCreatorsSegmentsOfThisNamespaceAndUser) {
  const pid_t dead = dead_pid();
  const uint64_t ns = shm::pid_namespace();
  ASSERT_NE(ns, 0u) << "/proc/self/ns/pid is not readable";
  const uint64_t r = std::random_device{}();
  const std::string stale = shm::segment_name(dead, ns, r);
  const std::string alive = shm::segment_name(getpid(), ns, r);
  const std::string other_ns = shm::segment_name(dead, ns + 1, r);
  const std::string other_user = shm::segment_name(dead, ns, r + 1);
  const std::string link = shm::segment_name(dead, ns, r + 2);
  const std::string not_a_pid = "fsdp-cpp.notapid.mine";
  const std::string old_form = std::string(shm::kSegmentPrefix) + std::to_string(dead) + ".1234";
  const std::string bad_suffix = shm::segment_name(dead, ns, r + 3) + "x";
  for (const auto& n : {stale, alive, other_ns, other_user, not_a_pid, old_form, bad_suffix}) make(n);
  ASSERT_EQ(chown(("/dev/shm/" + other_user).c_str(), 65534, 65534), 0) << "these tests run as root";
  const std::string target = "/dev/shm/" + alive;
  ASSERT_EQ(symlink(target.c_str(), ("/dev/shm/" + link).c_str()), 0);

  EXPECT_GE(shm::remove_stale_segments(), 1);
  EXPECT_FALSE(exists(stale)) << "a dead creator's segment of this namespace stayed";
  for (const auto& n : {alive, other_ns, other_user, link, not_a_pid, old_form, bad_suffix}) {
    EXPECT_TRUE(exists(n)) << n << " was swept";
    std::filesystem::remove("/dev/shm/" + n);
  }
}

// What a process may still allocate (Note [Host memory limits]): the least of
// MemAvailable, what is left under every memory cgroup limit from its own up
// to the root (v2 and v1), and RLIMIT_DATA. Fake /proc and /sys trees stand in
// for the machine's, whose cgroup layout a test cannot rely on.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/common/memory.h"
#include "support/errors.h"
#include "support/multiproc.h"

namespace fs = std::filesystem;
using fsdp::HostMemoryPaths;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

void put(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// A fake machine with 16 GiB available and no limits; tests add them.
HostMemoryPaths fake_machine(const std::string& root, const std::string& self_cgroup) {
  HostMemoryPaths p;
  p.meminfo = root + "/proc/meminfo";
  p.self_cgroup = root + "/proc/self/cgroup";
  p.self_status = root + "/proc/self/status";
  p.cgroup_mount = root + "/sys/fs/cgroup";
  p.rlimit_data = false;
  put(p.meminfo, "MemTotal:       32000000 kB\nMemAvailable:   " + std::to_string(16 * kGiB / 1024) + " kB\n");
  put(p.self_cgroup, self_cgroup);
  put(p.self_status, "VmData:     " + std::to_string(kGiB / 1024) + " kB\n");
  fs::create_directories(p.cgroup_mount);
  return p;
}

}  // namespace

TEST(HostMemory, MemAvailableWithoutLimits) {
  const HostMemoryPaths p = fake_machine(fsdp::testing::temp_dir("mem"), "0::/user.slice\n");
  const fsdp::HostMemory m = fsdp::host_memory(p);
  EXPECT_EQ(m.available, 16 * kGiB);
  EXPECT_CONTAINS(m.bound, "MemAvailable");
}

// The reported case: a cgroup-v1 memory group of 4 GiB, where MemAvailable
// said 15.7 GiB and a decompressing data file was SIGKILLed at the limit.
TEST(HostMemory, CgroupV1GroupOfTheProcess) {
  const std::string root = fsdp::testing::temp_dir("mem");
  const HostMemoryPaths p = fake_machine(root, "12:pids:/x\n5:memory:/jobs/job7\n0::/\n");
  const std::string job = p.cgroup_mount + "/memory/jobs/job7";
  put(p.cgroup_mount + "/memory/memory.limit_in_bytes", "9223372036854771712\n");  // the root: no limit
  put(job + "/memory.limit_in_bytes", std::to_string(4 * kGiB) + "\n");
  put(job + "/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  put(job + "/memory.stat", "cache 100\ntotal_inactive_file " + std::to_string(kGiB / 2) + "\n");
  const fsdp::HostMemory m = fsdp::host_memory(p);
  EXPECT_EQ(m.available, 4 * kGiB - kGiB + kGiB / 2);
  EXPECT_CONTAINS(m.bound, "cgroup v1");
  EXPECT_CONTAINS(m.bound, "jobs/job7");
}

// Nested v2 groups: the parent's smaller limit binds the child.
TEST(HostMemory, CgroupV2AncestorsCount) {
  const std::string root = fsdp::testing::temp_dir("mem");
  const HostMemoryPaths p = fake_machine(root, "0::/outer/inner\n");
  put(p.cgroup_mount + "/outer/memory.max", std::to_string(2 * kGiB) + "\n");
  put(p.cgroup_mount + "/outer/memory.current", std::to_string(kGiB / 2) + "\n");
  put(p.cgroup_mount + "/outer/inner/memory.max", std::to_string(8 * kGiB) + "\n");
  put(p.cgroup_mount + "/outer/inner/memory.current", std::to_string(kGiB / 4) + "\n");
  put(p.cgroup_mount + "/outer/inner/memory.stat", "anon 5\ninactive_file 0\n");
  const fsdp::HostMemory m = fsdp::host_memory(p);
  EXPECT_EQ(m.available, 2 * kGiB - kGiB / 2);
  EXPECT_CONTAINS(m.bound, "cgroup v2");
  EXPECT_CONTAINS(m.bound, "outer");
  EXPECT_EQ(m.bound.find("inner"), std::string::npos) << m.bound;
}

// A container mounts its own group as the root: /proc/self/cgroup names a
// path that does not exist under the mount, and the mount's root is read.
TEST(HostMemory, CgroupV2NamespacedRoot) {
  const std::string root = fsdp::testing::temp_dir("mem");
  const HostMemoryPaths p = fake_machine(root, "0::/kubepods/pod1/abc\n");
  put(p.cgroup_mount + "/memory.max", std::to_string(3 * kGiB) + "\n");
  put(p.cgroup_mount + "/memory.current", "0\n");
  EXPECT_EQ(fsdp::host_memory(p).available, 3 * kGiB);
  put(p.cgroup_mount + "/memory.max", "max\n");  // no limit
  EXPECT_EQ(fsdp::host_memory(p).available, 16 * kGiB);
}

// RLIMIT_DATA (ulimit -d) less the data segment in use; set in a child, which
// reports through its exit status.
TEST(HostMemory, RlimitData) {
  HostMemoryPaths p = fake_machine(fsdp::testing::temp_dir("mem"), "0::/\n");
  p.rlimit_data = true;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlimit lim{static_cast<rlim_t>(3 * kGiB), static_cast<rlim_t>(3 * kGiB)};
    if (::setrlimit(RLIMIT_DATA, &lim) != 0) ::_exit(10);
    const fsdp::HostMemory m = fsdp::host_memory(p);  // VmData 1 GiB in the fake status file
    ::_exit(m.available == 2 * kGiB && m.bound.find("RLIMIT_DATA") != std::string::npos ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: setrlimit failed; 11: RLIMIT_DATA was not the bound";
}

// Process memory statistics (Linux /proc), for logs, metrics and tests; byte
// sizes in words, written (format_bytes) and read from a user (parse_byte_size).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace fsdp {

// Resident set size now (VmRSS), bytes; -1 if unavailable.
int64_t current_rss_bytes();
// Peak resident set size since start or the last reset (VmHWM), bytes; -1 if unavailable.
int64_t peak_rss_bytes();
// Resets the peak to the current RSS (writes 5 to /proc/self/clear_refs).
// Returns false where the kernel does not allow it.
bool reset_peak_rss();

// Note [Host memory limits]
// Memory this process could still allocate on the host before running out is
// the least of:
//  - /proc/meminfo's MemAvailable (the machine);
//  - for each memory cgroup from this process's own up to the hierarchy's root
//    that has a limit, what is left under it: limit - usage + inactive page
//    cache (given back under pressure). cgroup v2: memory.max, memory.current,
//    memory.stat's inactive_file; v1 (the "memory" controller's line of
//    /proc/self/cgroup): memory.limit_in_bytes, memory.usage_in_bytes,
//    memory.stat's total_inactive_file. A process's cgroup path that is not
//    under the mount (a container whose namespace mounts its own cgroup as
//    the root) is read at the mount's root. Ancestors count: a group of 4 GiB
//    inside one of 2 GiB has 2 GiB;
//  - RLIMIT_DATA (ulimit -d) less this process's data segment (VmData).
// Exceeding a cgroup limit gets the process SIGKILLed by the OOM killer with
// no message, so every allocation-sizing decision reads this, not MemAvailable
// alone.
struct HostMemory {
  int64_t available = -1;  // bytes; -1 if nothing could be read
  std::string bound;       // what set `available`, for messages: "MemAvailable", "the cgroup v2 limit memory.max
                           // = 4.00 GiB of <dir>", "RLIMIT_DATA (ulimit -d) = ..."; "" if unknown
};
// Where host_memory reads; tests point them at fake files.
struct HostMemoryPaths {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_mount = "/sys/fs/cgroup";  // v2 here; v1 controllers in <cgroup_mount>/memory
  std::string self_status = "/proc/self/status";  // VmData
  bool rlimit_data = true;                        // whether RLIMIT_DATA counts (tests turn it off)
};
HostMemory host_memory(const HostMemoryPaths& paths = HostMemoryPaths());
// host_memory().available.
int64_t available_host_memory_bytes();
// "3.91 GiB (the cgroup v1 limit ...) available" for messages: host_memory() in words.
std::string available_host_memory_text();

// a * b, or nullopt when the product does not fit int64_t (sizes computed
// from user flags are checked with it before anything is allocated).
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
// The product of all factors, or nullopt when it (or a partial product) overflows.
std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors);

// "512 B", "3.2 KiB", "4.11 GiB": three significant digits, binary units.
std::string format_bytes(int64_t bytes);
// A size a user gives: "5GB" (10^9), "500MB", "100kB", "2GiB" (2^30), "1MiB",
// "1234" (bytes), "0". UsageError naming `flag` for anything else: no number,
// an unknown unit, more than 2^63 - 1 bytes, or a size that is not 0 yet less
// than one byte. The messages say what 0 means to the caller, `zero_means`
// ("no limit"; "" says nothing).
int64_t parse_byte_size(const std::string& text, const std::string& flag, const std::string& zero_means = "");
// parse_byte_size's words back, exactly: the largest unit that divides
// (5000000000 -> "5GB", 17179869184 -> "16GiB", 1234 -> "1234").
std::string format_byte_size(int64_t bytes);

}  // namespace fsdp

#include "fsdp/common/memory.h"

#include <sys/resource.h>

#include "fsdp/common/files.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fsdp {
namespace {
// The "Key:   N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in
// bytes; -1 when absent.
int64_t kib_field_bytes(const char* path, const char* key) {
  std::istringstream in(read_system_file(path));
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, k.size(), k) == 0) return std::stoll(line.substr(k.size())) * 1024;
  }
  return -1;
}

// The first number of a file such as /sys/fs/cgroup/memory.max; nullopt for
// "max", an absent file or anything else.
std::optional<int64_t> read_number(const std::string& path) {
  std::istringstream in(read_system_file(path));
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return std::nullopt;  // beyond int64: no limit worth the name
  }
}

// A "key value" line of a cgroup's memory.stat; 0 when absent.
int64_t stat_value(const std::string& path, const std::string& key) {
  std::istringstream in(read_system_file(path));
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

// The directory of this process's memory cgroup: the path /proc/self/cgroup
// gives for the v2 hierarchy ("0::/path") or the v1 "memory" controller
// ("N:memory,...:/path") under `mount`, or `mount` itself when that path is
// not there (a cgroup namespace mounts the process's own group as the root).
// nullopt when this process is in no such hierarchy.
std::optional<std::string> cgroup_dir(const std::string& self_cgroup, const std::string& mount, bool v2) {
  std::istringstream in(read_system_file(self_cgroup));
  std::string line;
  while (std::getline(in, line)) {
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    bool match = v2 ? line.compare(0, c1, "0") == 0 && controllers.empty() : false;
    for (size_t b = 0; !v2 && b <= controllers.size();) {
      const size_t e = std::min(controllers.find(',', b), controllers.size());
      match = match || controllers.compare(b, e - b, "memory") == 0;
      b = e + 1;
    }
    if (!match) continue;
    std::string rel = line.substr(c2 + 1);
    while (!rel.empty() && rel.back() == '/') rel.pop_back();
    std::error_code ec;
    if (!rel.empty() && std::filesystem::is_directory(mount + rel, ec)) return mount + rel;
    return mount;
  }
  return std::nullopt;
}

// The least left under any limit from `dir` up to `mount` (inclusive), with
// what set it; nullopt when no level has a limit.
struct Left {
  int64_t bytes;
  std::string bound;
};
std::optional<Left> left_under_cgroups(std::string dir, const std::string& mount, bool v2) {
  const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
  const char* cache_key = v2 ? "inactive_file" : "total_inactive_file";
  std::optional<Left> best;
  for (;;) {
    const auto limit = read_number(dir + "/" + limit_file);
    // v1 reports "no limit" as a huge page-rounded number.
    if (limit && *limit < (int64_t{1} << 60)) {
      const int64_t used = read_number(dir + "/" + usage_file).value_or(0);
      const int64_t left = std::max<int64_t>(0, *limit - used + stat_value(dir + "/memory.stat", cache_key));
      if (!best || left < best->bytes) {
        best = Left{left, std::string("the cgroup ") + (v2 ? "v2" : "v1") + " limit " + limit_file + " = " +
                              format_bytes(*limit) + " of " + dir};
      }
    }
    if (dir.size() <= mount.size()) break;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash < mount.size()) break;
    dir = dir.substr(0, slash);
  }
  return best;
}

}  // namespace

HostMemory host_memory(const HostMemoryPaths& paths) {
  HostMemory m;
  auto lower = [&](int64_t bytes, std::string bound) {
    bytes = std::max<int64_t>(bytes, 0);
    if (m.available < 0 || bytes < m.available) {
      m.available = bytes;
      m.bound = std::move(bound);
    }
  };
  if (const int64_t avail = kib_field_bytes(paths.meminfo.c_str(), "MemAvailable"); avail >= 0) {
    lower(avail, "MemAvailable of /proc/meminfo");
  }
  for (const bool v2 : {true, false}) {
    const std::string mount = v2 ? paths.cgroup_mount : paths.cgroup_mount + "/memory";
    if (const auto dir = cgroup_dir(paths.self_cgroup, mount, v2)) {
      if (const auto left = left_under_cgroups(*dir, mount, v2)) lower(left->bytes, left->bound);
    }
  }
  struct rlimit lim {};
  if (paths.rlimit_data && ::getrlimit(RLIMIT_DATA, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const auto limit = static_cast<int64_t>(std::min<rlim_t>(lim.rlim_cur, INT64_MAX));
    const int64_t data = std::max<int64_t>(kib_field_bytes(paths.self_status.c_str(), "VmData"), 0);
    lower(limit - data, "RLIMIT_DATA (ulimit -d) = " + format_bytes(limit) + ", " + format_bytes(data) +
                            " of it in use");
  }
  return m;
}

int64_t available_host_memory_bytes() { return host_memory().available; }

std::string available_host_memory_text() {
  const HostMemory m = host_memory();
  if (m.available < 0) return "an unknown amount available";
  return format_bytes(m.available) + " (" + m.bound + ") available";
}

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  std::optional<int64_t> p = 1;
  for (const int64_t f : factors) p = p ? checked_mul(*p, f) : std::nullopt;
  return p;
}

int64_t current_rss_bytes() { return kib_field_bytes("/proc/self/status", "VmRSS"); }
int64_t peak_rss_bytes() { return kib_field_bytes("/proc/self/status", "VmHWM"); }

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), std::abs(v) < 10 ? "%.2f %s" : std::abs(v) < 100 ? "%.1f %s" : "%.0f %s", v,
                  kUnits[u]);
  }
  return buf;
}

}  // namespace fsdp

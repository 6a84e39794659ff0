#include "fsdp/common/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

namespace fsdp {
namespace {
// The "Key:   N kB" line of a /proc file (/proc/self/status, /proc/meminfo), in
// bytes; -1 when absent.
int64_t kib_field_bytes(const char* path, const char* key) {
  std::ifstream in(path);
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
  std::ifstream in(path);
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
  std::ifstream in(path);
  std::string k;
  int64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

// This process's cgroup directory under the unified hierarchy ("0::/path").
std::string cgroup_v2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "/sys/fs/cgroup";
}

}  // namespace

int64_t available_host_memory_bytes() {
  int64_t available = kib_field_bytes("/proc/meminfo", "MemAvailable");
  // A container's limit: what is left under it.
  std::optional<int64_t> left;
  const std::string v2 = cgroup_v2_dir();
  if (const auto max = read_number(v2 + "/memory.max")) {
    if (const auto used = read_number(v2 + "/memory.current")) {
      // The page cache counts as used but is given back under pressure.
      left = *max - *used + stat_value(v2 + "/memory.stat", "inactive_file");
    }
  } else if (const auto limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    if (const auto used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes")) {
      // cgroup v1 reports "no limit" as a huge page-rounded number.
      if (*limit < (int64_t{1} << 60)) left = *limit - *used;
    }
  }
  if (left) available = available < 0 ? std::max<int64_t>(*left, 0) : std::min(available, std::max<int64_t>(*left, 0));
  return available;
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

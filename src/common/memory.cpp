#include "fsdp/common/memory.h"

#include <sys/resource.h>

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
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

std::string format_byte_size(int64_t bytes) {
  static const std::pair<int64_t, const char*> kUnits[] = {
      {int64_t{1} << 40, "TiB"}, {1'000'000'000'000, "TB"}, {int64_t{1} << 30, "GiB"}, {1'000'000'000, "GB"},
      {int64_t{1} << 20, "MiB"}, {1'000'000, "MB"},         {int64_t{1} << 10, "KiB"}, {1'000, "kB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes != 0 && bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

int64_t parse_byte_size(const std::string& text, const std::string& flag, const std::string& zero_means) {
  // \s* digits [. digits] \s* letters \s*, read by hand: the text is the user's (no std::regex).
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  const auto letter = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0;
  const auto skip = [&](const auto& pred) {
    const size_t from = i;
    while (i < text.size() && pred(text[i])) ++i;
    return i - from;
  };
  skip(space);
  const size_t number_at = i;
  bool ok = skip(digit) > 0;
  if (ok && i < text.size() && text[i] == '.') {
    ++i;
    ok = skip(digit) > 0;
  }
  const std::string number = text.substr(number_at, i - number_at);
  skip(space);
  const size_t unit_at = i;
  skip(letter);
  std::string unit = text.substr(unit_at, i - unit_at);
  const std::string given_unit = unit;
  skip(space);
  const std::string zero = zero_means.empty() ? std::string() : " (0: " + zero_means + ")";
  FSDP_CHECK(ok && i == text.size(), flag, " '", text, "' is not a size; write e.g. 5GB, 500MB, 2GiB or a number of "
             "bytes", zero);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, long double> kUnits = {
      {"", 1},        {"b", 1},          {"kb", 1e3L},          {"mb", 1e6L},         {"gb", 1e9L},
      {"tb", 1e12L},  {"kib", 1024.0L},  {"mib", 1048576.0L},   {"gib", 1073741824.0L}, {"tib", 1099511627776.0L},
      {"k", 1e3L},    {"m", 1e6L},       {"g", 1e9L}};
  auto it = kUnits.find(unit);
  FSDP_CHECK(it != kUnits.end(), flag, " '", text, "': unknown unit '", given_unit,
             "'; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)");
  // Digits only (no sign, no exponent): strtold cannot fail; hundreds of
  // digits read as a huge value, refused below rather than thrown as "stod".
  const long double bytes = std::strtold(number.c_str(), nullptr) * it->second;
  constexpr long double kMax = 9223372036854775807.0L;  // 2^63 - 1, what a file size can be
  FSDP_CHECK(bytes <= kMax, flag, " '", text, "' is more than the largest size, 2^63 - 1 bytes (8 EiB); give a "
             "size this machine can have, e.g. 5GB", zero);
  const int64_t n = static_cast<int64_t>(std::llroundl(bytes));
  FSDP_CHECK(n > 0 || bytes == 0, flag, " '", text, "' is less than one byte; give at least 1 byte", zero);
  return n;
}

}  // namespace fsdp

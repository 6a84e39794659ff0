#include "fsdp/common/memory.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace fsdp {
namespace {
int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, k.size(), k) == 0) return std::stoll(line.substr(k.size())) * 1024;
  }
  return -1;
}
}  // namespace

int64_t current_rss_bytes() { return status_kib("VmRSS"); }
int64_t peak_rss_bytes() { return status_kib("VmHWM"); }

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

std::string format_bytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
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

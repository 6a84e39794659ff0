#include "fsdp/common/memory.h"

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

}  // namespace fsdp

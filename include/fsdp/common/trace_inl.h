// Template definitions of trace.h.
#pragma once

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

namespace fsdp::trace {

template <typename Pred>
int64_t covered_us(const std::vector<Event>& events, Pred keep) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const Event& e : events) {
    if (keep(e)) spans.emplace_back(e.begin_us, e.begin_us + e.dur_us);
  }
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, end = std::numeric_limits<int64_t>::min();
  for (const auto& [b, e] : spans) {
    if (e <= end) continue;
    total += e - std::max(b, end);
    end = e;
  }
  return total;
}

}  // namespace fsdp::trace

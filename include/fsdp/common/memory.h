// Process memory statistics (Linux /proc), for logs, metrics and tests.
#pragma once

#include <cstdint>

namespace fsdp {

// Resident set size now (VmRSS), bytes; -1 if unavailable.
int64_t current_rss_bytes();
// Peak resident set size since start or the last reset (VmHWM), bytes; -1 if unavailable.
int64_t peak_rss_bytes();
// Resets the peak to the current RSS (writes 5 to /proc/self/clear_refs).
// Returns false where the kernel does not allow it.
bool reset_peak_rss();


}  // namespace fsdp

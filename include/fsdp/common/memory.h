// Process memory statistics (Linux /proc), for logs, metrics and tests.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

// Resident set size now (VmRSS), bytes; -1 if unavailable.
int64_t current_rss_bytes();
// Peak resident set size since start or the last reset (VmHWM), bytes; -1 if unavailable.
int64_t peak_rss_bytes();
// Resets the peak to the current RSS (writes 5 to /proc/self/clear_refs).
// Returns false where the kernel does not allow it.
bool reset_peak_rss();

// "512 B", "3.2 KiB", "4.11 GiB": three significant digits, binary units.
std::string format_bytes(int64_t bytes);


}  // namespace fsdp

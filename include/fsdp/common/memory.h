// Process memory statistics (Linux /proc), for logs, metrics and tests.
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

// Memory this process could still allocate on the host before running out,
// bytes: /proc/meminfo's MemAvailable, lowered to what is left under the
// cgroup's limit (a container's memory.max, cgroup v1's memory.limit_in_bytes)
// when there is one. -1 if unknown.
int64_t available_host_memory_bytes();

// a * b, or nullopt when the product does not fit int64_t (sizes computed
// from user flags are checked with it before anything is allocated).
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
// The product of all factors, or nullopt when it (or a partial product) overflows.
std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors);

// "512 B", "3.2 KiB", "4.11 GiB": three significant digits, binary units.
std::string format_bytes(int64_t bytes);

}  // namespace fsdp

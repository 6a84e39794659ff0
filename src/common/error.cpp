#include "fsdp/common/error.h"

#include <atomic>

namespace fsdp {
namespace {
// Packed (rank << 32 | world) so readers never see a torn pair. -1: unset.
std::atomic<long long> g_rank_tag{-1};
}  // namespace

void set_rank_tag(int rank, int world_size) {
  g_rank_tag.store((static_cast<long long>(rank) << 32) | static_cast<unsigned>(world_size));
}

std::string rank_tag() {
  const long long v = g_rank_tag.load();
  if (v < 0) return "";
  return detail::cat("[rank ", v >> 32, "/", static_cast<int>(v & 0xffffffff), "] ");
}

namespace detail {
void throw_usage(const std::string& msg) { throw UsageError(rank_tag() + msg); }
void throw_failure(const std::string& msg) { throw Failure(rank_tag() + msg); }
void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(cat(rank_tag(), "internal error at ", file, ":", line, ": ", cond,
                          msg.empty() ? "" : " — ", msg,
                          " (this is a bug in fsdp-cpp; please report it)"));
}
}  // namespace detail
}  // namespace fsdp

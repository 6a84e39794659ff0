#include "comm/store_barrier.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::comm {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void store_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                   const std::string& group, std::chrono::milliseconds timeout) {
  // Note [Leaving a barrier]
  // The last barrier of a job is often a process's last use of the store, and
  // the store may live in rank 0 (plain env, Slurm): once rank 0 is through, it
  // may exit and take the store with it. So nobody may still need the store
  // when rank 0 leaves: every other rank, once through, sets leave/<r> (a set
  // needs no reply), and rank 0 leaves only after all of those. Waits block in
  // the store rather than poll check(): a poller can sleep through the moment
  // everyone arrived. c10d 2.x's TCPStore cancels a timed-out wait cleanly
  // (1.13's left the connection out of step).
  const auto deadline = Clock::now() + timeout;
  auto keys_of = [&](const char* phase, int first) {
    std::vector<std::string> keys;
    for (int r = first; r < size; ++r) keys.push_back(detail::cat(prefix, "/", phase, "/", r));
    return keys;
  };
  // Waits for `keys` (ranks first..size-1); on timeout returns the ranks still missing.
  auto wait_for = [&](const std::vector<std::string>& keys, int first) -> std::string {
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    try {
      store.wait(keys, left);
      return "";
    } catch (const std::exception&) {
      // Timed out (or the store failed: check() below tells).
    }
    std::ostringstream missing;
    int n_missing = 0;
    try {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store.check({keys[i]})) missing << (n_missing++ ? ", " : "") << first + static_cast<int>(i);
      }
    } catch (const std::exception& e) {
      FSDP_FAIL("barrier on group '", group, "': the rendezvous store failed: ", e.what(),
                " — the process hosting it (rank 0 or the launcher) exited or crashed; see its log");
    }
    if (n_missing == 0) return "";  // the last one arrived just as the wait gave up
    return detail::cat(n_missing == 1 ? "rank " : "ranks ", missing.str());
  };

  store.set(detail::cat(prefix, "/arrive/", rank), std::vector<uint8_t>{1});
  const std::string absent = wait_for(keys_of("arrive", 0), 0);
  if (!absent.empty()) {
    FSDP_FAIL("barrier on group '", group, "' timed out after ", timeout.count(), " ms: ", absent,
              " did not arrive — they are slower, hung, crashed or skipped the barrier; see their logs");
  }
  if (rank != 0) {
    store.set(detail::cat(prefix, "/leave/", rank), std::vector<uint8_t>{1});
    return;
  }
  const std::string stuck = wait_for(keys_of("leave", 1), 1);
  if (!stuck.empty()) {
    FSDP_FAIL("barrier on group '", group, "' timed out after ", timeout.count(), " ms: ", stuck,
              " arrived but did not leave — they crashed inside the barrier; see their logs");
  }
}

void StoreBarrier::wait(c10d::Store& store, int rank, int size, const std::string& group,
                        std::chrono::milliseconds timeout) {
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = generation_++;
  }
  // Having passed barrier generation-1, everyone has passed generation-2: its keys are dead.
  // Deleted before, not after, this barrier: see Note [Leaving a barrier].
  if (generation > 1) {
    store.deleteKey(detail::cat("barrier/", generation - 2, "/arrive/", rank));
    if (rank != 0) store.deleteKey(detail::cat("barrier/", generation - 2, "/leave/", rank));
  }
  store_barrier(store, detail::cat("barrier/", generation), rank, size, group, timeout);
}

}  // namespace fsdp::comm

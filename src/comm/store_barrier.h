// The store-based barrier both process groups use (TCP and NCCL): their
// barrier() and the last step of their construction.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace fsdp::comm {

// Store-based barrier shared by the backends: rank r sets <prefix>/arrive/<r>,
// then waits until all `size` such keys exist. On timeout throws fsdp::Failure
// naming `group` and the ranks whose keys are missing. Rank 0 returns only
// after every other rank is through and done with the store (it sets
// <prefix>/leave/<r>), so a store hosted by rank 0 may go away as soon as rank
// 0's last barrier returns.
void store_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                   const std::string& group, std::chrono::milliseconds timeout);

// A group's successive barriers over its store: the g-th uses prefix "barrier/<g>",
// and deletes this rank's keys of barrier g-2 first (everyone has passed it once
// they passed g-1). Thread-safe; one per process group.
class StoreBarrier {
 public:
  void wait(c10d::Store& store, int rank, int size, const std::string& group, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;  // guards generation_
  int64_t generation_ = 0;
};

}  // namespace fsdp::comm

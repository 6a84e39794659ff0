// Shared memory between the ranks of a lane that run on one host (private to
// comm/). See Note [Shared memory] in shm_transport.cpp.
//
// A HostSegment is one POSIX shared-memory segment per lane and host: for
// every ordered pair of its ranks a single-producer single-consumer byte ring,
// and for every rank a doorbell (a futex word) that producers and consumers
// ring when they add bytes or free space. tcp::Mesh moves a peer's bytes
// through the rings instead of its socket when both ranks mapped the segment;
// the socket stays open, silent, to learn at once that the peer exited.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::comm::shm {

using Clock = std::chrono::steady_clock;

// One direction between two ranks: bytes written at `head`, read at `tail`
// (both count every byte since the segment was made; head - tail <= capacity).
class Ring {
 public:
  Ring() = default;
  Ring(std::atomic<uint64_t>* head, std::atomic<uint64_t>* tail, char* data, uint64_t capacity)
      : head_(head), tail_(tail), data_(data), capacity_(capacity) {}
  bool valid() const { return data_ != nullptr; }
  // Producer: copies up to n bytes in; returns how many fit.
  size_t write(const char* p, size_t n);
  // Consumer: copies up to n bytes out; returns how many were there.
  size_t read(char* p, size_t n);

 private:
  std::atomic<uint64_t>* head_ = nullptr;
  std::atomic<uint64_t>* tail_ = nullptr;
  char* data_ = nullptr;
  uint64_t capacity_ = 0;
};

class HostSegment {
 public:
  // Collective over the lane's `size` ranks (each calls it once, after the
  // lane's sockets are connected): publishes this rank's host identity in
  // `store`, and among the ranks with the same identity the lowest creates the
  // segment and the others map it; the name is unlinked as soon as every one
  // of them answered, so nothing stays in /dev/shm after the job, even one
  // that crashes. Returns null when no other rank shares this host or the
  // segment could not be made (then `note` says why and the lane uses TCP).
  // Throws fsdp::Failure when a rank of this host does not answer by `deadline`.
  // Keys: "shm/<lane>/..." in `store`; `where` names the lane in errors.
  static std::unique_ptr<HostSegment> connect(c10d::Store& store, const std::string& lane, const std::string& where,
                                              int rank, int size, Clock::time_point deadline, std::string* note);
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  // Whether bytes to and from `peer` go through this segment.
  bool shares(int peer) const { return index_[static_cast<size_t>(peer)] >= 0 && mapped_[static_cast<size_t>(peer)]; }
  Ring send_ring(int peer) const;
  Ring recv_ring(int peer) const;

  // This rank's doorbell, to read before looking for work.
  uint32_t bell() const;
  // Wakes `peer` (it may have bytes to read or space to write).
  void ring(int peer) const;
  // Sleeps until this rank's doorbell differs from `seen`, or `timeout_ms` passed.
  void wait(uint32_t seen, int timeout_ms) const;

 private:
  HostSegment() = default;
  std::atomic<uint32_t>* bell_of(int rank) const;
  Ring ring_between(int from, int to) const;

  int rank_ = 0;
  std::vector<int> index_;    // rank -> index among the host's ranks, -1 elsewhere
  std::vector<bool> mapped_;  // rank -> it mapped the segment
  int members_ = 0;
  size_t ring_bytes_ = 0;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// The prefix of every segment's name in /dev/shm:
// "fsdp-cpp.<creator pid>.<creator's pid namespace>.<16 hex digits>".
inline constexpr const char* kSegmentPrefix = "fsdp-cpp.";

// The name (without the leading '/') of a segment created by `pid` in pid
// namespace `pid_ns` (the inode of /proc/self/ns/pid) with suffix `random`.
std::string segment_name(long pid, uint64_t pid_ns, uint64_t random);
// This process's pid namespace (0 when /proc does not say).
uint64_t pid_namespace();

// Removes segments whose creator process no longer exists (left by a job
// killed while it set up its segments), and only those (issue 39): a name of
// exactly segment_name's form, created in this process's pid namespace (a pid
// from another namespace — a container sharing /dev/shm — says nothing here),
// a regular file (never a link) owned by this user, whose creator pid does
// not exist. Returns how many it removed.
int remove_stale_segments();

}  // namespace fsdp::comm::shm

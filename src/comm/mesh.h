// One lane's connections to every other rank of a group (private to comm/).
//
// See Note [TCP transport] in mesh.cpp: data moves through per-peer FIFO
// queues of posted byte ranges, progressed together from the lane's one
// thread, each peer's bytes through its Channel (channel.h: a TCP socket, or
// shared-memory rings for a peer on the same host). Within a lane every rank
// posts the same sequence, so the order of bytes on each connection is the
// only matching needed (no tags, no slots). Connecting: handshake.h.
#pragma once

#include "comm/channel.h"
#include "comm/listen_address.h"
#include "comm/shm_transport.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::comm::tcp {

using Clock = std::chrono::steady_clock;

// Not thread-safe: one thread (the lane's) posts and waits.
class Mesh {
 public:
  // Connects to every other rank (connect_lane_sockets in handshake.h: lower
  // ranks are dialled, higher ranks accepted), then, with
  // `address.shared_memory`, maps the host's segment for the peers on this
  // host. The address stays in `store` (for failure notes). Blocks until done
  // or `timeout`. A peer started with another world size, or another group or
  // lane, is an fsdp::UsageError naming both values; a peer that does not show
  // up is an fsdp::Failure naming it.
  static std::unique_ptr<Mesh> connect(const c10::intrusive_ptr<c10d::Store>& store,
                                       const ListenAddress& address,
                                       const std::string& group, const std::string& lane, int rank,
                                       int size, std::chrono::milliseconds timeout);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Peers whose bytes go through shared memory, and why none do ("" when some do).
  int shm_peers() const { return shm_peers_; }
  const std::string& shm_note() const { return shm_note_; }

  // Queue `n` bytes at `data` to `peer` after everything already queued to it;
  // the memory must stay valid and unchanged until sent(peer) covers it.
  void post_send(int peer, const void* data, size_t n);
  // Queue a receive of the next `n` bytes from `peer` into `data`.
  void post_recv(int peer, void* data, size_t n);

  // Bytes posted / moved on `peer`'s connection since it was made.
  uint64_t send_posted(int peer) const { return peers_[peer].send_posted; }
  uint64_t sent(int peer) const { return peers_[peer].sent; }
  uint64_t recv_posted(int peer) const { return peers_[peer].recv_posted; }
  uint64_t received(int peer) const { return peers_[peer].received; }

  // Marks the start of a collective: a timeout reports bytes counted from here.
  void begin_op();
  // Moves bytes on every connection until done() is true. Throws
  // TransportError when a peer closes its connection or fails, or when
  // `deadline` passes (naming the ranks whose bytes are missing).
  void wait_until(const std::function<bool()>& done, Clock::time_point deadline);
  // wait_until every posted send and receive has completed.
  void wait_all(Clock::time_point deadline);
  // Closes every connection at once. After a failure, pass its message as
  // `reason`: it is first recorded in the store (lane/<lane>/failed/<rank>),
  // so the peers, which then fail at once instead of at their timeout, report
  // why this rank closed rather than blame it.
  void close(const std::string& reason = "");

  // Ranks whose bytes for the current collective (since begin_op()) have not
  // all arrived, in rank order.
  std::vector<int> missing_ranks() const;

 private:
  struct Range {
    char* data;
    size_t left;
  };
  struct Peer {
    std::unique_ptr<Channel> channel;  // null for this rank and after close()
    std::deque<Range> sends;           // head may be partly sent
    std::deque<Range> recvs;           // head may be partly received
    uint64_t send_posted = 0, sent = 0, recv_posted = 0, received = 0;
    // At begin_op(), for timeout messages.
    uint64_t op_send_posted = 0, op_sent = 0, op_recv_posted = 0, op_received = 0;
    bool busy() const { return !sends.empty() || !recvs.empty(); }
  };

  Mesh(c10::intrusive_ptr<c10d::Store> store, std::string group, std::string lane, int rank, int size);
  // One pass of nonblocking moves on every connection with queued work; if
  // nothing moved, waits up to `wait_ms` for readiness. True if bytes moved.
  bool progress(int wait_ms);
  // Moves `q`'s queued bytes in one direction, at most kPassBytes.
  void pump(int q, Peer& p, bool out, bool& moved);
  [[noreturn]] void fail(int q, int err, const char* what);
  std::string missing_report() const;
  // The reason rank q recorded before closing its connections, "" if none.
  std::string failure_note(int q) const;

  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string group_;
  const std::string lane_;
  const int rank_;
  const int size_;
  std::vector<Peer> peers_;  // indexed by rank
  std::unique_ptr<shm::HostSegment> segment_;  // null: every peer over TCP
  int shm_peers_ = 0;
  std::string shm_note_;
  WaitSet waits_;  // reused by every wait
};

}  // namespace fsdp::comm::tcp

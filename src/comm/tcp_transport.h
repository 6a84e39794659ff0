// TCP transport of the CPU process group (private to comm/).
//
// See Note [TCP transport]: one full mesh of sockets per lane, every rank
// listening on an ephemeral port of the chosen address and publishing
// "host port token" in the group's store; a handshake checks group, lane, rank
// and world size. Data moves through per-peer FIFO queues of posted byte
// ranges, progressed together by poll() from the lane's one thread. Within a
// lane every rank posts the same sequence, so the order of bytes on each
// connection is the only matching needed (no tags, no slots).
#pragma once

#include "comm/shm_transport.h"
#include "fsdp/comm/backends.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct pollfd;

namespace fsdp::comm::tcp {

using Clock = std::chrono::steady_clock;

// Where a rank listens. The port is chosen per mesh by the OS.
struct ListenAddress {
  std::string host;  // numeric ("127.0.0.1", "10.1.2.3", "fe80::1%eth0")
  std::string how;   // for errors: "loopback (MASTER_ADDR is local)", "interface eth0 (GLOO_SOCKET_IFNAME)"
  // Exchange with the ranks of the same host through shared memory (Note
  // [Shared memory] in shm_transport.cpp); their sockets stay open, silent.
  bool shared_memory = false;
};

// MASTER_ADDR local: 127.0.0.1. Else GLOO_SOCKET_IFNAME's interface (its first
// IPv4 address, else IPv6). Else the address this host's name resolves to, if
// a socket can bind it (c10d's rule for Gloo). Else, on a single node,
// 127.0.0.1. Throws fsdp::UsageError naming the fix otherwise.
ListenAddress choose_listen_address(const TcpTransportOptions& options);

// A transport failure during a collective, without rank tag or operation: the
// lane adds both. `peer` is the rank at fault when one is known, else -1.
class TransportError : public std::runtime_error {
 public:
  enum class Kind {
    kTimeout,     // the deadline passed; the message names the ranks whose bytes are missing
    kPeerClosed,  // `peer` closed its connection (it exited or crashed)
    kSocket,      // another socket error on `peer`'s connection
  };
  TransportError(Kind kind, int peer, const std::string& message)
      : std::runtime_error(message), kind_(kind), peer_(peer) {}
  Kind kind() const { return kind_; }
  int peer() const { return peer_; }

 private:
  Kind kind_;
  int peer_;
};

// One lane's connections to every other rank of a group. Not thread-safe: one
// thread (the lane's) posts and waits.
class Mesh {
 public:
  // Connects to every other rank (lower ranks are dialled, higher ranks
  // accepted), publishing this rank's address under "lane/<lane>/<rank>" in
  // `store` (kept, for failure notes). Blocks until done or `timeout`. A peer started with another world
  // size, or another group or lane, is an fsdp::UsageError naming both values;
  // a peer that does not show up is an fsdp::Failure naming it.
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
  int shm_peers() const;
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

 private:
  struct Range {
    char* data;
    size_t left;
  };
  struct Peer {
    int fd = -1;
    std::deque<Range> sends;  // head may be partly sent
    std::deque<Range> recvs;  // head may be partly received
    uint64_t send_posted = 0, sent = 0, recv_posted = 0, received = 0;
    // At begin_op(), for timeout messages.
    uint64_t op_send_posted = 0, op_sent = 0, op_recv_posted = 0, op_received = 0;
    // Shared memory (Note [Shared memory]): bytes move through the rings, the
    // socket only tells that the peer is gone.
    bool shm = false;
    shm::Ring tx, rx;
    bool closed_seen = false;  // its socket reported EOF or an error while we waited
  };

  Mesh(c10::intrusive_ptr<c10d::Store> store, std::string group, std::string lane, int rank, int size);
  // One pass of nonblocking I/O on every connection with queued work; if
  // nothing moved, poll() up to `wait_ms` for readiness. True if bytes moved.
  bool progress(int wait_ms);
  void pump_sends(int q, Peer& p, bool& moved);
  void pump_recvs(int q, Peer& p, bool& moved);
  void pump_shm_sends(int q, Peer& p, bool& moved);
  void pump_shm_recvs(int q, Peer& p, bool& moved);
  // Shared-memory peers with queued work: sleep on the doorbell (or poll the
  // TCP peers' sockets) and look whether their sockets closed.
  void wait_shm(uint32_t bell, const pollfd* tcp, size_t n_tcp, int wait_ms);
  [[noreturn]] void fail_socket(int q, int err, const char* what);
  std::string missing_report() const;

 public:
  // Ranks whose bytes for the current collective (since begin_op()) have not
  // all arrived, in rank order.
  std::vector<int> missing_ranks() const;

 private:
  // The reason rank q recorded before closing its connections, "" if none.
  std::string failure_note(int q) const;

  const c10::intrusive_ptr<c10d::Store> store_;
  const std::string group_;
  const std::string lane_;
  const int rank_;
  const int size_;
  std::vector<Peer> peers_;  // indexed by rank; peers_[rank_].fd == -1
  std::unique_ptr<shm::HostSegment> segment_;  // null: every peer over TCP
  std::string shm_note_;
};

}  // namespace fsdp::comm::tcp

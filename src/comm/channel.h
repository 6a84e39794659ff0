// One peer's byte streams, both directions (private to comm/): the seam
// between tcp::Mesh, which owns the per-peer queues, the byte accounting and
// the failure report, and how bytes actually move. Two implementations: a TCP
// socket (tcp_channel.cpp) and a pair of shared-memory rings beside a silent
// socket (shm_channel.cpp). See Note [Channels] in mesh.cpp.
#pragma once

#include "comm/shm_transport.h"

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fsdp::comm::tcp {

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

// What one move did: `bytes` moved (0: the channel cannot move now), or the
// connection failed: `error` 0 when the peer closed it, else an errno value.
struct Moved {
  size_t bytes = 0;
  int error = -1;  // -1: no failure
  bool failed() const { return error >= 0; }
};

// What a mesh with nothing to move sleeps on: the sockets of channels whose
// bytes go through the kernel, and the doorbell (Note [Shared memory]) of
// channels whose bytes go through shared memory. Channels add themselves with
// Channel::arm; the mesh then calls wait().
struct WaitSet {
  std::vector<pollfd> fds;
  const shm::HostSegment* doorbell = nullptr;
  uint32_t bell = 0;  // the doorbell's value read before the pass that moved nothing
  void clear() {
    fds.clear();
    doorbell = nullptr;
  }
  // Until a socket is ready, the doorbell rang, or about `wait_ms` passed
  // (with a doorbell: a few milliseconds at most, to look at the sockets of
  // shared-memory peers). Throws TransportError when poll() fails.
  void wait(int wait_ms);
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Moves up to `n` bytes from `p` to the peer, without blocking.
  virtual Moved move_out(const char* p, size_t n) = 0;
  // Moves up to `n` of the peer's next bytes into `p`, without blocking.
  virtual Moved move_in(char* p, size_t n) = 0;
  // Adds to `w` what wakes a waiter when this channel can move again
  // (`in`: bytes to receive are queued; `out`: bytes to send are).
  virtual void arm(WaitSet& w, bool in, bool out) = 0;
  // Whether the peer is gone, looked at when nothing moved: -1 not seen, 0
  // the peer closed, else an errno value. A channel whose move_in reports
  // the peer's close itself (TCP) answers -1 at no cost. Throws
  // TransportError for a peer that breaks the protocol.
  virtual int closed() = 0;
  // Shuts the connection down both ways; the peer's moves then fail.
  virtual void close() = 0;
};

// A connected nonblocking socket to `peer` (owned from here on).
std::unique_ptr<Channel> make_tcp_channel(int fd, int peer);
// Rings of `segment` (which must outlive the channel) to and from `peer`;
// `fd`, the peer's connected socket, carries no bytes: its close tells that
// the peer exited.
std::unique_ptr<Channel> make_shm_channel(int fd, int peer, const shm::HostSegment& segment);

}  // namespace fsdp::comm::tcp

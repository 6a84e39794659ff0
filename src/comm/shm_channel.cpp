// A peer's bytes through the shared-memory rings of its host (Note [Shared
// memory] in shm_transport.cpp; Note [Channels] in mesh.cpp).
#include "comm/channel.h"
#include "comm/socket.h"

#include "fsdp/common/error.h"

#include <sys/socket.h>

#include <cerrno>

namespace fsdp::comm::tcp {

namespace {

class ShmChannel final : public Channel {
 public:
  ShmChannel(int fd, int peer, const shm::HostSegment& segment)
      : fd_(fd), peer_(peer), segment_(segment), tx_(segment.send_ring(peer)), rx_(segment.recv_ring(peer)) {}

  Moved move_out(const char* p, size_t n) override {
    const size_t k = tx_.write(p, n);
    if (k > 0) segment_.ring(peer_);  // bytes for it to read
    return {k};
  }

  Moved move_in(char* p, size_t n) override {
    const size_t k = rx_.read(p, n);
    if (k > 0) segment_.ring(peer_);  // space for its next bytes
    return {k};
  }

  void arm(WaitSet& w, bool in, bool out) override {
    if (in || out) w.doorbell = &segment_;
  }

  int closed() override {
    // The socket is silent while the peer lives: readable means EOF, a reset,
    // or a peer that is not speaking this protocol.
    pollfd one{fd_.get(), POLLIN, 0};
    if (fd_.get() < 0 || ::poll(&one, 1, 0) <= 0) return -1;
    char byte;
    const ssize_t k = ::recv(fd_.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (k == 0) return 0;
    if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -1 : errno;
    throw TransportError(TransportError::Kind::kSocket, peer_,
                         detail::cat("rank ", peer_, " sent bytes on the socket of a shared-memory connection — "
                                     "run the same fsdp-cpp build on every rank"));
  }

  void close() override {
    if (fd_.get() >= 0) ::shutdown(fd_.get(), SHUT_RDWR);
    fd_.reset();
    tx_ = rx_ = shm::Ring();
  }

 private:
  Fd fd_;
  const int peer_;
  const shm::HostSegment& segment_;
  shm::Ring tx_, rx_;
};

}  // namespace

std::unique_ptr<Channel> make_shm_channel(int fd, int peer, const shm::HostSegment& segment) {
  return std::make_unique<ShmChannel>(fd, peer, segment);
}

}  // namespace fsdp::comm::tcp

// A peer's bytes through a TCP socket (Note [Channels] in mesh.cpp).
#include "comm/channel.h"
#include "comm/socket.h"

#include <sys/socket.h>

#include <cerrno>

namespace fsdp::comm::tcp {

namespace {

class TcpChannel final : public Channel {
 public:
  explicit TcpChannel(int fd) : fd_(fd) {}

  Moved move_out(const char* p, size_t n) override {
    for (;;) {
      const ssize_t k = ::send(fd_.get(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k >= 0) return {static_cast<size_t>(k)};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
      return {0, errno};
    }
  }

  Moved move_in(char* p, size_t n) override {
    for (;;) {
      const ssize_t k = ::recv(fd_.get(), p, n, MSG_DONTWAIT);
      if (k > 0) return {static_cast<size_t>(k)};
      if (k == 0) return {0, 0};  // EOF: the peer closed while we expect bytes
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
      return {0, errno};
    }
  }

  void arm(WaitSet& w, bool in, bool out) override {
    // Readiness, hang-up and errors all lead to the next pass's I/O, which reports them.
    const short events = static_cast<short>((in ? POLLIN : 0) | (out ? POLLOUT : 0));
    if (events != 0) w.fds.push_back(pollfd{fd_.get(), events, 0});
  }

  int closed() override { return -1; }  // move_in sees EOF, move_out EPIPE

  void close() override {
    if (fd_.get() >= 0) ::shutdown(fd_.get(), SHUT_RDWR);
    fd_.reset();
  }

 private:
  Fd fd_;
};

}  // namespace

std::unique_ptr<Channel> make_tcp_channel(int fd, int /*peer*/) { return std::make_unique<TcpChannel>(fd); }

}  // namespace fsdp::comm::tcp

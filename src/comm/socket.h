// Socket helpers of the TCP transport (private to comm/): an owning file
// descriptor, blocking-with-deadline reads and writes on nonblocking sockets,
// and the buffer and delay settings every connection gets.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace fsdp::comm::tcp {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

std::string errno_text(int err);

// Milliseconds left until `deadline`, rounded up, in [0, INT_MAX].
int ms_until(Clock::time_point deadline);

// Waits until `fd` is ready for `events` (or in error). False at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline);

// Writes / reads exactly `n` bytes, waiting for readiness up to `deadline`.
// "" on success, else why not.
std::string write_all(int fd, const char* p, size_t n, Clock::time_point deadline);
std::string read_all(int fd, char* p, size_t n, Clock::time_point deadline);

// Kernel buffers per connection and direction (best effort; before connect()
// or listen(): the window scale is fixed at the handshake).
void tune_buffers(int fd);
// No Nagle delay: small collectives (a scalar loss) are latency bound.
void set_nodelay(int fd);

// The numeric form of an address ("10.1.2.3", "fe80::1%eth0"); "" if none.
std::string numeric_host(const sockaddr* a, socklen_t len);
socklen_t sockaddr_len(const sockaddr* a);

// Waits for `key` in `store` by polling check() (a timed-out wait() may leave
// a store client out of step). False at the deadline.
bool wait_key(c10d::Store& store, const std::string& key, Clock::time_point deadline);

}  // namespace fsdp::comm::tcp

#include "comm/socket.h"

#include "fsdp/common/error.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

namespace fsdp::comm::tcp {

namespace {
// Kernel buffer per connection and direction (the kernel caps it at
// net.core.{w,r}mem_max). Sized for the 1 MiB segments of the reduce lane: a
// few segments stay in flight while the lane thread sums one.
constexpr int kSocketBufferBytes = 4 << 20;
}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int err) { return std::strerror(err); }

int ms_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) FSDP_FAIL("poll failed: ", errno_text(errno));
  }
}

std::string write_all(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) return "timed out";
    } else {
      return errno_text(errno);
    }
  }
  return "";
}

std::string read_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == 0) {
      return "the connection was closed";
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) return "timed out";
    } else {
      return errno_text(errno);
    }
  }
  return "";
}

void tune_buffers(int fd) {
  // Best effort: the kernel clamps to its limits, and autotuning is only a
  // little slower where this fails.
  const int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string numeric_host(const sockaddr* a, socklen_t len) {
  char buf[NI_MAXHOST] = {0};
  if (getnameinfo(a, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

socklen_t sockaddr_len(const sockaddr* a) {
  return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

bool wait_key(c10d::Store& store, const std::string& key, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (store.check({key})) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        pause, std::chrono::milliseconds(std::max(1, ms_until(deadline)))));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace fsdp::comm::tcp

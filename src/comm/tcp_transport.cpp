#include "comm/tcp_transport.h"

#include "fsdp/common/error.h"

#include <arpa/inet.h>
#include <endian.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace fsdp::comm::tcp {

// Note [TCP transport]
// Each lane of a group owns a full mesh: one TCP connection per pair of ranks.
// Connecting: every rank listens on an ephemeral port of its chosen address
// and publishes "host port token" under lane/<lane>/<rank> in the group's
// store; rank r dials every rank q < r and accepts every rank q > r. Dialling
// only downwards cannot deadlock (rank 0 only accepts; a rank answers its
// higher peers once its own dials are done, and those depend only on lower
// ranks). The dialler sends a hello (magic, version, group, lane, rank, world
// size, the token it read); the acceptor always answers with its own hello
// before judging, so both ends see both sets of values: a WORLD_SIZE mismatch
// is reported on both sides with both sizes. A connection whose hello is not
// ours (a port scanner) is dropped; a token mismatch means the dialler read a
// stale address, so the acceptor drops it and the dialler fails naming it.
//
// Moving data: all sockets are nonblocking. Per peer, posted sends and
// receives are FIFO queues of byte ranges; progress() drains every queue as far
// as the kernel allows (bounded per pass so one fast peer cannot starve the
// others) and poll()s only when nothing moved. Sends and receives to and from
// every peer advance together, so "everyone sends to everyone, then everyone
// receives" never deadlocks, whatever the message sizes. Every rank of a lane
// posts the same sequence, hence the bytes on each connection arrive in the
// order the receiver posted them: stream order replaces gloo's slots and tags.
// The lane thread does the I/O itself between computations; the kernel socket
// buffers (kSocketBufferBytes) keep the wire busy while it sums a segment.
//
// Failures: EOF or a reset while bytes are expected fails the wait at once
// naming the peer ("closed its connection"); a deadline names the ranks whose
// bytes are missing since begin_op() and how many arrived. The caller then
// close()s the mesh, so the peers waiting on this rank fail at once too; it
// first records its error in the store, and a peer that sees the connection
// close reports that error (the first cause) instead of blaming this rank.

namespace {

constexpr uint64_t kMagic = 0x4653445054435031ULL;  // "FSDPTCP1"
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloHeaderBytes = 8 + 4 + 4 + 4 + 8 + 4 + 4;
constexpr uint32_t kMaxNameBytes = 4096;
// Kernel buffer per connection and direction (the kernel caps it at
// net.core.{w,r}mem_max). Sized for the 1 MiB segments of the reduce lane: a
// few segments stay in flight while the lane thread sums one.
constexpr int kSocketBufferBytes = 4 << 20;
// Bytes moved per connection and direction in one progress() pass.
constexpr size_t kPassBytes = size_t{4} << 20;
// A dialled peer that refuses the connection has exited (its listener lives
// until its mesh is complete, and it publishes its address only after
// listening); retry briefly in case of a transient refusal, then give up.
constexpr auto kRefusedGrace = std::chrono::seconds(3);
// A rank sends its hello right after connecting; an accepted connection that
// says nothing for this long is not a rank and must not hold up the others
// waiting in the listen backlog.
constexpr auto kHelloGrace = std::chrono::seconds(10);
// Waiting on shared memory (Note [Shared memory]): spins (~10 us) before
// sleeping, and the longest sleep between looks at the peers' sockets.
constexpr int kShmSpins = 2000;
constexpr int kShmSleepMs = 2;

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
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string errno_text(int err) { return std::strerror(err); }

// Milliseconds left until `deadline`, rounded up, in [0, INT_MAX].
int ms_until(Clock::time_point deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string numeric_host(const sockaddr* a, socklen_t len) {
  char buf[NI_MAXHOST] = {0};
  if (getnameinfo(a, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

socklen_t sockaddr_len(const sockaddr* a) {
  return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// The first address `host` resolves to that a socket can bind, numeric; "" if
// none (c10d's test before it uses the hostname for Gloo).
std::string bindable_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return "";
  std::string found;
  for (addrinfo* a = result; a != nullptr && found.empty(); a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0) found = numeric_host(a->ai_addr, a->ai_addrlen);
  }
  freeaddrinfo(result);
  return found;
}

// The numeric address of interface `ifname` (IPv4 first, else IPv6), "" if it
// has none; `available` lists the interfaces that have one.
std::string interface_address(const std::string& ifname, std::string* available) {
  ifaddrs* list = nullptr;
  FSDP_CHECK(getifaddrs(&list) == 0, "getifaddrs failed: ", errno_text(errno),
             " — cannot look up GLOO_SOCKET_IFNAME=", ifname);
  std::string v4, v6;
  std::set<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    names.insert(i->ifa_name);
    if (ifname != i->ifa_name) continue;
    const std::string host = numeric_host(i->ifa_addr, sockaddr_len(i->ifa_addr));
    if (family == AF_INET && v4.empty()) v4 = host;
    if (family == AF_INET6 && v6.empty()) v6 = host;
  }
  freeifaddrs(list);
  std::ostringstream os;
  for (const auto& n : names) os << (os.tellp() > 0 ? ", " : "") << n;
  *available = os.str();
  return v4.empty() ? v6 : v4;
}

void tune_buffers(int fd) {
  // Best effort: the kernel clamps to its limits, and autotuning is only a
  // little slower where this fails.
  const int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void set_nodelay(int fd) {
  // Small collectives (a scalar loss) are latency bound: no Nagle delay.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits until `fd` is ready for `events` (or in error). False at the deadline.
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

// "" on success, else why not.
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

// --- handshake

struct Hello {
  int32_t rank = 0;
  int32_t size = 0;
  uint64_t token = 0;
  std::string lane;
  std::string group;
};

void put32(std::string& out, uint32_t v) {
  v = htobe32(v);
  out.append(reinterpret_cast<const char*>(&v), 4);
}
void put64(std::string& out, uint64_t v) {
  v = htobe64(v);
  out.append(reinterpret_cast<const char*>(&v), 8);
}
uint32_t get32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return be32toh(v);
}
uint64_t get64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return be64toh(v);
}

std::string encode(const Hello& h) {
  std::string out;
  put64(out, kMagic);
  put32(out, kVersion);
  put32(out, static_cast<uint32_t>(h.rank));
  put32(out, static_cast<uint32_t>(h.size));
  put64(out, h.token);
  put32(out, static_cast<uint32_t>(h.lane.size()));
  put32(out, static_cast<uint32_t>(h.group.size()));
  return out + h.lane + h.group;
}

// Reads a hello. "" on success; otherwise why it is not one of ours.
std::string read_hello(int fd, Clock::time_point deadline, Hello* h) {
  char head[kHelloHeaderBytes];
  std::string err = read_all(fd, head, sizeof(head), deadline);
  if (!err.empty()) return err;
  if (get64(head) != kMagic) return "not an fsdp-cpp process group (bad magic)";
  if (get32(head + 8) != kVersion) {
    return detail::cat("protocol version ", get32(head + 8), ", this build speaks ", kVersion,
                       " — run the same fsdp-cpp build on every rank");
  }
  h->rank = static_cast<int32_t>(get32(head + 12));
  h->size = static_cast<int32_t>(get32(head + 16));
  h->token = get64(head + 20);
  const uint32_t lane_len = get32(head + 28);
  const uint32_t group_len = get32(head + 32);
  if (lane_len > kMaxNameBytes || group_len > kMaxNameBytes) return "malformed hello";
  std::string names(lane_len + group_len, '\0');
  err = read_all(fd, names.data(), names.size(), deadline);
  if (!err.empty()) return err;
  h->lane = names.substr(0, lane_len);
  h->group = names.substr(lane_len);
  return "";
}

// Both ends check the other's hello against their own: the same group, lane
// and world size. `peer` says who the other end is, for the message.
void check_hello(const Hello& mine, const Hello& theirs, const std::string& where,
                 const std::string& peer) {
  FSDP_CHECK(theirs.size == mine.size, where, ": ", peer, " has a world size of ", theirs.size,
             " but this rank has ", mine.size,
             " — every rank must be started with the same WORLD_SIZE (", mine.size, " vs ",
             theirs.size, "); check the launcher's --nproc / --nnodes and the job's environment");
  FSDP_CHECK(theirs.group == mine.group && theirs.lane == mine.lane, where, ": ", peer,
             " belongs to group '", theirs.group, "' (", theirs.lane, " lane), not to group '",
             mine.group, "' (", mine.lane,
             " lane) — every rank must create the same groups in the same order");
}

// --- addresses in the store

std::string address_key(const std::string& lane, int rank) { return detail::cat("lane/", lane, "/", rank); }
std::string failure_key(const std::string& lane, int rank) {
  return detail::cat("lane/", lane, "/failed/", rank);
}

struct PeerAddress {
  std::string host;
  std::string port;
  uint64_t token = 0;
  std::string text() const {
    return host.find(':') != std::string::npos ? detail::cat("[", host, "]:", port)
                                                : detail::cat(host, ":", port);
  }
};

uint64_t random_token() {
  std::random_device rd;
  const uint64_t a = (static_cast<uint64_t>(rd()) << 32) | rd();
  const uint64_t b = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return a ^ (b * 0x9E3779B97F4A7C15ULL) ^ static_cast<uint64_t>(getpid());
}

// Polls with check(): a timed-out wait() may leave a store client out of step.
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

// Listens on `address` (port chosen by the OS).
Fd listen_on(const ListenAddress& address, int backlog, std::string* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(address.host.c_str(), "0", &hints, &result);
  FSDP_CHECK(rc == 0, "cannot listen on ", address.host, " (", address.how, "): ", gai_strerror(rc),
             " — set GLOO_SOCKET_IFNAME to the network interface to use");
  Fd fd(socket(result->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int err = fd.get() < 0 ? errno : 0;
  if (err == 0) {
    tune_buffers(fd.get());  // accepted sockets inherit the listener's buffer sizes
    if (bind(fd.get(), result->ai_addr, result->ai_addrlen) != 0 || listen(fd.get(), backlog) != 0) err = errno;
  }
  freeaddrinfo(result);
  FSDP_CHECK(err == 0, "cannot listen on ", address.host, " (", address.how, "): ", errno_text(err),
             " — set GLOO_SOCKET_IFNAME to a network interface of this host");
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  FSDP_CHECK(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0,
             "getsockname failed: ", errno_text(errno));
  const uint16_t p = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                 : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  *port = std::to_string(p);
  return fd;
}

// Connects to `a`; retries a refusal for kRefusedGrace. On failure returns an
// invalid Fd and sets *error.
Fd dial(const PeerAddress& a, Clock::time_point deadline, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(a.host.c_str(), a.port.c_str(), &hints, &result);
  if (rc != 0) {
    *error = gai_strerror(rc);
    return Fd();
  }
  const auto refused_until = std::min(deadline, Clock::now() + kRefusedGrace);
  auto pause = std::chrono::milliseconds(10);
  Fd fd;
  for (;;) {
    fd = Fd(socket(result->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      *error = errno_text(errno);
      break;
    }
    tune_buffers(fd.get());  // before connecting: the window scale is fixed at the handshake
    int err = 0;
    if (::connect(fd.get(), result->ai_addr, result->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        if (!wait_fd(fd.get(), POLLOUT, deadline)) {
          *error = "timed out";
          fd.reset();
          break;
        }
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) break;
    fd.reset();
    *error = errno_text(err);
    if (Clock::now() + pause >= (err == ECONNREFUSED ? refused_until : deadline)) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  freeaddrinfo(result);
  return fd;
}

}  // namespace

namespace {
ListenAddress choose_listen_host(const TcpTransportOptions& t);
}  // namespace

ListenAddress choose_listen_address(const TcpTransportOptions& t) {
  ListenAddress a = choose_listen_host(t);
  a.shared_memory = t.shared_memory;
  return a;
}

namespace {
ListenAddress choose_listen_host(const TcpTransportOptions& t) {
  if (is_loopback(t.master_addr)) return {"127.0.0.1", "loopback (MASTER_ADDR is local)"};
  if (!t.socket_ifname.empty()) {
    std::string available;
    const std::string host = interface_address(t.socket_ifname, &available);
    FSDP_CHECK(!host.empty(), "GLOO_SOCKET_IFNAME=", t.socket_ifname,
               " names no network interface with an IPv4 or IPv6 address on this host (interfaces: ",
               available, ") — set GLOO_SOCKET_IFNAME to the interface that reaches MASTER_ADDR ",
               t.master_addr);
    return {host, "interface " + t.socket_ifname + " (GLOO_SOCKET_IFNAME)"};
  }
  char name[256] = {0};
  FSDP_CHECK(gethostname(name, sizeof(name) - 1) == 0, "gethostname failed: ", errno_text(errno),
             " — set GLOO_SOCKET_IFNAME to the network interface to use");
  const std::string host = bindable_address(name);
  if (!host.empty()) return {host, std::string("hostname ") + name};
  FSDP_CHECK(t.single_node, "this host's name '", name,
             "' does not resolve to an address the process group can bind, and the job spans several "
             "nodes — set GLOO_SOCKET_IFNAME to the interface that reaches MASTER_ADDR ",
             t.master_addr, " (e.g. GLOO_SOCKET_IFNAME=eth0)");
  return {"127.0.0.1", "loopback (hostname does not resolve)"};
}
}  // namespace

Mesh::Mesh(c10::intrusive_ptr<c10d::Store> store, std::string group, std::string lane, int rank, int size)
    : store_(std::move(store)),
      group_(std::move(group)),
      lane_(std::move(lane)),
      rank_(rank),
      size_(size),
      peers_(static_cast<size_t>(size)) {}

Mesh::~Mesh() { close(); }

std::unique_ptr<Mesh> Mesh::connect(const c10::intrusive_ptr<c10d::Store>& store_ptr,
                                    const ListenAddress& address, const std::string& group,
                                    const std::string& lane, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  FSDP_ASSERT(size >= 2 && rank >= 0 && rank < size, "mesh of rank ", rank, " of ", size);
  const auto deadline = Clock::now() + timeout;
  const std::string where =
      detail::cat("group '", group, "' (", lane, " lane, rank ", rank, " of ", size, ")");
  std::unique_ptr<Mesh> mesh(new Mesh(store_ptr, group, lane, rank, size));
  c10d::Store& store = *store_ptr;

  std::string port;
  Fd listener = listen_on(address, size, &port);
  const uint64_t token = random_token();
  const std::string value = detail::cat(address.host, " ", port, " ", token);
  store.set(address_key(lane, rank), std::vector<uint8_t>(value.begin(), value.end()));

  Hello mine;
  mine.rank = rank;
  mine.size = size;
  mine.lane = lane;
  mine.group = group;

  // Dial every lower rank.
  for (int q = 0; q < rank; ++q) {
    const std::string key = address_key(lane, q);
    if (!wait_key(store, key, deadline)) {
      FSDP_FAIL(where, ": rank ", q, " did not publish its address within ", timeout.count(),
                " ms — is it running, with the same WORLD_SIZE and group sequence? See its log");
    }
    const auto raw = store.get(key);
    PeerAddress a;
    std::istringstream in(std::string(raw.begin(), raw.end()));
    in >> a.host >> a.port >> a.token;
    FSDP_ASSERT(!in.fail(), "malformed address of rank ", q, " in the store");
    std::string error;
    Fd fd = dial(a, deadline, &error);
    if (fd.get() < 0) {
      FSDP_FAIL(where, ": cannot connect to rank ", q, " at ", a.text(), ": ", error,
                " — check that rank ", q, " is running and that this host can reach it "
                "(GLOO_SOCKET_IFNAME selects the interface each rank listens on)");
    }
    Hello hello = mine;
    hello.token = a.token;
    const std::string bytes = encode(hello);
    error = write_all(fd.get(), bytes.data(), bytes.size(), deadline);
    Hello reply;
    if (error.empty()) error = read_hello(fd.get(), deadline, &reply);
    if (!error.empty()) {
      FSDP_FAIL(where, ": the handshake with rank ", q, " at ", a.text(), " failed: ", error,
                " — is rank ", q, " running the same fsdp-cpp build, and did it fail? See its log");
    }
    check_hello(mine, reply, where, detail::cat("rank ", reply.rank, " at ", a.text()));
    if (reply.rank != q || reply.token != a.token) {
      FSDP_FAIL(where, ": the process at ", a.text(), " answered as rank ", reply.rank,
                " of another group instance, not as rank ", q,
                " — the address in the store is stale (a previous job on the same store prefix?)");
    }
    set_nodelay(fd.get());
    mesh->peers_[static_cast<size_t>(q)].fd = fd.release();
  }

  // Accept every higher rank.
  std::vector<bool> connected(static_cast<size_t>(size), false);
  int pending = size - 1 - rank;
  while (pending > 0) {
    if (!wait_fd(listener.get(), POLLIN, deadline)) {
      std::ostringstream missing;
      int n = 0;
      for (int q = rank + 1; q < size; ++q) {
        if (!connected[static_cast<size_t>(q)]) missing << (n++ ? ", " : "") << q;
      }
      FSDP_FAIL(where, ": ", n == 1 ? "rank " : "ranks ", missing.str(), " did not connect within ",
                timeout.count(), " ms — they did not start, failed before creating this group, or "
                "cannot reach ", address.host, " (", address.how, "); see their logs");
    }
    Fd fd(accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED) continue;
      FSDP_FAIL(where, ": accept failed: ", errno_text(err));
    }
    Hello hello;
    const auto hello_deadline = std::min(deadline, Clock::now() + kHelloGrace);
    if (!read_hello(fd.get(), hello_deadline, &hello).empty()) continue;  // not one of ours: drop it
    Hello reply = mine;
    reply.token = token;
    // Answer before judging, so the dialler sees our values and can name them.
    const std::string bytes = encode(reply);
    if (!write_all(fd.get(), bytes.data(), bytes.size(), deadline).empty()) continue;
    if (hello.token != token) continue;  // dialled a stale address of ours; it fails on its side
    check_hello(mine, hello, where, detail::cat("rank ", hello.rank));
    FSDP_CHECK(hello.rank > rank && hello.rank < size, where, ": a process connected as rank ",
               hello.rank, ", which should not dial this rank — every rank needs a distinct RANK in [0, ",
               size, ")");
    FSDP_CHECK(!connected[static_cast<size_t>(hello.rank)], where, ": two processes claim rank ",
               hello.rank, " — every rank needs a distinct RANK in [0, ", size, ")");
    connected[static_cast<size_t>(hello.rank)] = true;
    --pending;
    set_nodelay(fd.get());
    mesh->peers_[static_cast<size_t>(hello.rank)].fd = fd.release();
  }
  if (address.shared_memory) {
    mesh->segment_ = shm::HostSegment::connect(store, lane, where, rank, size, deadline, &mesh->shm_note_);
    for (int q = 0; q < size && mesh->segment_; ++q) {
      if (q == rank || !mesh->segment_->shares(q)) continue;
      Peer& p = mesh->peers_[static_cast<size_t>(q)];
      p.shm = true;
      p.tx = mesh->segment_->send_ring(q);
      p.rx = mesh->segment_->recv_ring(q);
    }
  } else {
    mesh->shm_note_ = "off";
  }
  return mesh;
}

int Mesh::shm_peers() const {
  int n = 0;
  for (const Peer& p : peers_) n += p.shm ? 1 : 0;
  return n;
}

void Mesh::post_send(int peer, const void* data, size_t n) {
  FSDP_ASSERT(peer != rank_ && peer >= 0 && peer < size_, "send to rank ", peer);
  if (n == 0) return;
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.sends.push_back({static_cast<char*>(const_cast<void*>(data)), n});
  p.send_posted += n;
}

void Mesh::post_recv(int peer, void* data, size_t n) {
  FSDP_ASSERT(peer != rank_ && peer >= 0 && peer < size_, "receive from rank ", peer);
  if (n == 0) return;
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.recvs.push_back({static_cast<char*>(data), n});
  p.recv_posted += n;
}

void Mesh::begin_op() {
  for (Peer& p : peers_) {
    p.op_send_posted = p.send_posted;
    p.op_sent = p.sent;
    p.op_recv_posted = p.recv_posted;
    p.op_received = p.received;
  }
}

void Mesh::fail_socket(int q, int err, const char* what) {
  const Peer& p = peers_[static_cast<size_t>(q)];
  const std::string progress =
      detail::cat(p.received - p.op_received, " of ", p.recv_posted - p.op_recv_posted,
                  " bytes expected from it in this collective had arrived");
  if (err == 0 || err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ECONNABORTED) {
    const std::string note = failure_note(q);
    if (!note.empty()) {
      throw TransportError(TransportError::Kind::kPeerClosed, q,
                           detail::cat("rank ", q, " closed its connection (", progress,
                                       ") after failing first: ", note));
    }
    throw TransportError(TransportError::Kind::kPeerClosed, q,
                         detail::cat("rank ", q, " closed its connection (", progress,
                                     ") — it exited or crashed; see rank ", q, "'s log"));
  }
  throw TransportError(TransportError::Kind::kSocket, q,
                       detail::cat(what, " on the connection to rank ", q, " failed: ", errno_text(err),
                                   " (", progress, ")"));
}

void Mesh::pump_sends(int q, Peer& p, bool& moved) {
  size_t budget = kPassBytes;
  while (!p.sends.empty() && budget > 0) {
    Range& r = p.sends.front();
    const ssize_t k = ::send(p.fd, r.data, std::min(r.left, budget), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      const auto n = static_cast<size_t>(k);
      r.data += n;
      r.left -= n;
      p.sent += n;
      budget -= n;
      moved = true;
      if (r.left == 0) p.sends.pop_front();
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else {
      fail_socket(q, errno, "send");
    }
  }
}

void Mesh::pump_recvs(int q, Peer& p, bool& moved) {
  size_t budget = kPassBytes;
  while (!p.recvs.empty() && budget > 0) {
    Range& r = p.recvs.front();
    const ssize_t k = ::recv(p.fd, r.data, std::min(r.left, budget), MSG_DONTWAIT);
    if (k > 0) {
      const auto n = static_cast<size_t>(k);
      r.data += n;
      r.left -= n;
      p.received += n;
      budget -= n;
      moved = true;
      if (r.left == 0) p.recvs.pop_front();
    } else if (k == 0) {
      fail_socket(q, 0, "recv");  // EOF: the peer closed while we expect bytes
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else {
      fail_socket(q, errno, "recv");
    }
  }
}

void Mesh::pump_shm_sends(int q, Peer& p, bool& moved) {
  size_t budget = kPassBytes;
  bool wrote = false;
  while (!p.sends.empty() && budget > 0) {
    Range& r = p.sends.front();
    const size_t n = p.tx.write(r.data, std::min(r.left, budget));
    if (n == 0) break;  // the ring is full
    r.data += n;
    r.left -= n;
    p.sent += n;
    budget -= n;
    wrote = true;
    if (r.left == 0) p.sends.pop_front();
  }
  if (wrote) {
    moved = true;
    segment_->ring(q);
  }
}

void Mesh::pump_shm_recvs(int q, Peer& p, bool& moved) {
  size_t budget = kPassBytes;
  bool read = false;
  while (!p.recvs.empty() && budget > 0) {
    Range& r = p.recvs.front();
    const size_t n = p.rx.read(r.data, std::min(r.left, budget));
    if (n == 0) break;  // nothing more has arrived
    r.data += n;
    r.left -= n;
    p.received += n;
    budget -= n;
    read = true;
    if (r.left == 0) p.recvs.pop_front();
  }
  if (read) {
    moved = true;
    segment_->ring(q);  // space for its next bytes
  }
}

void Mesh::wait_shm(uint32_t bell, const pollfd* tcp, size_t n_tcp, int wait_ms) {
  // A short busy spin first (no yield: on a loaded machine a yield can give
  // the core away for a whole time slice, where a futex wake-up is prompt).
  for (int i = 0; i < kShmSpins; ++i) {
    if (segment_->bell() != bell) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  if (n_tcp == 0) {
    segment_->wait(bell, std::min(wait_ms, kShmSleepMs));
  } else if (::poll(const_cast<pollfd*>(tcp), n_tcp, 1) < 0 && errno != EINTR) {
    throw TransportError(TransportError::Kind::kSocket, -1, detail::cat("poll failed: ", errno_text(errno)));
  }
  // Has a peer we wait for gone? Its socket, silent otherwise, reports EOF.
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (!p.shm || p.fd < 0 || (p.sends.empty() && p.recvs.empty())) continue;
    pollfd one{p.fd, POLLIN, 0};
    if (::poll(&one, 1, 0) > 0) p.closed_seen = true;  // EOF, reset or stray bytes: the next pass decides
  }
}

bool Mesh::progress(int wait_ms) {
  const uint32_t bell = segment_ ? segment_->bell() : 0;  // before the pass: no wake-up is missed
  bool moved = false;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (p.fd < 0) continue;
    if (p.shm) {
      if (!p.recvs.empty()) pump_shm_recvs(q, p, moved);
      if (!p.sends.empty()) pump_shm_sends(q, p, moved);
    } else {
      if (!p.recvs.empty()) pump_recvs(q, p, moved);
      if (!p.sends.empty()) pump_sends(q, p, moved);
    }
  }
  if (moved || wait_ms == 0) return moved;
  // Nothing moved: a shared-memory peer whose socket closed will send nothing more.
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (p.shm && p.closed_seen && p.fd >= 0 && (!p.sends.empty() || !p.recvs.empty())) {
      char byte;
      const ssize_t k = ::recv(p.fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
      if (k == 0) fail_socket(q, 0, "recv");
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail_socket(q, errno, "recv");
      if (k > 0) {
        throw TransportError(TransportError::Kind::kSocket, q,
                             detail::cat("rank ", q, " sent bytes on the socket of a shared-memory connection — "
                                         "run the same fsdp-cpp build on every rank"));
      }
      p.closed_seen = false;
    }
  }
  pollfd fds[64];
  std::vector<pollfd> many;
  pollfd* set = size_ <= 64 ? fds : (many.resize(static_cast<size_t>(size_)), many.data());
  nfds_t n = 0;
  bool shm_waiting = false;
  for (int q = 0; q < size_; ++q) {
    const Peer& p = peers_[static_cast<size_t>(q)];
    if (p.fd < 0) continue;
    if (p.shm) {
      shm_waiting = shm_waiting || !p.recvs.empty() || !p.sends.empty();
      continue;
    }
    const short events = static_cast<short>((p.recvs.empty() ? 0 : POLLIN) | (p.sends.empty() ? 0 : POLLOUT));
    if (events != 0) set[n++] = pollfd{p.fd, events, 0};
  }
  if (shm_waiting) {
    wait_shm(bell, set, n, wait_ms);
    return false;
  }
  FSDP_ASSERT(n > 0, "group '", group_, "' (", lane_, " lane): waiting with nothing queued");
  // Readiness, hang-up and errors all lead to the next pass's I/O, which reports them.
  if (::poll(set, n, wait_ms) < 0 && errno != EINTR) {
    throw TransportError(TransportError::Kind::kSocket, -1, detail::cat("poll failed: ", errno_text(errno)));
  }
  return false;
}

std::string Mesh::missing_report() const {
  std::ostringstream waiting, unread;
  int n_waiting = 0, n_unread = 0;
  for (int q = 0; q < size_; ++q) {
    const Peer& p = peers_[static_cast<size_t>(q)];
    if (q == rank_) continue;
    const uint64_t expected = p.recv_posted - p.op_recv_posted;
    const uint64_t arrived = p.received - p.op_received;
    if (arrived < expected) {
      waiting << (n_waiting++ ? ", " : "") << q << " (" << arrived << " of " << expected << " bytes arrived)";
    }
    const uint64_t posted = p.send_posted - p.op_send_posted;
    const uint64_t taken = p.sent - p.op_sent;
    if (taken < posted) {
      unread << (n_unread++ ? ", " : "") << q << " (took " << taken << " of " << posted << " bytes)";
    }
  }
  std::string out;
  if (n_waiting > 0) {
    out = detail::cat("missing bytes from ", n_waiting == 1 ? "rank " : "ranks ", waiting.str());
  }
  if (n_unread > 0) {
    out += detail::cat(out.empty() ? "" : "; ", n_unread == 1 ? "rank " : "ranks ", unread.str(),
                       n_unread == 1 ? " is" : " are", " not reading what this rank sent");
  }
  return out;
}

std::vector<int> Mesh::missing_ranks() const {
  std::vector<int> out;
  for (int q = 0; q < size_; ++q) {
    const Peer& p = peers_[static_cast<size_t>(q)];
    if (q != rank_ && p.received - p.op_received < p.recv_posted - p.op_recv_posted) out.push_back(q);
  }
  return out;
}

void Mesh::wait_until(const std::function<bool()>& done, Clock::time_point deadline) {
  while (!done()) {
    if (Clock::now() >= deadline) throw TransportError(TransportError::Kind::kTimeout, -1, missing_report());
    progress(std::max(1, ms_until(deadline)));
  }
}

void Mesh::wait_all(Clock::time_point deadline) {
  wait_until(
      [this] {
        for (const Peer& p : peers_) {
          if (!p.sends.empty() || !p.recvs.empty()) return false;
        }
        return true;
      },
      deadline);
}

// Note [Failure notes off the critical path]
// The failure notes go through the store, which lives on one node: when that
// node is unreachable (its link cut, not closed), a store operation blocks in
// the kernel's retransmissions for many minutes, whatever the store's timeout
// (c10d's client sets none on an established connection). So each note runs
// on a thread of its own and is waited for at most kNoteGrace; a thread left
// behind holds its own reference to the store and dies with the process.
constexpr auto kNoteGrace = std::chrono::seconds(2);

namespace {
// Runs `fn` (which must not throw) and waits for it at most kNoteGrace; false if it is still running.
bool within_grace(std::function<void()> fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread([fn = std::move(fn), done] {
    fn();
    done->set_value();
  }).detach();
  return f.wait_for(kNoteGrace) == std::future_status::ready;
}
}  // namespace

std::string Mesh::failure_note(int q) const {
  if (!store_) return "";
  auto note = std::make_shared<std::string>();
  const c10::intrusive_ptr<c10d::Store> store = store_;
  const std::string key = failure_key(lane_, q);
  const bool answered = within_grace([store, key, note] {
    try {  // best effort: the store may be gone with the process that hosted it
      if (!store->check({key})) return;
      const auto v = store->get(key);
      note->assign(v.begin(), v.end());
    } catch (const std::exception&) {
    }
  });
  return answered ? *note : "";
}

void Mesh::close(const std::string& reason) {
  if (!reason.empty() && store_) {
    const c10::intrusive_ptr<c10d::Store> store = store_;
    const std::string key = failure_key(lane_, rank_);
    within_grace([store, key, reason] {
      try {  // best effort, as failure_note
        store->set(key, std::vector<uint8_t>(reason.begin(), reason.end()));
        // A round trip on the same connection: the note is in the store before any peer sees EOF.
        store->check({key});
      } catch (const std::exception&) {
      }
    });
  }
  for (Peer& p : peers_) {
    if (p.fd >= 0) {
      ::shutdown(p.fd, SHUT_RDWR);
      ::close(p.fd);
    }
    p.fd = -1;
    p.sends.clear();
    p.recvs.clear();
    p.shm = false;
    p.tx = p.rx = shm::Ring();
  }
  segment_.reset();
}

}  // namespace fsdp::comm::tcp

#include "comm/handshake.h"

#include "fsdp/common/error.h"

#include <arpa/inet.h>
#include <endian.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

namespace fsdp::comm::tcp {

// Note [Handshake]
// Each lane of a group owns a full mesh: one TCP connection per pair of ranks.
// Every rank listens on an ephemeral port of its chosen address
// (listen_address.h) and publishes "host port token" under lane/<lane>/<rank>
// in the group's store; rank r dials every rank q < r and accepts every rank
// q > r. Dialling only downwards cannot deadlock (rank 0 only accepts; a rank
// answers its higher peers once its own dials are done, and those depend only
// on lower ranks). The dialler sends a hello (magic, version, group, lane,
// rank, world size, the token it read); the acceptor always answers with its
// own hello before judging, so both ends see both sets of values: a
// WORLD_SIZE mismatch is reported on both sides with both sizes. A connection
// whose hello is not ours (a port scanner) is dropped; a token mismatch means
// the dialler read a stale address, so the acceptor drops it and the dialler
// fails naming it. What then moves on the sockets: Note [TCP transport] in
// mesh.cpp.

namespace {

constexpr uint64_t kMagic = 0x4653445054435031ULL;  // "FSDPTCP1"
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloHeaderBytes = 8 + 4 + 4 + 4 + 8 + 4 + 4;
constexpr uint32_t kMaxNameBytes = 4096;
// A dialled peer that refuses the connection has exited (its listener lives
// until its mesh is complete, and it publishes its address only after
// listening); retry briefly in case of a transient refusal, then give up.
constexpr auto kRefusedGrace = std::chrono::seconds(3);
// A rank sends its hello right after connecting; an accepted connection that
// says nothing for this long is not a rank and must not hold up the others
// waiting in the listen backlog.
constexpr auto kHelloGrace = std::chrono::seconds(10);

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
             theirs.size, "); check the launcher's LaunchOptions::nproc / LaunchOptions::nnodes and the job's "
                          "environment");
  FSDP_CHECK(theirs.group == mine.group && theirs.lane == mine.lane, where, ": ", peer,
             " belongs to group '", theirs.group, "' (", theirs.lane, " lane), not to group '",
             mine.group, "' (", mine.lane,
             " lane) — every rank must create the same groups in the same order");
}

// --- addresses in the store

std::string address_key(const std::string& lane, int rank) { return detail::cat("lane/", lane, "/", rank); }

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

std::vector<Fd> connect_lane_sockets(c10d::Store& store, const ListenAddress& address, const std::string& group,
                                     const std::string& lane, int rank, int size, std::chrono::milliseconds timeout) {
  FSDP_ASSERT(size >= 2 && rank >= 0 && rank < size, "mesh of rank ", rank, " of ", size);
  const auto deadline = Clock::now() + timeout;
  const std::string where =
      detail::cat("group '", group, "' (", lane, " lane, rank ", rank, " of ", size, ")");
  std::vector<Fd> fds(static_cast<size_t>(size));

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
    fds[static_cast<size_t>(q)] = std::move(fd);
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
    fds[static_cast<size_t>(hello.rank)] = std::move(fd);
  }
  return fds;
}

}  // namespace fsdp::comm::tcp

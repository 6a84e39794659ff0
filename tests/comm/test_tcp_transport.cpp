// The TCP transport under the CPU process group (src/comm/mesh.h, channel.h, handshake.h),
// driven directly: ranks are threads of this process meeting through an
// in-memory store, so every case is deterministic and fast. The process group
// on top is tested with real processes in test_collectives.cpp and
// test_groups.cpp.
#include <gtest/gtest.h>

#include "comm/tcp_transport.h"
#include "fsdp/common/error.h"
#include "support/errors.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <sstream>
#include <thread>

namespace fsdp::comm::tcp {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const ListenAddress kLoopback{"127.0.0.1", "loopback (test)"};
// The same, with the ranks of this host (threads of this process here)
// exchanging through shared memory (Note [Shared memory]).
const ListenAddress kShm{"127.0.0.1", "loopback (test)", /*shared_memory=*/true};

// Runs body(rank) on `size` threads and rethrows the first exception.
void run_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// A connected mesh per rank (index = rank).
std::vector<std::unique_ptr<Mesh>> connect_all(int size, const ListenAddress& address = kLoopback,
                                               const std::string& lane = "test") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<Mesh>> meshes(static_cast<size_t>(size));
  run_ranks(size, [&](int r) {
    meshes[static_cast<size_t>(r)] = Mesh::connect(store, address, "g", lane, r, size, seconds(30));
  });
  for (auto& m : meshes) {
    EXPECT_EQ(m->shm_peers(), address.shared_memory ? size - 1 : 0) << m->shm_note();
  }
  return meshes;
}

uint8_t pattern(int from, int to, size_t i) {
  return static_cast<uint8_t>(i * 31 + from * 7 + to * 13 + i / 4093);
}

Clock::time_point in(milliseconds ms) { return Clock::now() + ms; }

// Every rank sends more to every peer than the kernel buffers of a connection
// hold, posting in different orders, before anyone waits: a transport that
// blocked on one direction or one peer at a time would deadlock here.
void simultaneous_large_transfers(const ListenAddress& address) {
  constexpr int kSize = 3;
  constexpr size_t kBytes = (size_t{24} << 20) + 5;  // > send + receive buffer (2 x 8 MiB), > a ring (4 MiB)
  auto meshes = connect_all(kSize, address);
  run_ranks(kSize, [&](int r) {
    Mesh& m = *meshes[static_cast<size_t>(r)];
    std::vector<std::vector<uint8_t>> out(kSize), got(kSize);
    for (int q = 0; q < kSize; ++q) {
      if (q == r) continue;
      out[q].resize(kBytes);
      for (size_t i = 0; i < kBytes; ++i) out[q][i] = pattern(r, q, i);
      got[q].assign(kBytes, 0);
    }
    m.begin_op();
    auto post_sends = [&] {
      for (int q = 0; q < kSize; ++q) {
        if (q != r) m.post_send(q, out[q].data(), kBytes);
      }
    };
    auto post_recvs = [&] {
      for (int q = 0; q < kSize; ++q) {
        if (q == r) continue;
        // Several ranges per connection: they fill in posted order.
        m.post_recv(q, got[q].data(), 1);
        m.post_recv(q, got[q].data() + 1, kBytes / 2);
        m.post_recv(q, got[q].data() + 1 + kBytes / 2, kBytes - 1 - kBytes / 2);
      }
    };
    if (r == 0) {
      post_sends();
      post_recvs();
    } else {
      post_recvs();
      post_sends();
    }
    m.wait_all(in(seconds(60)));
    for (int q = 0; q < kSize; ++q) {
      if (q == r) continue;
      EXPECT_EQ(m.sent(q), kBytes);
      EXPECT_EQ(m.received(q), kBytes);
      size_t bad = 0;
      for (size_t i = 0; i < kBytes; ++i) bad += got[q][i] != pattern(q, r, i);
      EXPECT_EQ(bad, 0u) << "rank " << r << " from rank " << q;
    }
    // Then many small messages on the same streams: framing is by posted sizes only.
    std::vector<uint32_t> small_out(200), small_in(200 * kSize, 0);
    for (uint32_t i = 0; i < 200; ++i) small_out[i] = i * 1000 + static_cast<uint32_t>(r);
    m.begin_op();
    for (int i = 0; i < 200; ++i) {
      for (int q = 0; q < kSize; ++q) {
        if (q == r) continue;
        m.post_send(q, &small_out[static_cast<size_t>(i)], sizeof(uint32_t));
        m.post_recv(q, &small_in[static_cast<size_t>(q * 200 + i)], sizeof(uint32_t));
      }
    }
    m.wait_all(in(seconds(60)));
    for (int q = 0; q < kSize; ++q) {
      if (q == r) continue;
      for (uint32_t i = 0; i < 200; ++i) ASSERT_EQ(small_in[q * 200 + i], i * 1000 + static_cast<uint32_t>(q));
    }
  });
}

TEST(TcpTransport, SimultaneousLargeTransfersBetweenEveryPairComplete) { simultaneous_large_transfers(kLoopback); }
TEST(TcpTransport, SimultaneousLargeTransfersThroughSharedMemoryComplete) { simultaneous_large_transfers(kShm); }

// Rank 2 sends only 400 of the 1000 bytes rank 0 expects: the timeout names
// rank 2 and how much arrived, and not rank 1, whose bytes all arrived.
void timeout_names_the_missing_rank(const ListenAddress& address) {
  auto meshes = connect_all(3, address);
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_finished = rank0_done.get_future().share();
  std::string message;
  run_ranks(3, [&](int r) {
    Mesh& m = *meshes[static_cast<size_t>(r)];
    std::vector<char> buf(2000, 'x');
    m.begin_op();
    if (r == 0) {
      m.post_recv(1, buf.data(), 1000);
      m.post_recv(2, buf.data() + 1000, 1000);
      try {
        m.wait_all(in(milliseconds(1500)));
        ADD_FAILURE() << "wait_all completed without rank 2's bytes";
      } catch (const TransportError& e) {
        EXPECT_EQ(e.kind(), TransportError::Kind::kTimeout);
        message = e.what();
      }
      rank0_done.set_value();
    } else {
      m.post_send(0, buf.data(), r == 1 ? 1000 : 400);
      m.wait_all(in(seconds(30)));
      rank0_finished.wait();  // closing earlier would be a different failure
    }
  });
  EXPECT_CONTAINS(message, "missing bytes from rank 2 (400 of 1000 bytes arrived)");
  EXPECT_EQ(message.find("rank 1"), std::string::npos) << message;
}

TEST(TcpTransport, TimeoutNamesTheMissingRankAndWhatArrived) { timeout_names_the_missing_rank(kLoopback); }
TEST(TcpTransport, TimeoutOverSharedMemoryNamesTheMissingRankAndWhatArrived) {
  timeout_names_the_missing_rank(kShm);
}

// A peer that closes while bytes are expected from it fails the wait at once
// (the deadline is a minute away) naming it; with a reason recorded, the
// survivor reports that reason instead of blaming the peer.
void peer_closing_fails_the_wait_at_once(const ListenAddress& address) {
  for (const std::string reason : {"", "all_reduce #4 failed: rank 7 vanished"}) {
    auto meshes = connect_all(2, address);
    std::string message;
    run_ranks(2, [&](int r) {
      Mesh& m = *meshes[static_cast<size_t>(r)];
      std::vector<char> buf(1000, 'y');
      m.begin_op();
      if (r == 0) {
        m.post_recv(1, buf.data(), 1000);
        try {
          m.wait_all(in(seconds(60)));
          ADD_FAILURE() << "wait_all completed without rank 1's bytes";
        } catch (const TransportError& e) {
          EXPECT_EQ(e.kind(), TransportError::Kind::kPeerClosed);
          EXPECT_EQ(e.peer(), 1);
          message = e.what();
        }
      } else {
        m.post_send(0, buf.data(), 10);
        m.wait_all(in(seconds(30)));
        m.close(reason);
      }
    });
    EXPECT_CONTAINS(message, "rank 1 closed its connection (10 of 1000 bytes expected from it in this "
                             "collective had arrived)");
    if (reason.empty()) {
      EXPECT_CONTAINS(message, "it exited or crashed; see rank 1's log");
    } else {
      EXPECT_CONTAINS(message, "after failing first: " + reason);
    }
  }
}

TEST(TcpTransport, PeerClosingFailsTheWaitAtOnceNamingIt) { peer_closing_fails_the_wait_at_once(kLoopback); }
// Over shared memory the peer's silent socket tells that it closed; the bytes
// it wrote before closing are still read (10 arrived).
TEST(TcpTransport, PeerClosingOverSharedMemoryFailsTheWaitAtOnceNamingIt) {
  peer_closing_fails_the_wait_at_once(kShm);
}

// Segments live in /dev/shm only while a lane connects: once every rank of the
// host mapped it, each unlinks its name, so nothing is left behind however
// the job ends. Names left by a creator that died in between are removed by
// the next creation.
TEST(TcpTransport, SharedMemorySegmentsLeaveNoNameBehind) {
  const auto ours = [] {
    std::vector<std::string> names;
    const std::string prefix = std::string(shm::kSegmentPrefix) + std::to_string(getpid()) + ".";
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      const std::string n = e.path().filename().string();
      if (n.rfind(prefix, 0) == 0) names.push_back(n);
    }
    return names;
  };
  {
    auto meshes = connect_all(3, kShm);
    EXPECT_EQ(ours(), std::vector<std::string>{}) << "a segment's name outlived the connection of its lane";
    // The mappings still work without the name.
    int32_t x = 7, y = 0;
    meshes[1]->post_send(2, &x, sizeof(x));
    meshes[2]->post_recv(1, &y, sizeof(y));
    run_ranks(3, [&](int r) { meshes[static_cast<size_t>(r)]->wait_all(in(seconds(30))); });
    EXPECT_EQ(y, 7);
  }
  // A name whose creator is gone (a child that exited), and one whose creator lives (us).
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);
  const std::string dead = "/" + shm::segment_name(child, shm::pid_namespace(), 0x7e57);
  const std::string alive = "/" + shm::segment_name(getpid(), shm::pid_namespace(), 0x7e57);
  for (const std::string& n : {dead, alive}) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  EXPECT_GE(shm::remove_stale_segments(), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + dead));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + alive));
  shm_unlink(alive.c_str());
}

// Something that is not a rank (a port scanner, a health check) connecting to
// a rank's listener is dropped; the real peer still gets in.
TEST(TcpTransport, ForeignConnectionsToTheListenerAreDropped) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::unique_ptr<Mesh> rank0;
  std::exception_ptr error0;
  std::thread t0([&] {
    try {
      rank0 = Mesh::connect(store, kLoopback, "g", "test", 0, 2, seconds(30));
    } catch (...) {
      error0 = std::current_exception();
    }
  });
  store->wait({"lane/test/0"}, seconds(30));
  const auto value = store->get("lane/test/0");
  std::istringstream address(std::string(value.begin(), value.end()));
  std::string host, port;
  address >> host >> port;
  const std::string http = std::string("GET / HTTP/1.0\r\n\r\n") + std::string(40, '.');
  for (const std::string& junk : {http, std::string("hi")}) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* ai = nullptr;
    ASSERT_EQ(getaddrinfo(host.c_str(), port.c_str(), &hints, &ai), 0);
    const int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, ai->ai_addr, ai->ai_addrlen), 0);
    freeaddrinfo(ai);
    ASSERT_EQ(send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    close(fd);
  }
  std::unique_ptr<Mesh> rank1 = Mesh::connect(store, kLoopback, "g", "test", 1, 2, seconds(30));
  t0.join();
  if (error0) std::rethrow_exception(error0);
  int32_t x = 42, y = 0;
  rank1->post_send(0, &x, sizeof(x));
  rank0->post_recv(1, &y, sizeof(y));
  rank1->wait_all(in(seconds(30)));
  rank0->wait_all(in(seconds(30)));
  EXPECT_EQ(y, 42);
}

TEST(TcpTransport, ListenAddressFollowsMasterAddrAndGlooSocketIfname) {
  for (const char* local : {"", "127.0.0.1", "127.0.1.1", "localhost", "::1"}) {
    TcpTransportOptions o;
    o.master_addr = local;
    o.socket_ifname = "eth-ignored";  // a local job never needs an interface
    const ListenAddress a = choose_listen_address(o);
    EXPECT_EQ(a.host, "127.0.0.1") << local;
    EXPECT_CONTAINS(a.how, "loopback");
  }
  TcpTransportOptions lo;
  lo.master_addr = "10.11.12.13";
  lo.socket_ifname = "lo";
  const ListenAddress a = choose_listen_address(lo);
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.how, "interface lo (GLOO_SOCKET_IFNAME)");

  TcpTransportOptions bad = lo;
  bad.socket_ifname = "nosuchif9";
  const std::string msg = testing::usage_error_of([&] { choose_listen_address(bad); });
  EXPECT_CONTAINS(msg, "GLOO_SOCKET_IFNAME=nosuchif9 names no network interface");
  EXPECT_CONTAINS(msg, "lo");  // the interfaces there are
  EXPECT_CONTAINS(msg, "MASTER_ADDR 10.11.12.13");

  // Remote master, no interface: this host's name if it can be bound, else (one node) loopback.
  TcpTransportOptions by_name;
  by_name.master_addr = "10.11.12.13";
  const ListenAddress h = choose_listen_address(by_name);
  EXPECT_FALSE(h.host.empty());
  EXPECT_TRUE(h.how.rfind("hostname ", 0) == 0 || h.how == "loopback (hostname does not resolve)") << h.how;
}

TEST(TcpTransport, AJobAcrossNodesNeverAdvertisesLoopback) {
  // The route towards a destination: loopback for a local one, none for a name that does not resolve.
  EXPECT_EQ(route_source_address("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(route_source_address("no-such-host.invalid"), "");
  // Across nodes, without GLOO_SOCKET_IFNAME: the hostname's address unless it
  // is loopback (as in many images' /etc/hosts), else the interface that routes
  // to MASTER_ADDR; never a loopback address. Which of these applies depends on
  // this host, so each outcome is held to its rule.
  for (const char* master : {"10.11.12.13", "192.0.2.77"}) {
    TcpTransportOptions across;
    across.master_addr = master;
    across.single_node = false;
    const std::string routed = route_source_address(master);
    try {
      const ListenAddress a = choose_listen_address(across);
      EXPECT_FALSE(a.host.rfind("127.", 0) == 0 || a.host == "::1") << a.host << " (" << a.how << ")";
      if (a.how.rfind("hostname ", 0) != 0) {
        EXPECT_EQ(a.host, routed);
        EXPECT_CONTAINS(a.how, std::string("the interface that routes to MASTER_ADDR ") + master);
      }
    } catch (const UsageError& e) {
      // Only when the route is missing or leaves through loopback, and the message says what to set.
      EXPECT_TRUE(routed.empty() || routed.rfind("127.", 0) == 0) << routed << ": " << e.what();
      EXPECT_CONTAINS(std::string(e.what()), "GLOO_SOCKET_IFNAME");
    }
  }
  // The same host as one node keeps the hostname rule (loopback allowed there).
  TcpTransportOptions one;
  one.master_addr = "10.11.12.13";
  one.single_node = true;
  const ListenAddress a = choose_listen_address(one);
  EXPECT_TRUE(a.how.rfind("hostname ", 0) == 0 || a.how == "loopback (hostname does not resolve)") << a.how;
}

}  // namespace
}  // namespace fsdp::comm::tcp

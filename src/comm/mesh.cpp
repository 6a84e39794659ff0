#include "comm/mesh.h"

#include "comm/handshake.h"
#include "comm/socket.h"
#include "fsdp/common/error.h"

#include <algorithm>
#include <cerrno>
#include <future>
#include <sstream>
#include <thread>

namespace fsdp::comm::tcp {

// Note [TCP transport]
// Each lane of a group owns a full mesh: one connection per pair of ranks,
// made by the handshake (Note [Handshake] in handshake.cpp). Per peer,
// posted sends and receives are FIFO queues of byte ranges; progress() drains
// every queue as far as its channel allows (bounded per pass so one fast peer
// cannot starve the others) and sleeps only when nothing moved. Sends and
// receives to and from every peer advance together, so "everyone sends to
// everyone, then everyone receives" never deadlocks, whatever the message
// sizes. Every rank of a lane posts the same sequence, hence the bytes on each
// connection arrive in the order the receiver posted them: stream order
// replaces gloo's slots and tags. The lane thread does the I/O itself between
// computations; the kernel socket buffers keep the wire busy while it sums a
// segment.
//
// Failures: EOF or a reset while bytes are expected fails the wait at once
// naming the peer ("closed its connection"); a deadline names the ranks whose
// bytes are missing since begin_op() and how many arrived. The caller then
// close()s the mesh, so the peers waiting on this rank fail at once too; it
// first records its error in the store, and a peer that sees the connection
// close reports that error (the first cause) instead of blaming this rank.
//
// Note [Channels]
// How a peer's bytes move is its Channel's business (channel.h): move out,
// move in, arm a wait, closed. The mesh knows only queues, counts and
// reports. A TCP channel moves through its socket, and its reads report the
// peer's close. A shared-memory channel copies through the host segment's
// rings and rings the peer's doorbell after each move; its socket stays
// silent, so when nothing moves the mesh asks closed(), and a peer seen gone
// fails the wait only if one more pass still moves nothing (bytes it wrote
// before exiting are taken first). A new channel (RDMA, a pipe) is one more
// implementation of the interface, not a flag in every branch.

namespace {
// Bytes moved per connection and direction in one progress() pass.
constexpr size_t kPassBytes = size_t{4} << 20;
// Waiting on shared memory (Note [Shared memory]): spins (~10 us) before
// sleeping, and the longest sleep between looks at the peers' sockets.
constexpr int kShmSpins = 2000;
constexpr int kShmSleepMs = 2;

std::string failure_key(const std::string& lane, int rank) {
  return detail::cat("lane/", lane, "/failed/", rank);
}
}  // namespace

void WaitSet::wait(int wait_ms) {
  if (doorbell != nullptr) {
    // A short busy spin first (no yield: on a loaded machine a yield can give
    // the core away for a whole time slice, where a futex wake-up is prompt).
    for (int i = 0; i < kShmSpins; ++i) {
      if (doorbell->bell() != bell) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (fds.empty()) {
      doorbell->wait(bell, std::min(wait_ms, kShmSleepMs));
      return;
    }
    wait_ms = 1;  // TCP peers too: poll their sockets, look at the doorbell again soon
  }
  if (fds.empty()) return;
  if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
    throw TransportError(TransportError::Kind::kSocket, -1, detail::cat("poll failed: ", errno_text(errno)));
  }
}

Mesh::Mesh(c10::intrusive_ptr<c10d::Store> store, std::string group, std::string lane, int rank, int size)
    : store_(std::move(store)),
      group_(std::move(group)),
      lane_(std::move(lane)),
      rank_(rank),
      size_(size),
      peers_(static_cast<size_t>(size)) {}

Mesh::~Mesh() { close(); }

std::unique_ptr<Mesh> Mesh::connect(const c10::intrusive_ptr<c10d::Store>& store, const ListenAddress& address,
                                    const std::string& group, const std::string& lane, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Fd> fds = connect_lane_sockets(*store, address, group, lane, rank, size, timeout);
  std::unique_ptr<Mesh> mesh(new Mesh(store, group, lane, rank, size));
  if (address.shared_memory) {
    const std::string where = detail::cat("group '", group, "' (", lane, " lane, rank ", rank, " of ", size, ")");
    mesh->segment_ = shm::HostSegment::connect(*store, lane, where, rank, size, deadline, &mesh->shm_note_);
  } else {
    mesh->shm_note_ = "off";
  }
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    const int fd = fds[static_cast<size_t>(q)].release();
    Peer& p = mesh->peers_[static_cast<size_t>(q)];
    if (mesh->segment_ && mesh->segment_->shares(q)) {
      p.channel = make_shm_channel(fd, q, *mesh->segment_);
      ++mesh->shm_peers_;
    } else {
      p.channel = make_tcp_channel(fd, q);
    }
  }
  return mesh;
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

void Mesh::fail(int q, int err, const char* what) {
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

void Mesh::pump(int q, Peer& p, bool out, bool& moved) {
  std::deque<Range>& queue = out ? p.sends : p.recvs;
  uint64_t& count = out ? p.sent : p.received;
  size_t budget = kPassBytes;
  while (!queue.empty() && budget > 0) {
    Range& r = queue.front();
    const size_t n = std::min(r.left, budget);
    const Moved m = out ? p.channel->move_out(r.data, n) : p.channel->move_in(r.data, n);
    if (m.failed()) fail(q, m.error, out ? "send" : "recv");
    if (m.bytes == 0) return;  // the channel is full (out) or empty (in) for now
    r.data += m.bytes;
    r.left -= m.bytes;
    count += m.bytes;
    budget -= m.bytes;
    moved = true;
    if (r.left == 0) queue.pop_front();
  }
}

bool Mesh::progress(int wait_ms) {
  // The doorbell before the pass: a peer's move after it rings a changed bell, never a missed one.
  waits_.bell = segment_ ? segment_->bell() : 0;
  bool moved = false;
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (!p.channel) continue;
    if (!p.recvs.empty()) pump(q, p, /*out=*/false, moved);
    if (!p.sends.empty()) pump(q, p, /*out=*/true, moved);
  }
  if (moved || wait_ms == 0) return moved;
  // Nothing moved: is a peer we wait on gone? Then one more pass takes what it
  // sent before it closed, and if that moves nothing either, the wait fails.
  int gone = -1, gone_error = -1;
  for (int q = 0; q < size_ && gone < 0; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (!p.channel || !p.busy()) continue;
    const int err = p.channel->closed();
    if (err >= 0) {
      gone = q;
      gone_error = err;
    }
  }
  if (gone >= 0) {
    if (progress(0)) return true;
    fail(gone, gone_error, "recv");
  }
  waits_.clear();
  for (int q = 0; q < size_; ++q) {
    Peer& p = peers_[static_cast<size_t>(q)];
    if (p.channel && p.busy()) p.channel->arm(waits_, !p.recvs.empty(), !p.sends.empty());
  }
  FSDP_ASSERT(!waits_.fds.empty() || waits_.doorbell != nullptr, "group '", group_, "' (", lane_,
              " lane): waiting with nothing queued");
  waits_.wait(wait_ms);
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
          if (p.busy()) return false;
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
    if (p.channel) p.channel->close();
    p.channel.reset();
    p.sends.clear();
    p.recvs.clear();
  }
  shm_peers_ = 0;
  segment_.reset();
}

}  // namespace fsdp::comm::tcp

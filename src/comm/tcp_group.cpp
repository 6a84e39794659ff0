#include "comm/tcp_group.h"

#include "comm/rank_order.h"

#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <sstream>
#include <thread>

namespace fsdp::comm {

// Note [TCP lanes]
// Each group owns two tcp::Mesh'es ("lanes"), each with a worker thread that
// drains a FIFO of work: the gather lane runs all_gather and broadcast, the
// reduce lane reduce_scatter, all_reduce and all_to_all. A lane runs one collective at a
// time and every rank issues the same sequence per lane, so each connection's
// byte stream lines up without tags (Note [TCP transport]). Lanes share
// nothing but the listen address, so they progress independently (the CPU
// analogue of NCCL's streams). After a failure the lane closes its
// connections, so the peers waiting on it fail at once instead of at their
// timeout, and refuses further work with the first error: a lost peer costs
// one failure, not one timeout per queued collective.
//
// Note [Reduce-scatter by alltoall]
// reduce_scatter = alltoall (chunk j of `in` goes to rank j) + a local sum of
// the W received chunks in rank order 0..W-1, in fp32 for bf16/fp16 with one
// final rounding. Same bytes on the wire as a ring reduce-scatter,
// bit-identical to a reference that sums per-rank contributions in rank
// order, and `in` is only read. The sum is pipelined in 1 MiB segments: each
// peer's chunk arrives in order on its connection, and segment s is summed as
// soon as its bytes arrived from every peer, while later segments are still on
// the wire. all_reduce = the same reduce-scatter over W padded chunks +
// all-gather of the reduced chunks, pipelined segment by segment: identical
// bits on every rank, half-precision sums accumulated in fp32, and half the
// wire bytes of upcasting to fp32 first.

namespace {

using Clock = std::chrono::steady_clock;

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

std::string desc(const at::Tensor& t) { return detail::cat(t.scalar_type(), "[", t.numel(), "]"); }

}  // namespace

// One unit of queued work. The closure holds the tensors until it has run.
class TcpWork final : public Work {
 public:
  using Fn = std::function<void(TcpLane&)>;
  TcpWork(const char* op, std::string what, int64_t bytes, Fn fn)
      : op_(op), what_(std::move(what)), bytes_(bytes), fn_(std::move(fn)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) detail::throw_failure(error_);
  }
  bool completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  const char* op() const { return op_; }
  const std::string& what() const { return what_; }
  int64_t bytes() const { return bytes_; }
  Fn take_fn() { return std::move(fn_); }
  void finish(std::string error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  const char* op_;    // "all_gather", a literal
  std::string what_;  // "all_gather #3 (Float[4096])", for errors
  int64_t bytes_;     // the logical buffer, for the trace
  Fn fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;  // empty: success
};

class TcpLane {
 public:
  TcpLane(std::string group, std::string lane, std::unique_ptr<tcp::Mesh> mesh,
          std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        lane_(std::move(lane)),
        mesh_(std::move(mesh)),
        timeout_(timeout),
        thread_([this] { loop(); }) {}

  ~TcpLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // `op` is a literal; `bytes` the logical buffer's size (for the trace).
  WorkPtr enqueue(const char* op, const std::string& desc, size_t bytes, TcpWork::Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    auto work = std::make_shared<TcpWork>(op, detail::cat(op, " #", issued_, " (", desc, ")"),
                                          static_cast<int64_t>(bytes), std::move(fn));
    ++issued_;
    queue_.push_back(work);
    cv_.notify_all();
    return work;
  }

  // Lane thread only, below.
  tcp::Mesh& mesh() { return *mesh_; }
  const tcp::Mesh& mesh() const { return *mesh_; }
  // The running collective's deadline: the group's timeout from its start.
  Clock::time_point deadline() const { return deadline_; }
  // Grow-only scratch buffers, kept between collectives: a fresh allocation of
  // many MiB costs a page fault per 4 KiB on first touch, which measured as
  // much as the sum itself.
  enum Scratch { kReceive, kPadded, kSegment, kAccumulator, kScratchSlots };
  // At least `numel` elements of `dtype` in `slot`; contents undefined.
  at::Tensor scratch(Scratch slot, int64_t numel, at::ScalarType dtype) {
    at::Tensor& s = scratch_[slot];
    const auto bytes = static_cast<int64_t>(numel * c10::elementSize(dtype));
    if (!s.defined() || s.numel() < bytes) {
      s = at::Tensor();  // release the old buffer before allocating the new one
      s = at::empty({bytes}, at::kByte);
    }
    return at::from_blob(s.data_ptr(), {numel}, at::TensorOptions().dtype(dtype));
  }

 private:
  void loop() {
    trace::set_thread_name(detail::cat("comm: ", lane_, " lane (", group_, ")"));
    for (;;) {
      std::shared_ptr<TcpWork> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      TcpWork::Fn fn = work->take_fn();
      if (!broken_.empty()) {
        work->finish(detail::cat(work->what(), " on group '", group_, "' was not run: the ", lane_,
                                 " lane failed earlier (", broken_, ")"));
        continue;
      }
      std::string error;
      try {
        deadline_ = Clock::now() + timeout_;
        trace::Span span(work->op(), "comm", work->bytes(), work->what());
        fn(*this);
      } catch (const tcp::TransportError& e) {
        error = describe_failure(work->what(), e.kind() == tcp::TransportError::Kind::kTimeout, e.what());
      } catch (const std::exception& e) {
        error = describe_failure(work->what(), false, e.what());
      }
      if (!error.empty()) {
        mesh_->close(error);  // peers waiting on this rank fail now, not at their timeout
        broken_ = error;
      }
      fn = nullptr;  // drop tensor references before signalling completion
      work->finish(std::move(error));
    }
  }

  std::string describe_failure(const std::string& what, bool timed_out, const std::string& cause) const {
    const std::string head = detail::cat(what, " on group '", group_, "' (rank ", mesh_->rank(), " of ",
                                         mesh_->size(), ", ", lane_, " lane) ");
    if (timed_out) {
      // Name the culprit first: the user reads "rank 1 did not reach ..." on
      // every surviving rank, whichever collective each was waiting in.
      const std::vector<int> missing = mesh_->missing_ranks();
      std::ostringstream who;
      for (size_t i = 0; i < missing.size(); ++i) who << (i ? ", " : "") << missing[i];
      const std::string lead =
          missing.empty() ? std::string("a peer did not take its bytes of ")
                          : detail::cat(missing.size() == 1 ? "rank " : "ranks ", who.str(), " did not reach ");
      return detail::cat(lead, what, " on group '", group_, "' within ", timeout_.count(), " ms: stopped, hung or ",
                         "dead, or it issued a different sequence of collectives (rank ", mesh_->rank(), " of ",
                         mesh_->size(), ", ", lane_, " lane: ", cause, ") — see ",
                         missing.size() == 1 ? detail::cat("rank ", missing[0], "'s log") : "the other ranks' logs",
                         "; InitOptions::timeout (FSDP_TIMEOUT) sets this limit");
    }
    return detail::cat(head, "failed: ", cause);
  }

  const std::string group_;
  const std::string lane_;
  const std::unique_ptr<tcp::Mesh> mesh_;
  const std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;  // lane thread only
  at::Tensor scratch_[kScratchSlots];  // lane thread only
  std::string broken_;          // lane thread only: first failure
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TcpWork>> queue_;
  int64_t issued_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after every other member exists
};

namespace {

std::unique_ptr<TcpLane> connect_lane(const c10::intrusive_ptr<c10d::Store>& store,
                                      const tcp::ListenAddress& address,
                                      const std::string& group, const std::string& lane, int rank,
                                      int size, std::chrono::milliseconds timeout) {
  return std::make_unique<TcpLane>(group, lane,
                                   tcp::Mesh::connect(store, address, group, lane, rank, size, timeout),
                                   timeout);
}

// Segment size of the pipelined reduce: small enough that a segment is still
// in cache when it is summed, large enough to amortise the per-segment waits.
constexpr size_t kSegmentBytes = size_t{1} << 20;

// Chunk j of `send` (w chunks of n = out.numel()) goes to rank j; `out` = op
// over the chunks every rank sent us, in rank order; our own contribution is
// read in place from `send`. The peers' chunks land in the lane's scratch.
// With `gather` (all_reduce), `out` is chunk rank() of `send` itself, and the
// reduce becomes an all-reduce in place in `send`: each reduced segment is
// written over our (consumed) contribution and sent to every peer as soon as
// it is ready, and the peers' reduced segments land in their chunks of `send`.
// That is safe: a peer's reduced segment s can only arrive after that peer
// received our segment s of its chunk, so our send of that region is complete
// by then. Reduce-scatter and all-gather overlap. Per connection the order is:
// the whole reduce-scatter chunk, then the all-gather segments in order — the
// same on both ends, as Note [TCP transport] requires.
void alltoall_reduce(TcpLane& lane, const at::Tensor& send, const at::Tensor& out, ReduceOp op,
                     bool gather) {
  tcp::Mesh& mesh = lane.mesh();
  const int w = mesh.size();
  const int me = mesh.rank();
  const int64_t n = out.numel();
  const size_t elem = send.element_size();
  const size_t chunk = static_cast<size_t>(n) * elem;
  const int64_t seg = std::max<int64_t>(1, static_cast<int64_t>(kSegmentBytes / elem));
  const int64_t segments = (n + seg - 1) / seg;
  at::Tensor recv = lane.scratch(TcpLane::kReceive, send.numel(), send.scalar_type());
  at::Tensor acc = is_half(out.scalar_type()) && op != ReduceOp::kMax
                       ? lane.scratch(TcpLane::kAccumulator, std::min(n, seg), at::kFloat)
                       : at::Tensor();
  // In place (gather), summing straight into `out` would overwrite our
  // contribution before rank order reads it: sum into a segment, then copy.
  at::Tensor seg_out =
      gather ? lane.scratch(TcpLane::kSegment, std::min(n, seg), out.scalar_type()) : at::Tensor();
  const at::Tensor send_raw = raw(send);
  const at::Tensor out_raw = raw(out);
  auto* send_ptr = static_cast<char*>(send.data_ptr());  // written only with `gather`
  const auto* out_ptr = static_cast<const char*>(out.data_ptr());
  auto* recv_ptr = static_cast<char*>(recv.data_ptr());
  auto peer_to = [&](int i) { return (me + i) % w; };  // staggered: not everyone serves rank 0 first
  auto peer_from = [&](int i) { return (me + w - i) % w; };

  mesh.begin_op();
  std::vector<uint64_t> base(static_cast<size_t>(w), 0);
  for (int q = 0; q < w; ++q) {
    if (q != me) base[static_cast<size_t>(q)] = mesh.received(q);
  }
  for (int i = 1; i < w; ++i) {
    mesh.post_send(peer_to(i), send_ptr + peer_to(i) * chunk, chunk);
    mesh.post_recv(peer_from(i), recv_ptr + peer_from(i) * chunk, chunk);
  }
  std::vector<at::Tensor> parts(static_cast<size_t>(w));
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t off = s * seg;
    const int64_t len = std::min(seg, n - off);
    const uint64_t need = static_cast<uint64_t>(off + len) * elem;  // bytes of each peer's chunk
    mesh.wait_until(
        [&] {
          for (int q = 0; q < w; ++q) {
            if (q != me && mesh.received(q) - base[static_cast<size_t>(q)] < need) return false;
          }
          return true;
        },
        lane.deadline());
    for (int q = 0; q < w; ++q) {
      parts[static_cast<size_t>(q)] = q == me ? send_raw.narrow(0, me * n + off, len)
                                              : recv.narrow(0, q * n + off, len);
    }
    if (!gather) {
      reduce_in_rank_order(parts, out_raw.narrow(0, off, len), op, acc);
      continue;
    }
    reduce_in_rank_order(parts, seg_out.narrow(0, 0, len), op, acc);
    out_raw.narrow(0, off, len).copy_(seg_out.narrow(0, 0, len));
    for (int i = 1; i < w; ++i) {
      mesh.post_send(peer_to(i), out_ptr + off * elem, len * elem);
      mesh.post_recv(peer_from(i), send_ptr + peer_from(i) * chunk + off * elem, len * elem);
    }
  }
  mesh.wait_all(lane.deadline());
}

}  // namespace

TcpProcessGroup::TcpProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                 std::string name, std::chrono::milliseconds timeout,
                                 std::shared_ptr<const tcp::ListenAddress> address)
    : ProcessGroup(rank, size, std::move(name), timeout),
      store_(std::move(store)),
      address_(std::move(address)) {
  if (size == 1) return;
  FSDP_ASSERT(address_ != nullptr && store_, "group '", this->name(), "' of size ", size,
              " needs an address and a store");
  gather_lane_ = connect_lane(store_, *address_, this->name(), "gather", rank, size, timeout);
  reduce_lane_ = connect_lane(store_, *address_, this->name(), "reduce", rank, size, timeout);
  // Read before any work is queued: the meshes' transports are fixed once connected.
  const tcp::Mesh& mesh = gather_lane_->mesh();
  const int peers = std::min(mesh.shm_peers(), reduce_lane_->mesh().shm_peers());
  transport_ = peers > 0 ? detail::cat("tcp, shared memory with ", peers, " of ", size - 1, " peers")
                         : detail::cat("tcp (no shared memory: ", mesh.shm_note(), ")");
  transport_ += detail::cat("; address ", address_->host, " (", address_->how, ")");
}

TcpProcessGroup::~TcpProcessGroup() = default;  // each lane drains, joins its thread, closes its mesh

WorkPtr TcpProcessGroup::do_all_gather(const at::Tensor& out, const at::Tensor& in) {
  if (in.numel() == 0) return completed_work();
  const size_t n = nbytes(in);
  auto* chunk = static_cast<char*>(out.data_ptr()) + static_cast<size_t>(rank()) * n;
  const bool in_place = in.data_ptr() == chunk;
  if (size() == 1) {
    if (!in_place) std::memcpy(chunk, in.data_ptr(), n);
    return completed_work();
  }
  return gather_lane_->enqueue("all_gather", desc(in), nbytes(out), [out, in, in_place](TcpLane& lane) {
    tcp::Mesh& mesh = lane.mesh();
    const int w = mesh.size();
    const int me = mesh.rank();
    const size_t bytes = nbytes(in);
    auto* base = static_cast<char*>(out.data_ptr());
    const void* mine = in_place ? base + me * bytes : in.data_ptr();
    mesh.begin_op();
    for (int i = 1; i < w; ++i) {
      const int to = (me + i) % w;
      const int from = (me + w - i) % w;
      mesh.post_send(to, mine, bytes);
      mesh.post_recv(from, base + from * bytes, bytes);
    }
    if (!in_place) std::memcpy(base + me * bytes, in.data_ptr(), bytes);
    mesh.wait_all(lane.deadline());
  });
}

WorkPtr TcpProcessGroup::do_broadcast(const at::Tensor& t, int root) {
  if (t.numel() == 0 || size() == 1) return completed_work();
  const std::string what = detail::cat(desc(t), " from root ", root);
  return gather_lane_->enqueue("broadcast", what, nbytes(t), [t, root](TcpLane& lane) {
    tcp::Mesh& mesh = lane.mesh();
    mesh.begin_op();
    if (mesh.rank() == root) {
      for (int i = 1; i < mesh.size(); ++i) mesh.post_send((root + i) % mesh.size(), t.data_ptr(), nbytes(t));
    } else {
      mesh.post_recv(root, t.data_ptr(), nbytes(t));
    }
    mesh.wait_all(lane.deadline());
  });
}

WorkPtr TcpProcessGroup::do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  if (out.numel() == 0) return completed_work();
  if (size() == 1) {  // op over one contribution is the contribution (x / 1 == x)
    std::memcpy(out.data_ptr(), in.data_ptr(), nbytes(out));
    return completed_work();
  }
  return reduce_lane_->enqueue("reduce_scatter", detail::cat(desc(in), ", ", to_string(op)), nbytes(in),
                               [out, in, op](TcpLane& lane) {
                                 alltoall_reduce(lane, in, out, op, /*gather=*/false);
                               });
}

WorkPtr TcpProcessGroup::do_all_reduce(const at::Tensor& t, ReduceOp op) {
  if (t.numel() == 0 || size() == 1) return completed_work();
  const int w = size();
  const int me = rank();
  return reduce_lane_->enqueue("all_reduce", detail::cat(desc(t), ", ", to_string(op)), nbytes(t),
                               [t, op, w, me](TcpLane& lane) {
    const int64_t n = t.numel();
    const int64_t c = (n + w - 1) / w;  // chunk per rank; the tail of the last ones is padding
    const at::Tensor t_raw = raw(t);
    if (c * w == n) {  // in place in t
      alltoall_reduce(lane, t_raw, t_raw.narrow(0, me * c, c), op, /*gather=*/true);
      return;
    }
    at::Tensor send = lane.scratch(TcpLane::kPadded, c * w, t.scalar_type());
    send.narrow(0, 0, n).copy_(t_raw);
    send.narrow(0, n, c * w - n).zero_();
    alltoall_reduce(lane, send, send.narrow(0, me * c, c), op, /*gather=*/true);
    t_raw.copy_(send.narrow(0, 0, n));
  });
}

WorkPtr TcpProcessGroup::do_all_to_all(const at::Tensor& out, const at::Tensor& in) {
  if (in.numel() == 0) return completed_work();
  if (size() == 1) {
    std::memcpy(out.data_ptr(), in.data_ptr(), nbytes(in));
    return completed_work();
  }
  return reduce_lane_->enqueue("all_to_all", desc(in), nbytes(in), [out, in](TcpLane& lane) {
    tcp::Mesh& mesh = lane.mesh();
    const int w = mesh.size();
    const int me = mesh.rank();
    const size_t chunk = nbytes(in) / static_cast<size_t>(w);
    const auto* send = static_cast<const char*>(in.data_ptr());
    auto* recv = static_cast<char*>(out.data_ptr());
    mesh.begin_op();
    for (int i = 1; i < w; ++i) {  // staggered, as all_gather
      const int to = (me + i) % w;
      const int from = (me + w - i) % w;
      mesh.post_send(to, send + to * chunk, chunk);
      mesh.post_recv(from, recv + from * chunk, chunk);
    }
    std::memcpy(recv + me * chunk, send + me * chunk, chunk);
    mesh.wait_all(lane.deadline());
  });
}

int64_t TcpProcessGroup::wire_bytes_sent() const {
  if (size() == 1) return 0;
  int64_t sent = 0;
  for (const TcpLane* lane : {gather_lane_.get(), reduce_lane_.get()}) {
    const tcp::Mesh& mesh = lane->mesh();
    for (int q = 0; q < size(); ++q) sent += q == rank() ? 0 : static_cast<int64_t>(mesh.sent(q));
  }
  return sent;
}

void TcpProcessGroup::barrier(std::chrono::milliseconds timeout) {
  if (size() == 1) return;
  barrier_.wait(*store_, rank(), size(), name(), timeout);
}

std::shared_ptr<ProcessGroup> TcpProcessGroup::new_group(const std::vector<int>& ranks,
                                                         const std::string& tag) {
  const NewGroupPlan plan = plan_new_group(ranks, tag);
  if (plan.size == 1) {
    return std::make_shared<TcpProcessGroup>(c10::intrusive_ptr<c10d::Store>(), 0, 1, tag, timeout(), nullptr);
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(plan.store_prefix, store_);
  return std::make_shared<TcpProcessGroup>(std::move(store), plan.rank, plan.size, tag, timeout(), address_);
}

ProcessGroupPtr make_tcp_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               const std::string& name, std::chrono::milliseconds timeout,
                               const TcpTransportOptions& transport) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "make_tcp_group('", name, "'): rank ", rank,
             " must be in [0, ", size, ")");
  if (size == 1) return std::make_shared<TcpProcessGroup>(store, 0, 1, name, timeout, nullptr);
  FSDP_CHECK(store, "make_tcp_group('", name, "'): a group of ", size, " ranks needs a store");
  return std::make_shared<TcpProcessGroup>(
      store, rank, size, name, timeout,
      std::make_shared<const tcp::ListenAddress>(tcp::choose_listen_address(transport)));
}

}  // namespace fsdp::comm

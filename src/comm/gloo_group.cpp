#include "comm/gloo_group.h"

#include "fsdp/common/error.h"

#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace fsdp::comm {

// Note [Gloo lanes]
// A gloo context runs one collective at a time, from one thread. Each group owns
// two contexts ("lanes"), each with a worker thread draining a FIFO of work:
// the gather lane runs all_gather and broadcast, the reduce lane reduce_scatter
// and all_reduce. Both contexts share the process's tcp device (one epoll loop).
// Ranks issue the same sequence per lane, so each lane's op counter doubles as
// the gloo tag and matches across ranks. After a failure (a timeout closes the
// context's pairs) the lane refuses further work with the first error, so a
// lost peer costs one timeout, not one per queued collective.
//
// Note [Reduce-scatter by alltoall]
// reduce_scatter = alltoall (chunk j of `in` goes to rank j) + a local sum of the
// W received chunks in rank order 0..W-1, in fp32 for bf16/fp16 with one final
// rounding. Same bytes on the wire as a ring reduce-scatter, bit-identical to a
// reference that sums per-rank contributions in rank order, and `in` is only
// read. The alltoall is our own, on libgloo's unbound buffers (the primitive
// gloo::alltoall is built on), cut into 1 MiB segments so summing overlaps the
// transfer (bench/comm: faster than gloo::alltoall followed by one big sum). all_reduce = the same reduce-scatter over W padded chunks + all-gather of
// the reduced chunks, pipelined segment by segment: identical bits on every
// rank, half-precision sums accumulated in fp32, and half the wire bytes of
// upcasting to fp32 first.

namespace {

using Clock = std::chrono::steady_clock;

// gloo::rendezvous::Store over a c10d::Store, so gloo meets through the job's
// TCPStore (and its prefixes).
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const auto v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// A view of `t`'s bytes with no autograd metadata and its own version counter:
// the lanes write through it so the caller's tensors keep their version (a
// collective refilling an FSDP flat buffer must not invalidate saved tensors).
at::Tensor raw(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {t.numel()}, at::TensorOptions().dtype(t.scalar_type()));
}

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Can a socket bind to an address `host` resolves to? (c10d's test before it
// uses the hostname for Gloo.)
bool resolves_to_usable_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return false;
  bool ok = false;
  for (addrinfo* a = result; a != nullptr && !ok; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    ok = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(result);
  return ok;
}

std::shared_ptr<gloo::transport::Device> make_device(const GlooTransportOptions& t) {
  gloo::transport::tcp::attr attr;
  std::string how;
  if (is_loopback(t.master_addr)) {
    attr.hostname = "127.0.0.1";
    how = "loopback (MASTER_ADDR is local)";
  } else if (!t.socket_ifname.empty()) {
    attr.iface = t.socket_ifname;
    how = "interface " + t.socket_ifname + " (GLOO_SOCKET_IFNAME)";
  } else {
    char name[256] = {0};
    FSDP_CHECK(gethostname(name, sizeof(name) - 1) == 0, "gethostname failed: ",
               std::strerror(errno), " — set GLOO_SOCKET_IFNAME to the network interface to use");
    if (resolves_to_usable_address(name)) {
      attr.hostname = name;
      how = std::string("hostname ") + name;
    } else {
      FSDP_CHECK(t.single_node, "this host's name '", name,
                 "' does not resolve to an address Gloo can bind, and the job spans several "
                 "nodes — set GLOO_SOCKET_IFNAME to the interface that reaches MASTER_ADDR ",
                 t.master_addr, " (e.g. GLOO_SOCKET_IFNAME=eth0)");
      attr.hostname = "127.0.0.1";
      how = "loopback (hostname does not resolve)";
    }
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    FSDP_FAIL("cannot create the Gloo tcp device on ", how, ": ", e.what(),
              " — set GLOO_SOCKET_IFNAME to a valid interface");
  }
}

}  // namespace

// One unit of queued work. The closure holds the tensors until it has run.
class GlooWork final : public Work {
 public:
  using Fn = std::function<void(GlooLane&, uint32_t tag)>;
  GlooWork(std::string what, Fn fn) : what_(std::move(what)), fn_(std::move(fn)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) detail::throw_failure(error_);
  }
  bool completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  const std::string& what() const { return what_; }
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
  std::string what_;  // "all_gather #3 (float[4096])", for errors
  Fn fn_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;  // empty: success
};

class GlooLane {
 public:
  GlooLane(std::string group, std::string lane, std::shared_ptr<gloo::Context> context,
           std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        lane_(std::move(lane)),
        context_(std::move(context)),
        timeout_(timeout),
        thread_([this] { loop(); }) {}

  ~GlooLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  WorkPtr enqueue(const std::string& op, const std::string& desc, GlooWork::Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    auto work = std::make_shared<GlooWork>(detail::cat(op, " #", issued_, " (", desc, ")"),
                                           std::move(fn));
    ++issued_;
    queue_.push_back(work);
    cv_.notify_all();
    return work;
  }

  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Grow-only scratch of at least `bytes`, used only on this lane's thread.
  at::Tensor scratch(size_t bytes, at::ScalarType dtype) {
    const size_t elem = c10::elementSize(dtype);
    if (static_cast<size_t>(scratch_.numel()) < bytes) {
      scratch_ = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    }
    return at::from_blob(scratch_.data_ptr(), {static_cast<int64_t>(bytes / elem)},
                         at::TensorOptions().dtype(dtype));
  }

 private:
  void loop() {
    uint32_t tag = 0;
    for (;;) {
      std::shared_ptr<GlooWork> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      GlooWork::Fn fn = work->take_fn();
      if (!broken_.empty()) {
        work->finish(detail::cat(work->what(), " on group '", group_, "' was not run: the ", lane_,
                                 " lane failed earlier (", broken_, ")"));
        continue;
      }
      std::string error;
      try {
        fn(*this, tag++);
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        const bool timed_out = msg.find("Timed out") != std::string::npos ||
                               msg.find("timed out") != std::string::npos;
        error = detail::cat(
            work->what(), " on group '", group_, "' (rank ", context_->rank, " of ",
            context_->size, ", ", lane_, " lane) ",
            timed_out ? detail::cat("timed out after ", timeout_.count(), " ms")
                      : detail::cat("failed (timeout ", timeout_.count(), " ms)"),
            ": ", msg,
            " — another rank did not run the matching collective: it exited, crashed, hung, or "
            "issued a different sequence of collectives; see the other ranks' logs");
        broken_ = error;
      }
      fn = nullptr;  // drop tensor references before signalling completion
      work->finish(std::move(error));
    }
  }

  const std::string group_;
  const std::string lane_;
  const std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  at::Tensor scratch_;  // lane thread only
  std::string broken_;  // lane thread only: first failure
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GlooWork>> queue_;
  int64_t issued_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after every other member exists
};

namespace {

std::unique_ptr<GlooLane> connect_lane(const c10::intrusive_ptr<c10d::Store>& store,
                                       const std::string& group, const std::string& lane, int rank,
                                       int size, std::chrono::milliseconds timeout,
                                       std::shared_ptr<gloo::transport::Device>& device) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  GlooStoreAdapter adapter(c10::make_intrusive<c10d::PrefixStore>("lane/" + lane, store));
  try {
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    FSDP_FAIL("group '", group, "': rank ", rank, " of ", size, " could not connect its ", lane,
              " lane to its peers within ", timeout.count(), " ms: ", e.what(),
              " — check that all ", size,
              " ranks started and can reach each other (GLOO_SOCKET_IFNAME selects the interface)");
  }
  return std::make_unique<GlooLane>(group, lane, std::move(context), timeout);
}

std::string desc(const at::Tensor& t) {
  return detail::cat(t.scalar_type(), "[", t.numel(), "]");
}

}  // namespace

GlooProcessGroup::GlooProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                   std::string name, std::chrono::milliseconds timeout,
                                   std::shared_ptr<gloo::transport::Device> device)
    : ProcessGroup(rank, size, std::move(name), timeout),
      store_(std::move(store)),
      device_(std::move(device)) {
  if (size == 1) return;
  FSDP_ASSERT(device_ != nullptr && store_, "group '", this->name(), "' of size ", size,
              " needs a device and a store");
  gather_lane_ = connect_lane(store_, this->name(), "gather", rank, size, timeout, device_);
  reduce_lane_ = connect_lane(store_, this->name(), "reduce", rank, size, timeout, device_);
}

GlooProcessGroup::~GlooProcessGroup() {
  // Lanes first: their threads use the contexts, which use the device.
  gather_lane_.reset();
  reduce_lane_.reset();
}

WorkPtr GlooProcessGroup::do_all_gather(const at::Tensor& out, const at::Tensor& in) {
  if (in.numel() == 0) return completed_work();
  const size_t in_bytes = nbytes(in);
  auto* chunk = static_cast<uint8_t*>(out.data_ptr()) + static_cast<size_t>(rank()) * in_bytes;
  const bool in_place = in.data_ptr() == chunk;
  if (size() == 1) {
    if (!in_place) std::memcpy(chunk, in.data_ptr(), in_bytes);
    return completed_work();
  }
  return gather_lane_->enqueue("all_gather", desc(in), [out, in, in_place](GlooLane& lane, uint32_t tag) {
    gloo::AllgatherOptions opts(lane.context());
    if (!in_place) opts.setInput<uint8_t>(static_cast<uint8_t*>(in.data_ptr()), nbytes(in));
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(out.data_ptr()), nbytes(out));
    opts.setTag(tag);
    opts.setTimeout(lane.timeout());
    gloo::allgather(opts);
  });
}

WorkPtr GlooProcessGroup::do_broadcast(const at::Tensor& t, int root) {
  if (t.numel() == 0 || size() == 1) return completed_work();
  return gather_lane_->enqueue("broadcast", detail::cat(desc(t), " from root ", root),
                               [t, root](GlooLane& lane, uint32_t tag) {
    gloo::BroadcastOptions opts(lane.context());
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(t.data_ptr()), nbytes(t));
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(lane.timeout());
    gloo::broadcast(opts);
  });
}

namespace {

// Slot prefixes of our segmented alltoall (and all_reduce's all-gather phase);
// gloo's own ops use 0x01-0x08 and never run on the reduce lane's context.
constexpr uint64_t kReduceScatterSlotPrefix = 0x5A;
constexpr uint64_t kAllGatherSlotPrefix = 0x5B;
// Segment size of the pipelined alltoall: small enough that a segment is still
// in cache when it is summed, large enough to amortise per-message costs.
constexpr size_t kSegmentBytes = size_t{1} << 20;

// out (n elements) = op over parts[0..w) (each n elements, rank order).
// `acc` is fp32 scratch of >= n elements, used for bf16/fp16 sums.
// See Note [Reduce-scatter by alltoall].
void reduce_parts(const std::vector<at::Tensor>& parts, at::Tensor out, ReduceOp op,
                  const at::Tensor& acc_scratch) {
  const size_t w = parts.size();
  if (op == ReduceOp::kMax) {  // exact in any precision
    at::maximum_out(out, parts[0], parts[1]);
    for (size_t i = 2; i < w; ++i) at::maximum_out(out, out, parts[i]);
    return;
  }
  if (!is_half(out.scalar_type())) {
    at::add_out(out, parts[0], parts[1]);  // == copy of parts[0], then += parts[1]
    for (size_t i = 2; i < w; ++i) out.add_(parts[i]);
    if (op == ReduceOp::kAvg) out.div_(static_cast<int64_t>(w));
    return;
  }
  at::Tensor acc = acc_scratch.narrow(0, 0, out.numel());
  acc.copy_(parts[0]);
  for (size_t i = 1; i < w; ++i) acc.add_(parts[i]);  // fp32 += half: computed in fp32
  if (op == ReduceOp::kAvg) acc.div_(static_cast<int64_t>(w));
  out.copy_(acc);  // the one rounding
}

// Chunk j of `send` (w chunks of n = out.numel()) goes to rank j; `out` = op over
// the chunks every rank sent us, in rank order. Pipelined: every segment's
// sends and receives are posted at once, and segment s is reduced as soon as it
// arrived from every peer, while later segments are still on the wire. Our own
// contribution is read in place from `send`.
// With `gather` (all_reduce), each reduced segment is also sent to every peer as
// soon as it is ready, and the peers' reduced segments land in the returned
// scratch (w*n; chunk q from rank q, chunk rank() unused) once this rank no
// longer needs that region: reduce-scatter and all-gather overlap too.
at::Tensor alltoall_reduce(GlooLane& lane, uint32_t tag, const at::Tensor& send,
                           const at::Tensor& out, ReduceOp op, bool gather) {
  const auto& ctx = lane.context();
  const int w = ctx->size;
  const int me = ctx->rank;
  const int64_t n = out.numel();
  const size_t elem = send.element_size();
  const int64_t seg = std::max<int64_t>(1, static_cast<int64_t>(kSegmentBytes / elem));
  const int64_t segments = (n + seg - 1) / seg;
  FSDP_ASSERT(segments < (int64_t{1} << 24), "too many segments: ", segments);
  at::Tensor recv = lane.scratch(nbytes(send), send.scalar_type());
  at::Tensor acc = is_half(out.scalar_type()) && op != ReduceOp::kMax
                       ? at::empty({std::min(n, seg)}, at::kFloat)
                       : at::Tensor();
  const at::Tensor send_raw = raw(send);
  const at::Tensor out_raw = raw(out);
  auto* recv_ptr = static_cast<char*>(recv.data_ptr());
  const size_t total = nbytes(send);

  auto send_buf = ctx->createUnboundBuffer(send.data_ptr(), total);
  auto out_buf = ctx->createUnboundBuffer(out.data_ptr(), nbytes(out));
  // One receive buffer per segment (and phase): waiting on it means exactly
  // that segment arrived from every peer.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> recv_bufs, gather_bufs;
  auto slot = [&](uint64_t prefix, int64_t s) {
    return (prefix << 56) | (static_cast<uint64_t>(tag) << 24) | static_cast<uint64_t>(s);
  };
  auto peer_to = [&](int i) { return (me + i) % w; };  // staggered: not everyone hits rank 0 first
  auto peer_from = [&](int i) { return (me + w - i) % w; };
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t off = s * seg;
    const int64_t len = std::min(seg, n - off);
    recv_bufs.push_back(ctx->createUnboundBuffer(recv_ptr, total));
    for (int i = 1; i < w; ++i) {
      send_buf->send(peer_to(i), slot(kReduceScatterSlotPrefix, s), (peer_to(i) * n + off) * elem, len * elem);
      recv_bufs.back()->recv(peer_from(i), slot(kReduceScatterSlotPrefix, s),
                             (peer_from(i) * n + off) * elem, len * elem);
    }
  }
  std::vector<at::Tensor> parts(static_cast<size_t>(w));
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t off = s * seg;
    const int64_t len = std::min(seg, n - off);
    for (int i = 1; i < w; ++i) recv_bufs[static_cast<size_t>(s)]->waitRecv(lane.timeout());
    for (int q = 0; q < w; ++q) {
      parts[static_cast<size_t>(q)] = q == me ? send_raw.narrow(0, me * n + off, len)
                                              : recv.narrow(0, q * n + off, len);
    }
    reduce_parts(parts, out_raw.narrow(0, off, len), op, acc);
    if (gather) {
      gather_bufs.push_back(ctx->createUnboundBuffer(recv_ptr, total));
      for (int i = 1; i < w; ++i) {
        out_buf->send(peer_to(i), slot(kAllGatherSlotPrefix, s), off * elem, len * elem);
        // This segment of the scratch was just consumed: peers' results may land there.
        gather_bufs.back()->recv(peer_from(i), slot(kAllGatherSlotPrefix, s),
                                 (peer_from(i) * n + off) * elem, len * elem);
      }
    }
  }
  for (int64_t k = 0; k < segments * (w - 1); ++k) send_buf->waitSend(lane.timeout());
  if (gather) {
    for (auto& b : gather_bufs) {
      for (int i = 1; i < w; ++i) b->waitRecv(lane.timeout());
    }
    for (int64_t k = 0; k < segments * (w - 1); ++k) out_buf->waitSend(lane.timeout());
  }
  return recv;
}

}  // namespace

WorkPtr GlooProcessGroup::do_reduce_scatter(const at::Tensor& out, const at::Tensor& in,
                                            ReduceOp op) {
  if (out.numel() == 0) return completed_work();
  if (size() == 1) {  // op over one contribution is the contribution (x / 1 == x)
    std::memcpy(out.data_ptr(), in.data_ptr(), nbytes(out));
    return completed_work();
  }
  return reduce_lane_->enqueue("reduce_scatter", detail::cat(desc(in), ", ", to_string(op)),
                               [out, in, op](GlooLane& lane, uint32_t tag) {
    alltoall_reduce(lane, tag, in, out, op, /*gather=*/false);
  });
}

WorkPtr GlooProcessGroup::do_all_reduce(const at::Tensor& t, ReduceOp op) {
  if (t.numel() == 0 || size() == 1) return completed_work();
  const int w = size();
  const int me = rank();
  return reduce_lane_->enqueue("all_reduce", detail::cat(desc(t), ", ", to_string(op)),
                               [t, op, w, me](GlooLane& lane, uint32_t tag) {
    const int64_t n = t.numel();
    const int64_t c = (n + w - 1) / w;  // chunk per rank; the tail of the last ones is padding
    const at::Tensor t_raw = raw(t);
    at::Tensor send = t_raw;
    if (c * w != n) {
      send = at::zeros({c * w}, at::TensorOptions().dtype(t.scalar_type()));
      send.narrow(0, 0, n).copy_(t_raw);
    }
    const at::Tensor mine = at::empty({c}, at::TensorOptions().dtype(t.scalar_type()));
    const at::Tensor gathered = alltoall_reduce(lane, tag, send, mine, op, /*gather=*/true);
    // Every send has completed: t may be overwritten now.
    for (int q = 0; q < w; ++q) {
      const int64_t len = std::min(c, n - q * c);
      if (len <= 0) break;
      t_raw.narrow(0, q * c, len).copy_(q == me ? mine.narrow(0, 0, len) : gathered.narrow(0, q * c, len));
    }
  });
}

void GlooProcessGroup::barrier(std::chrono::milliseconds timeout) {
  if (size() == 1) return;
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = barrier_generation_++;
  }
  store_barrier(*store_, detail::cat("barrier/", generation), rank(), size(), name(), timeout);
  if (generation > 0) {
    // Everyone passed barrier generation-1 before arriving here: its key is dead.
    store_->deleteKey(detail::cat("barrier/", generation - 1, "/", rank()));
  }
}

std::shared_ptr<ProcessGroup> GlooProcessGroup::new_group(const std::vector<int>& ranks,
                                                          const std::string& tag) {
  const NewGroupPlan plan = plan_new_group(ranks, tag);
  if (plan.size == 1) {
    return std::make_shared<GlooProcessGroup>(c10::intrusive_ptr<c10d::Store>(), 0, 1, tag,
                                              timeout(), nullptr);
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>(plan.store_prefix, store_);
  return std::make_shared<GlooProcessGroup>(std::move(store), plan.rank, plan.size, tag, timeout(), device_);
}

ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                const GlooTransportOptions& transport) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "make_gloo_group('", name, "'): rank ", rank,
             " must be in [0, ", size, ")");
  if (size == 1) return std::make_shared<GlooProcessGroup>(store, 0, 1, name, timeout, nullptr);
  FSDP_CHECK(store, "make_gloo_group('", name, "'): a group of ", size, " ranks needs a store");
  return std::make_shared<GlooProcessGroup>(store, rank, size, name, timeout,
                                            make_device(transport));
}

void store_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                   const std::string& group, std::chrono::milliseconds timeout) {
  store.set(detail::cat(prefix, "/", rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::cat(prefix, "/", r));
  const auto start = Clock::now();
  auto pause = std::chrono::milliseconds(1);
  while (!store.check(keys)) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (waited >= timeout) {
      std::ostringstream missing;
      int n_missing = 0;
      for (int r = 0; r < size; ++r) {
        if (!store.check({keys[r]})) missing << (n_missing++ ? ", " : "") << r;
      }
      if (n_missing == 0) break;  // the last one arrived just now
      FSDP_FAIL("barrier on group '", group, "' timed out after ", timeout.count(), " ms: ",
                n_missing == 1 ? "rank " : "ranks ", missing.str(),
                " did not arrive — they are slower, hung, crashed or skipped the barrier; see their "
                "logs");
    }
    std::this_thread::sleep_for(std::min(pause, timeout - waited));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace fsdp::comm

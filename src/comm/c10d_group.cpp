// Our ProcessGroup over a c10d::Backend (contract: fsdp/comm/c10d.h).
#include "fsdp/comm/c10d.h"

#include "comm/rank_order.h"
#include "comm/store_barrier.h"
#include "fsdp/common/error.h"
#include "fsdp/common/trace.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>

namespace fsdp::comm {

// Note [c10d reductions]
// c10d matches collectives by their place in one sequence per backend, and a
// local step after a collective (a sum) may not issue a second collective at
// a time that depends on when the first one ended: ranks would number them
// differently. So every operation here is exactly one c10d collective, issued
// on the caller's thread, plus at most a local step when it completes:
//  - reduce_scatter (kRankOrder) = alltoall_base (chunk j of `in` to rank j)
//    + the rank-order sum of the W received chunks (rank_order.h): the same
//    bytes on the wire as a ring reduce-scatter, and the TCP group's bits.
//  - all_reduce (kRankOrder) = _allgather_base of the whole tensor + the
//    same sum on every rank: the TCP group's bits, identical on every rank.
//    It receives (W-1) n elements per rank where a ring moves 2 (W-1)/W n:
//    the same at W = 2, twice as many at W = 4. The engine all-reduces
//    scalars, HYBRID's replica shards and NO_SHARD's gradients this way.
//  - kBackend: the backend's _reduce_scatter_base and allreduce (Gloo: SUM
//    then a division for kAvg, which Gloo refuses; NCCL: AVG itself).
// The local step runs on the backend's thread that completed the collective
// (a callback on c10d's Future), so it overlaps the caller's compute as the
// TCP group's lane threads do. Receive buffers come from a small pool kept
// by the group: a fresh allocation of many MiB costs a page fault per 4 KiB.

const char* to_string(C10dReductions r) { return r == C10dReductions::kRankOrder ? "rank-order" : "backend"; }

namespace {

using Clock = std::chrono::steady_clock;

// How long past the collective's own timeout a CPU wait lasts before it
// gives up on the backend ever reporting (c10d's timeout fires first).
constexpr auto kGrace = std::chrono::seconds(5);

// c10d's message without its C++ stack trace.
std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& x) {
    const std::string m = x.what_without_backtrace();
    return m.substr(0, m.find("\nException raised from"));
  } catch (const std::exception& x) {
    const std::string m = x.what();
    return m.substr(0, m.find('\n'));
  } catch (...) {
    return "unknown exception";
  }
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

std::string desc(const at::Tensor& t) { return detail::cat(t.scalar_type(), "[", t.numel(), "]"); }

// The group's first failure, shared with its Work handles: a collective
// issued after it fails at once instead of waiting for a timeout of its own.
struct Health {
  std::mutex mu;
  std::string failure;
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  void set(const std::string& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = f;
  }
};

// Receive buffers of the rank-order reductions, reused between collectives.
class ScratchPool {
 public:
  at::Tensor take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (nbytes(free_[i]) >= bytes && (best == free_.size() || nbytes(free_[i]) < nbytes(free_[best]))) best = i;
    }
    if (best == free_.size()) return at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    at::Tensor t = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    return t;
  }
  void give(at::Tensor t) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(t));
    if (free_.size() > kKept) {  // drop the smallest
      auto it = std::min_element(free_.begin(), free_.end(),
                                 [](const at::Tensor& a, const at::Tensor& b) { return nbytes(a) < nbytes(b); });
      free_.erase(it);
    }
  }

 private:
  static constexpr size_t kKept = 4;  // collectives in flight at once, typically
  std::mutex mu_;
  std::vector<at::Tensor> free_;
};

// `numel` elements of `dtype` in the bytes of `buffer`.
at::Tensor typed(const at::Tensor& buffer, int64_t numel, at::ScalarType dtype) {
  return at::from_blob(buffer.data_ptr(), {numel}, at::TensorOptions().dtype(dtype));
}

// A collective in flight. CPU: done when the backend's Future completed and
// the local step (if any) ran, on the backend's thread. CUDA: c10d's own Work.
class C10dWork final : public Work, public std::enable_shared_from_this<C10dWork> {
 public:
  using Finish = std::function<void()>;

  C10dWork(const char* op, std::string what, int64_t bytes, std::shared_ptr<Health> health,
           std::chrono::milliseconds timeout)
      : op_(op),
        what_(std::move(what)),
        bytes_(bytes),
        health_(std::move(health)),
        timeout_(timeout),
        issued_(Clock::now()),
        trace_begin_us_(trace::enabled() ? trace::now_us() : -1) {}

  // A Work that failed before it ran.
  void fail_now(const std::string& error) { finish_with(error); }

  // CPU: completes when `work`'s Future completes, after `finish`; `keep`
  // (tensors the backend reads or writes) is dropped then.
  void start_cpu(const c10::intrusive_ptr<c10d::Work>& work, std::vector<at::Tensor> keep, Finish finish) {
    keep_ = std::move(keep);
    finish_ = std::move(finish);
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {  // a backend without Futures: wait() does the rest
      work_ = work;
      return;
    }
    // The callback holds the Work until it ran, even if the caller dropped it.
    future->addCallback([self = shared_from_this()](c10::ivalue::Future& f) {
      self->complete(f.hasError() ? message_of(f.exception_ptr()) : std::string());
    });
  }

  // CUDA: c10d's Work orders the caller's stream on wait().
  void start_cuda(const c10::intrusive_ptr<c10d::Work>& work, std::vector<at::Tensor> keep) {
    work_ = work;
    keep_ = std::move(keep);
    cuda_ = true;
  }

  void wait() override {
    if (work_ && (cuda_ || !done())) wait_backend();
    std::unique_lock<std::mutex> lock(mu_);
    // c10d's own timeout fires first; this bounds a backend that never reports.
    if (!cv_.wait_until(lock, issued_ + 2 * timeout_ + kGrace, [&] { return done_; })) {
      lock.unlock();
      const std::string error = detail::cat(what_, " did not complete within ", 2 * timeout_.count(),
                                            " ms and the backend reported nothing — see the other ranks' logs; "
                                            "InitOptions::timeout (FSDP_TIMEOUT) sets this limit");
      health_->set(error);
      detail::throw_failure(error);
    }
    if (!error_.empty()) detail::throw_failure(error_);
  }

  bool completed() override {
    if (cuda_) {
      try {
        return work_->isCompleted();
      } catch (const std::exception&) {
        return true;
      }
    }
    return done();
  }

 private:
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  // Without a Future (or on CUDA): c10d's wait, then the local step here.
  void wait_backend() {
    std::string error;
    try {
      work_->wait(timeout_);
    } catch (...) {
      error = message_of(std::current_exception());
    }
    if (!cuda_) {
      complete(error);
      return;
    }
    if (!error.empty()) {
      const std::string e = detail::cat(what_, " failed: ", error);
      health_->set(e);
      detail::throw_failure(e);
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }

  // Runs the local step once (unless the collective failed), records the outcome.
  void complete(const std::string& backend_error) {
    std::string error;
    if (!backend_error.empty()) {
      error = detail::cat(what_, " failed: ", backend_error,
                          " — a peer died, stopped or gave up (see the other ranks' logs); "
                          "InitOptions::timeout (FSDP_TIMEOUT) sets how long a collective waits");
    } else if (finish_) {
      try {
        finish_();
      } catch (...) {
        error = detail::cat(what_, " failed after its transfer: ", message_of(std::current_exception()));
      }
    }
    if (trace_begin_us_ >= 0) {
      thread_local bool named = false;
      if (!named) trace::set_thread_name("comm: c10d backend");
      named = true;
      trace::record(op_, "comm", trace_begin_us_, trace::now_us(), bytes_, what_);
    }
    finish_with(error);
  }

  void finish_with(const std::string& error) {
    if (!error.empty()) health_->set(error);
    Finish f;
    std::vector<at::Tensor> keep;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      error_ = error;
      f = std::move(finish_);
      keep = std::move(keep_);
    }
    cv_.notify_all();
    // The tensors go now, not with the handle.
  }

  const char* op_;
  const std::string what_;
  const int64_t bytes_;
  const std::shared_ptr<Health> health_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point issued_;
  const int64_t trace_begin_us_;         // -1: tracing was off at issue
  c10::intrusive_ptr<c10d::Work> work_;  // CUDA, or a CPU backend without Futures
  bool cuda_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  Finish finish_;
  std::vector<at::Tensor> keep_;
};

// dst = src through views without autograd metadata (a group of one rank).
void local_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.data_ptr() != src.data_ptr()) raw(dst).copy_(raw(src));
}

// One c10d backend and the order of the collectives issued on it.
struct Lane {
  explicit Lane(c10::intrusive_ptr<c10d::Backend> b) : backend(std::move(b)) {}
  const c10::intrusive_ptr<c10d::Backend> backend;
  std::mutex mu;  // guards `issued` and the order of calls into `backend`
  int64_t issued = 0;
};

class C10dProcessGroup final : public ProcessGroup {
 public:
  // `gather` carries all_gather and broadcast, `reduce` the others (may be the same lane).
  C10dProcessGroup(std::shared_ptr<Lane> gather, std::shared_ptr<Lane> reduce, C10dGroupOptions o,
                   at::Device device, C10dReductions reductions)
      : ProcessGroup(gather->backend->getRank(), gather->backend->getSize(), o.name, o.timeout),
        gather_(std::move(gather)),
        reduce_(std::move(reduce)),
        options_(std::move(o)),
        device_(device),
        reductions_(reductions),
        name_of_backend_(gather_->backend->getBackendName()),
        health_(std::make_shared<Health>()) {
    for (Lane* lane : {gather_.get(), reduce_.get()}) {
      try {
        lane->backend->setTimeout(timeout());
      } catch (const std::exception&) {  // a backend without setTimeout keeps its own; every op passes ours
      }
    }
    if (options_.store) store_ = c10::make_intrusive<c10d::PrefixStore>(detail::cat("fsdp/c10d/", name()), options_.store);
  }

  at::Device device() const override { return device_; }
  std::string backend() const override { return "c10d-" + name_of_backend_; }
  std::string transport() const override {
    const std::string what = options_.description.empty() ? "c10d " + name_of_backend_ : options_.description;
    return detail::cat(what, gather_ == reduce_ ? "; one backend for both lanes" : "; a backend per lane",
                       "; reductions: ", to_string(reductions_));
  }

  void barrier(std::chrono::milliseconds timeout) override {
    if (size() == 1) return;
    if (store_) {
      barrier_.wait(*store_, rank(), size(), name(), timeout);
      return;
    }
    c10d::BarrierOptions o;
    o.timeout = timeout;
    try {
      std::lock_guard<std::mutex> lock(gather_->mu);  // a collective of the lane's sequence
      gather_->backend->barrier(o)->wait(timeout);
    } catch (...) {
      FSDP_FAIL("barrier on group '", name(), "' (rank ", rank(), " of ", size(), ", ", backend(),
                ") failed within ", timeout.count(), " ms: ", message_of(std::current_exception()),
                " — see the other ranks' logs");
    }
  }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& tag) override {
    const NewGroupPlan plan = plan_new_group(ranks, tag);
    FSDP_CHECK(options_.store, "new_group('", tag, "') on group '", name(), "' (", backend(),
               "): sub-groups of a c10d backend need the store it was made with — set C10dGroupOptions::store");
    auto store = c10::make_intrusive<c10d::PrefixStore>(plan.store_prefix, options_.store);
    // A backend for each lane of this group, each with keys of its own.
    auto make = [&](const std::shared_ptr<Lane>& parent, const char* lane) {
      auto lane_store = c10::make_intrusive<c10d::PrefixStore>(lane, store);
      c10::intrusive_ptr<c10d::Backend> sub;
      try {
        if (options_.make_subgroup) {
          sub = options_.make_subgroup(lane_store, ranks, plan.rank, timeout());
        } else {
          FSDP_CHECK(parent->backend->supportsSplitting(), "new_group('", tag, "') on group '", name(),
                     "': c10d backend ", name_of_backend_, " cannot split — pass C10dGroupOptions::make_subgroup");
          sub = parent->backend->split(lane_store, ranks, {});
        }
      } catch (const fsdp::Failure&) {
        throw;
      } catch (...) {
        FSDP_FAIL("new_group('", tag, "') on group '", name(), "' (", backend(),
                  "): making its c10d backend failed: ", message_of(std::current_exception()));
      }
      FSDP_ASSERT(sub && sub->getSize() == plan.size && sub->getRank() == plan.rank, "new_group('", tag,
                  "'): the c10d backend made for it has rank ", sub ? sub->getRank() : -1, " of ",
                  sub ? sub->getSize() : -1, ", expected ", plan.rank, " of ", plan.size);
      return std::make_shared<Lane>(std::move(sub));
    };
    std::shared_ptr<Lane> gather = make(gather_, "gather");
    std::shared_ptr<Lane> reduce = gather_ == reduce_ ? gather : make(reduce_, "reduce");
    C10dGroupOptions o = options_;
    o.name = tag;
    o.store = store;
    return std::make_shared<C10dProcessGroup>(std::move(gather), std::move(reduce), std::move(o), device_,
                                              reductions_);
  }

 protected:
  WorkPtr do_all_gather(const at::Tensor& out, const at::Tensor& in) override {
    if (in.numel() == 0) return completed_work();
    if (size() == 1) {
      local_copy(out.narrow(0, 0, in.numel()), in);
      return completed_work();
    }
    at::Tensor o = bytes(out), i = bytes(in);
    return issue(*gather_, "all_gather", desc(in), {out, in},
                 [&](c10d::Backend& b) { return b._allgather_base(o, i, gather_opts()); }, {o, i}, nullptr);
  }

  WorkPtr do_broadcast(const at::Tensor& t, int root) override {
    if (t.numel() == 0 || size() == 1) return completed_work();
    std::vector<at::Tensor> ts{bytes(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout();
    return issue(*gather_, "broadcast", detail::cat(desc(t), " from root ", root), {t},
                 [&](c10d::Backend& b) { return b.broadcast(ts, o); }, ts, nullptr);
  }

  WorkPtr do_all_to_all(const at::Tensor& out, const at::Tensor& in) override {
    if (in.numel() == 0) return completed_work();
    if (size() == 1) {
      local_copy(out, in);
      return completed_work();
    }
    at::Tensor o = bytes(out), i = bytes(in);
    return issue(*reduce_, "all_to_all", desc(in), {out, in}, [&](c10d::Backend& b) { return alltoall(b, o, i); },
                 {o, i}, nullptr);
  }

  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    if (out.numel() == 0) return completed_work();
    if (size() == 1) {  // op over one contribution is the contribution (x / 1 == x)
      local_copy(out, in);
      return completed_work();
    }
    const std::string what = detail::cat(desc(in), ", ", fsdp::comm::to_string(op));
    if (reductions_ == C10dReductions::kBackend) {
      at::Tensor o = typed_view(out), i = typed_view(in);
      c10d::ReduceScatterOptions ro;
      ro.reduceOp = c10d_op(op);
      ro.timeout = timeout();
      return issue(*reduce_, "reduce_scatter", what, {out, in},
                   [&](c10d::Backend& b) { return b._reduce_scatter_base(o, i, ro); }, {o, i}, average_after(o, op));
    }
    // Note [c10d reductions]: alltoall + a rank-order sum.
    const int w = size();
    const int64_t n = out.numel();
    const at::ScalarType dtype = in.scalar_type();
    at::Tensor buffer = pool_->take(nbytes(in));
    at::Tensor recv = typed(buffer, w * n, dtype);
    at::Tensor o = raw(out), i = raw(in);
    at::Tensor rb = bytes(recv), ib = bytes(in);
    auto finish = [pool = pool_, buffer, recv, o, i, op, w, n, me = rank()]() mutable {
      std::vector<at::Tensor> parts;
      for (int q = 0; q < w; ++q) parts.push_back(q == me ? i.narrow(0, me * n, n) : recv.narrow(0, q * n, n));
      reduce_in_rank_order(parts, o, op, accumulator(o, op));
      pool->give(std::move(buffer));
    };
    return issue(*reduce_, "reduce_scatter", what, {out, in}, [&](c10d::Backend& b) { return alltoall(b, rb, ib); },
                 {rb, ib}, finish);
  }

  WorkPtr do_all_reduce(const at::Tensor& t, ReduceOp op) override {
    if (t.numel() == 0 || size() == 1) return completed_work();
    const std::string what = detail::cat(desc(t), ", ", fsdp::comm::to_string(op));
    if (reductions_ == C10dReductions::kBackend) {
      std::vector<at::Tensor> ts{typed_view(t)};
      c10d::AllreduceOptions ao;
      ao.reduceOp = c10d_op(op);
      ao.timeout = timeout();
      return issue(*reduce_, "all_reduce", what, {t}, [&](c10d::Backend& b) { return b.allreduce(ts, ao); }, ts,
                   average_after(ts[0], op));
    }
    // Note [c10d reductions]: all-gather + the same rank-order sum everywhere.
    const int w = size();
    const int64_t n = t.numel();
    at::Tensor buffer = pool_->take(static_cast<size_t>(w) * nbytes(t));
    at::Tensor all = typed(buffer, w * n, t.scalar_type());
    at::Tensor tr = raw(t);
    at::Tensor ab = bytes(all), tb = bytes(t);
    auto finish = [pool = pool_, buffer, all, tr, op, w, n]() mutable {
      std::vector<at::Tensor> parts;
      for (int q = 0; q < w; ++q) parts.push_back(all.narrow(0, q * n, n));
      reduce_in_rank_order(parts, tr, op, accumulator(tr, op));
      pool->give(std::move(buffer));
    };
    return issue(*reduce_, "all_reduce", what, {t},
                 [&](c10d::Backend& b) { return b._allgather_base(ab, tb, gather_opts()); }, {ab, tb}, finish);
  }

 private:
  bool cuda() const { return device_.is_cuda(); }

  // The tensor's bytes, for collectives that only move them. CPU: a view
  // without autograd metadata (rank_order.h: raw). CUDA: a view of the same
  // storage, so that c10d's stream bookkeeping protects the memory.
  at::Tensor bytes(const at::Tensor& t) const {
    if (cuda()) return t.view({-1}).view(at::kByte);
    return at::from_blob(t.data_ptr(), {static_cast<int64_t>(nbytes(t))}, at::TensorOptions().dtype(at::kByte));
  }
  // The tensor as itself, for reductions (the same choice of view as bytes()).
  at::Tensor typed_view(const at::Tensor& t) const { return cuda() ? t.view({-1}) : raw(t); }

  c10d::AllgatherOptions gather_opts() const {
    c10d::AllgatherOptions o;
    o.timeout = timeout();
    return o;
  }

  c10::intrusive_ptr<c10d::Work> alltoall(c10d::Backend& backend, at::Tensor& out, at::Tensor& in) {
    std::vector<int64_t> even;  // empty split sizes: equal chunks
    c10d::AllToAllOptions o;
    o.timeout = timeout();
    return backend.alltoall_base(out, in, even, even, o);
  }

  c10d::ReduceOp c10d_op(ReduceOp op) const {
    switch (op) {
      case ReduceOp::kSum:
        return c10d::ReduceOp::SUM;
      case ReduceOp::kMax:
        return c10d::ReduceOp::MAX;
      case ReduceOp::kAvg:  // NCCL averages itself; Gloo refuses AVG: sum, then average_after
        return cuda() ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    }
    return c10d::ReduceOp::SUM;
  }

  // kAvg on the CPU with the backend's sum: divide when it completes.
  C10dWork::Finish average_after(const at::Tensor& t, ReduceOp op) const {
    if (op != ReduceOp::kAvg || cuda()) return nullptr;
    return [t, w = size()] { t.div_(w); };
  }

  // fp32 accumulator for a half-precision sum into `out`, else undefined.
  static at::Tensor accumulator(const at::Tensor& out, ReduceOp op) {
    if (!is_half(out.scalar_type()) || op == ReduceOp::kMax) return at::Tensor();
    return at::empty({out.numel()}, at::kFloat);
  }

  // Issues one c10d collective (Note [c10d reductions]); `keep` are the
  // tensors it reads and writes, `finish` the local step after it.
  WorkPtr issue(Lane& lane, const char* op, const std::string& desc, std::vector<at::Tensor> callers,
                const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>& launch,
                std::vector<at::Tensor> keep, C10dWork::Finish finish) {
    std::lock_guard<std::mutex> lock(lane.mu);  // c10d numbers collectives in issue order
    const std::string what = detail::cat(op, " #", lane.issued++, " (", desc, ") on group '", name(), "' (rank ",
                                         rank(), " of ", size(), ", ", backend(), ")");
    auto work = std::make_shared<C10dWork>(op, what, static_cast<int64_t>(nbytes(keep.front())), health_, timeout());
    const std::string earlier = health_->get();
    if (!earlier.empty()) {
      work->fail_now(detail::cat(what, " was not run: the group failed earlier (", earlier, ")"));
      return work;
    }
    for (auto& t : callers) keep.push_back(std::move(t));
    c10::intrusive_ptr<c10d::Work> c;
    try {
      c = launch(*lane.backend);
    } catch (...) {
      work->fail_now(detail::cat(what, " could not start: ", message_of(std::current_exception())));
      return work;
    }
    if (cuda()) {
      work->start_cuda(c, std::move(keep));
    } else {
      work->start_cpu(c, std::move(keep), std::move(finish));
    }
    return work;
  }

  const std::shared_ptr<Lane> gather_;  // all_gather, broadcast
  const std::shared_ptr<Lane> reduce_;  // reduce_scatter, all_reduce, all_to_all; may be gather_
  const C10dGroupOptions options_;
  const at::Device device_;
  const C10dReductions reductions_;
  const std::string name_of_backend_;
  const std::shared_ptr<Health> health_;
  c10::intrusive_ptr<c10d::Store> store_;  // options_.store under fsdp/c10d/<name>, or null
  StoreBarrier barrier_;
  // Shared with the local steps, which may run while the group is destroyed
  // (the backend drains its queue in its destructor).
  const std::shared_ptr<ScratchPool> pool_ = std::make_shared<ScratchPool>();
};

}  // namespace

ProcessGroupPtr make_c10d_group(const c10::intrusive_ptr<c10d::Backend>& backend, const C10dGroupOptions& options) {
  FSDP_CHECK(backend, "make_c10d_group('", options.name, "'): the c10d backend is null");
  at::Device device = at::kCPU;
  if (options.device) {
    device = *options.device;
  } else if (backend->getBackendName() == "nccl") {
    device = at::Device(at::kCUDA, at::detail::getCUDAHooks().current_device());
  }
  const C10dReductions reductions =
      options.reductions.value_or(device.is_cuda() ? C10dReductions::kBackend : C10dReductions::kRankOrder);
  FSDP_CHECK(!(device.is_cuda() && reductions == C10dReductions::kRankOrder), "make_c10d_group('", options.name,
             "'): rank-order reductions run on the CPU only — use C10dReductions::kBackend on ", device);
  const auto& r = options.reduce_backend;
  FSDP_CHECK(!r || (r->getRank() == backend->getRank() && r->getSize() == backend->getSize()), "make_c10d_group('",
             options.name, "'): reduce_backend is rank ", r ? r->getRank() : 0, " of ", r ? r->getSize() : 0,
             " but the backend is rank ", backend->getRank(), " of ", backend->getSize(),
             " — both lanes must span the same ranks");
  auto gather = std::make_shared<Lane>(backend);
  auto reduce = r ? std::make_shared<Lane>(r) : gather;
  C10dGroupOptions o = options;
  o.reduce_backend = {};  // held by its lane
  return std::make_shared<C10dProcessGroup>(std::move(gather), std::move(reduce), std::move(o), device, reductions);
}

}  // namespace fsdp::comm

// NCCL process group. Compiled with -DFSDP_WITH_NCCL=ON; not run in CI (no GPU).
#include "comm/nccl_group.h"

#include "fsdp/comm/backends.h"
#include "fsdp/common/error.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstring>
#include <iostream>
#include <thread>

namespace fsdp::comm {

namespace {
// The caller's current CUDA stream on `device`: collectives are ordered after it.
cudaStream_t current_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}
}  // namespace

// Note [NCCL lanes]
// NCCL runs the operations of one communicator in issue order, and requires
// every rank to issue them in the same order. Our contract only orders each
// lane (a rank may issue all_gather then reduce_scatter while another issues
// them the other way round), so each lane owns its communicator and stream.
// Issue: the lane stream waits on an event recorded on the caller's current
// stream (inputs are ready), the collective runs, and a `done` event is
// recorded; wait() makes the caller's current stream wait on `done` — a
// stream-to-stream dependency, never a host sync. The watchdog keeps the
// tensors of each collective referenced until `done` fires, so memory freed by
// the caller is not reused by the caching allocator while NCCL still reads or
// writes it (no recordStream needed).

namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FSDP_FAIL("CUDA error in ", what, ": ", cudaGetErrorString(e));
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string msg = ncclGetErrorString(r);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
#else
  (void)comm;
#endif
  return msg;
}

void nccl_check(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess) FSDP_FAIL("NCCL error in ", what, ": ", nccl_error(r, comm));
}

// Sets the current CUDA device for its scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

ncclDataType_t reduction_type(at::ScalarType t, const std::string& group) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case at::kBFloat16:
      return ncclBfloat16;
#endif
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      FSDP_CHECK(false, "NCCL group '", group, "' cannot reduce ", t,
                 " tensors — use float32, float64, float16, bfloat16, int8/32/64 or uint8");
  }
  return ncclFloat32;
}

// The NCCL operation for `op` on a group of `size` ranks. On one rank the
// average is the sum, and is asked for as one: NCCL 2.28.9 (H200, CUDA 13.0)
// returned a wrong result for an out-of-place one-rank reduce-scatter average
// of 4,194,309 elements in float32, bfloat16 and float16, where the sum, the
// maximum, the in-place all-reduce and 4,099 elements came out exact
// (Cuda.EveryCollectiveOfOneRankOnUnevenSizesAndDtypes).
ncclRedOp_t reduction_op(ReduceOp op, int size, const std::string& group) {
  if (size == 1 && op == ReduceOp::kAvg) op = ReduceOp::kSum;
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclAvg;
#else
      FSDP_CHECK(false, "NCCL group '", group, "': ReduceOp::kAvg needs NCCL >= 2.10, this build has ",
                 NCCL_MAJOR, ".", NCCL_MINOR, " — use kSum and scale");
#endif
  }
  (void)group;
  return ncclSum;
}

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

std::string desc(const at::Tensor& t) { return detail::cat(t.scalar_type(), "[", t.numel(), "]"); }

}  // namespace

struct NcclProcessGroup::Lane {
  std::string name;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int64_t issued = 0;
};

struct NcclProcessGroup::InFlight {
  std::string what;  // "all_gather #3 (Float[4096])"
  cudaEvent_t done = nullptr;
  std::vector<at::Tensor> keep;  // cleared by the watchdog once `done` fired
  Clock::time_point start;
  ~InFlight() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};

struct NcclProcessGroup::Health {
  std::mutex mu;
  std::string failure;  // "" while healthy
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclProcessGroup::InFlight> op,
           std::shared_ptr<NcclProcessGroup::Health> health, int device)
      : op_(std::move(op)), health_(std::move(health)), device_(device) {}

  void wait() override {
    throw_if_failed();
    DeviceGuard guard(device_);
    // Sync by event, not by host: the caller's stream waits for the collective.
    auto* stream = current_stream(device_);
    cuda_check(cudaStreamWaitEvent(stream, op_->done, 0), "cudaStreamWaitEvent");
  }

  bool completed() override {
    {
      std::lock_guard<std::mutex> lock(health_->mu);
      if (!health_->failure.empty()) return true;
    }
    return cudaEventQuery(op_->done) == cudaSuccess;
  }

 private:
  void throw_if_failed() {
    std::lock_guard<std::mutex> lock(health_->mu);
    if (!health_->failure.empty()) {
      detail::throw_failure(detail::cat(op_->what, " cannot complete: ", health_->failure));
    }
  }

  std::shared_ptr<NcclProcessGroup::InFlight> op_;
  std::shared_ptr<NcclProcessGroup::Health> health_;
  int device_;
};

// One lane's communicator: rank 0 of the group publishes the unique id.
std::unique_ptr<NcclProcessGroup::Lane> connect_lane(c10d::Store& store, const std::string& group,
                                                     const std::string& lane, int rank, int size,
                                                     int device) {
  auto out = std::make_unique<NcclProcessGroup::Lane>();
  out->name = lane;
  ncclUniqueId id;
  const std::string key = "nccl_id/" + lane;
  try {
    if (rank == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store.set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    } else {
      const std::vector<uint8_t> v = store.get(key);
      FSDP_ASSERT(v.size() == sizeof(id), "NCCL unique id of ", v.size(), " bytes");
      std::memcpy(&id, v.data(), sizeof(id));
    }
  } catch (const c10::Error& e) {
    FSDP_FAIL("group '", group, "': rank ", rank, " of ", size, " could not exchange the NCCL id of its ",
              lane, " lane through the store: ", e.what_without_backtrace(),
              " — check that all ranks started");
  }
  DeviceGuard guard(device);
  nccl_check(ncclCommInitRank(&out->comm, size, id, rank),
             detail::cat("ncclCommInitRank (group '", group, "', ", lane, " lane, rank ", rank, " of ", size, ")"));
  cuda_check(cudaStreamCreateWithFlags(&out->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return out;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                   std::string name, std::chrono::milliseconds timeout,
                                   int device_index)
    : ProcessGroup(rank, size, std::move(name), timeout),
      store_(std::move(store)),
      device_index_(device_index),
      health_(std::make_shared<Health>()) {
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  FSDP_CHECK(device_index >= 0 && device_index < count, "NCCL group '", this->name(), "': device cuda:",
             device_index, " does not exist (", count,
             " visible) — one process per GPU: LOCAL_RANK must be below the number of GPUs "
             "(check CUDA_VISIBLE_DEVICES and LaunchOptions::nproc)");
  gather_ = connect_lane(*store_, this->name(), "gather", rank, size, device_index);
  reduce_ = connect_lane(*store_, this->name(), "reduce", rank, size, device_index);
  watchdog_ = std::thread([this] { watchdog(); });
}

// Note [Teardown of a stuck group]
// A communicator is destroyed once its lanes' streams are idle: destroying it
// under a running collective is undefined. But a collective that a peer never
// joins keeps its stream busy for ever, and the destructor used to wait for it
// with cudaStreamSynchronize: a process whose peer died hung at exit. It now
// waits at most the group's timeout, then names what is still in flight and
// aborts the communicators (ncclCommAbort unblocks their kernels), as the
// watchdog does for a collective that times out while the group is in use.
NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  cudaSetDevice(device_index_);  // no DeviceGuard: it may throw, and this is a destructor
  const auto deadline = Clock::now() + timeout();
  while (!aborted_) {
    bool idle = true;
    for (Lane* lane : {gather_.get(), reduce_.get()}) {
      if (lane != nullptr && cudaStreamQuery(lane->stream) != cudaSuccess) idle = false;
    }
    if (idle) break;
    if (Clock::now() >= deadline) {
      std::string pending = "a collective";
      for (const auto& op : in_flight_) {
        if (cudaEventQuery(op->done) != cudaSuccess) {
          pending = op->what;
          break;
        }
      }
      std::cerr << "fsdp: NCCL group '" << name() << "' destroyed with " << pending << " still in flight after "
                << timeout().count() << " ms (a peer never joined it): aborting its communicators\n";
      for (Lane* lane : {gather_.get(), reduce_.get()}) {
        if (lane != nullptr) ncclCommAbort(lane->comm);
      }
      aborted_ = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (Lane* lane : {gather_.get(), reduce_.get()}) {
    if (lane == nullptr) continue;
    if (!aborted_) {
      cudaStreamSynchronize(lane->stream);  // idle already (above): returns at once
      ncclCommDestroy(lane->comm);
    }
    cudaStreamDestroy(lane->stream);
  }
  in_flight_.clear();
}

void NcclProcessGroup::fail_locked(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(health_->mu);
    if (health_->failure.empty()) health_->failure = message;
  }
  if (!aborted_) {
    aborted_ = true;
    // Unblocks kernels waiting for a peer that will never come.
    for (Lane* lane : {gather_.get(), reduce_.get()}) ncclCommAbort(lane->comm);
  }
}

void NcclProcessGroup::watchdog() {
  cudaSetDevice(device_index_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = Clock::now();
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const cudaError_t q = cudaEventQuery((*it)->done);
      if (q == cudaSuccess) {
        (*it)->keep.clear();
        it = in_flight_.erase(it);
        continue;
      }
      if (q != cudaErrorNotReady) {
        fail_locked(detail::cat((*it)->what, " on group '", name(), "' failed: ", cudaGetErrorString(q)));
      } else if (now - (*it)->start > timeout() && !aborted_) {
        fail_locked(detail::cat(
            (*it)->what, " on group '", name(), "' timed out after ", timeout().count(),
            " ms — another rank did not run the matching collective: it exited, crashed, hung, or "
            "issued a different sequence of collectives; see the other ranks' logs"));
      }
      ++it;
    }
    if (!aborted_) {
      for (Lane* lane : {gather_.get(), reduce_.get()}) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(lane->comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          fail_locked(detail::cat("group '", name(), "' ", lane->name, " lane: NCCL reported ",
                                  nccl_error(async, lane->comm)));
          break;
        }
      }
    }
  }
}

WorkPtr NcclProcessGroup::enqueue(Lane& lane, const std::string& what, std::vector<at::Tensor> keep,
                                  const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& launch) {
  // Held across the launch so the watchdog cannot abort the communicator mid-call.
  std::lock_guard<std::mutex> lock(mu_);
  {
    std::lock_guard<std::mutex> health_lock(health_->mu);
    if (!health_->failure.empty()) {
      FSDP_FAIL(what, " on group '", name(), "' was not run: the group failed earlier (",
                health_->failure, ")");
    }
  }
  DeviceGuard guard(device_index_);
  auto op = std::make_shared<InFlight>();
  op->what = detail::cat(what.substr(0, what.find(' ')), " #", lane.issued++, what.substr(what.find(' ')));
  auto* current = current_stream(device_index_);
  cudaEvent_t ready = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(ready, current), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(lane.stream, ready, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);  // released once the wait is satisfied
  nccl_check(launch(lane.comm, lane.stream), detail::cat(op->what, " on group '", name(), "'"), lane.comm);
  cuda_check(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(op->done, lane.stream), "cudaEventRecord");
  op->keep = std::move(keep);
  op->start = Clock::now();
  in_flight_.push_back(op);
  return std::make_shared<NcclWork>(op, health_, device_index_);
}

WorkPtr NcclProcessGroup::do_all_gather(const at::Tensor& out, const at::Tensor& in) {
  if (in.numel() == 0) return completed_work();
  const size_t count = nbytes(in);  // moved as bytes: any dtype
  return enqueue(*gather_, "all_gather (" + desc(in) + ")", {out, in},
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllGather(in.data_ptr(), out.data_ptr(), count, ncclUint8, comm, stream);
                 });
}

WorkPtr NcclProcessGroup::do_broadcast(const at::Tensor& t, int root) {
  if (t.numel() == 0) return completed_work();
  const size_t count = nbytes(t);
  return enqueue(*gather_, detail::cat("broadcast (", desc(t), " from root ", root, ")"), {t},
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   return ncclBroadcast(t.data_ptr(), t.data_ptr(), count, ncclUint8, root, comm, stream);
                 });
}

WorkPtr NcclProcessGroup::do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  if (out.numel() == 0) return completed_work();
  const ncclDataType_t type = reduction_type(in.scalar_type(), name());
  const ncclRedOp_t red = reduction_op(op, size(), name());
  return enqueue(*reduce_, detail::cat("reduce_scatter (", desc(in), ", ", to_string(op), ")"), {out, in},
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                            type, red, comm, stream);
                 });
}

WorkPtr NcclProcessGroup::do_all_reduce(const at::Tensor& t, ReduceOp op) {
  if (t.numel() == 0) return completed_work();
  const ncclDataType_t type = reduction_type(t.scalar_type(), name());
  const ncclRedOp_t red = reduction_op(op, size(), name());
  return enqueue(*reduce_, detail::cat("all_reduce (", desc(t), ", ", to_string(op), ")"), {t},
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type,
                                        red, comm, stream);
                 });
}

void NcclProcessGroup::barrier(std::chrono::milliseconds timeout) {
  barrier_.wait(*store_, rank(), size(), name(), timeout);
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group(const std::vector<int>& ranks,
                                                          const std::string& tag) {
  const NewGroupPlan plan = plan_new_group(ranks, tag);
  auto store = c10::make_intrusive<c10d::PrefixStore>(plan.store_prefix, store_);
  return std::make_shared<NcclProcessGroup>(std::move(store), plan.rank, plan.size, tag, timeout(), device_index_);
}

bool nccl_available() { return true; }

ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                int device_index) {
  FSDP_CHECK(store, "make_nccl_group('", name, "'): needs a store");
  return std::make_shared<NcclProcessGroup>(store, rank, size, name, timeout, device_index);
}

}  // namespace fsdp::comm

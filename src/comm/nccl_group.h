// NCCL process group (private to comm/; built with -DFSDP_WITH_NCCL=ON).
//
// See Note [NCCL lanes]: one communicator and one stream per lane (gather:
// all_gather, broadcast; reduce: reduce_scatter, all_reduce), so lanes may
// interleave differently on different ranks without deadlocking, as with the TCP group.
// Completion is a cudaEvent; Work::wait() makes the caller's current stream
// wait on it — never a host sync. A watchdog thread releases the tensors of
// finished collectives and aborts the communicators when one runs past the
// group's timeout; later waits then throw fsdp::Failure naming group and op.
//
// Differences from the TCP group (contract in process_group.h):
//  - reduce_scatter / all_reduce sums follow NCCL's ring/tree order, not rank
//    order (deterministic for a fixed topology, not bit-equal to a rank-order
//    reference), and bf16/fp16 accumulate in NCCL's own way: reduce in fp32
//    (mixed precision reduce_dtype) when that matters.
//  - int16 and bool move (gather, broadcast) but do not reduce.
#pragma once

#include "fsdp/comm/backends.h"
#include "comm/store_barrier.h"
#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace fsdp::comm {

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Blocks until the communicators are initialised on every rank.
  NcclProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name,
                   std::chrono::milliseconds timeout, int device_index);
  ~NcclProcessGroup() override;

  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index_)); }
  std::string backend() const override { return "nccl"; }
  void barrier(std::chrono::milliseconds timeout) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          const std::string& tag) override;

  struct Lane;      // communicator + stream
  struct InFlight;  // event + tensors of a running collective
  struct Health;    // first failure, shared with the Work handles

 protected:
  WorkPtr do_all_gather(const at::Tensor& out, const at::Tensor& in) override;
  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override;
  WorkPtr do_all_reduce(const at::Tensor& t, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& t, int root) override;

 private:
  // Runs `launch` on `lane`'s stream after the caller's current stream, and
  // returns a Work for it. `keep` stays referenced until the collective ends.
  WorkPtr enqueue(Lane& lane, const std::string& what, std::vector<at::Tensor> keep,
                  const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& launch);
  void watchdog();
  void fail_locked(const std::string& message);  // records the failure, aborts the communicators

  c10::intrusive_ptr<c10d::Store> store_;
  int device_index_;
  std::unique_ptr<Lane> gather_;
  std::unique_ptr<Lane> reduce_;
  StoreBarrier barrier_;

  std::shared_ptr<Health> health_;
  std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<InFlight>> in_flight_;
  bool aborted_ = false;
  bool stop_ = false;
  std::thread watchdog_;  // last: starts after everything else exists
};

}  // namespace fsdp::comm

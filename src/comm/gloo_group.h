// Gloo process group on libgloo's new-style collectives (private to comm/).
//
// See Note [Gloo lanes]: two gloo contexts per group, each driven by its own
// worker thread with a FIFO queue, so an all-gather (gather lane) overlaps a
// reduce-scatter (reduce lane). Only new-style ops (gloo::allgather,
// gloo::alltoall, gloo::broadcast) are used: DESIGN.md measured that mixing
// libgloo's old-style algorithm classes with them on one context hangs, and that
// ReduceScatterHalvingDoubling returns wrong sums on large buffers.
#pragma once

#include "fsdp/comm/backends.h"
#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace fsdp::comm {

class GlooLane;

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Connects both lanes (blocking). `device` may be null only when size == 1.
  GlooProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name,
                   std::chrono::milliseconds timeout,
                   std::shared_ptr<gloo::transport::Device> device);
  // Runs the work already queued on each lane, then joins the lane threads.
  ~GlooProcessGroup() override;

  at::Device device() const override { return at::kCPU; }
  std::string backend() const override { return "gloo"; }
  void barrier(std::chrono::milliseconds timeout) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          const std::string& tag) override;

 protected:
  WorkPtr do_all_gather(const at::Tensor& out, const at::Tensor& in) override;
  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override;
  WorkPtr do_all_reduce(const at::Tensor& t, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& t, int root) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;  // shared with sub-groups
  std::unique_ptr<GlooLane> gather_lane_;            // all_gather, broadcast
  std::unique_ptr<GlooLane> reduce_lane_;            // reduce_scatter, all_reduce
  int64_t barrier_generation_ = 0;
  std::mutex mu_;  // guards barrier_generation_
};

}  // namespace fsdp::comm

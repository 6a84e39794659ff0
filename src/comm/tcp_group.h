// CPU process group on our own TCP transport (private to comm/).
//
// See Note [TCP lanes]: two meshes of connections per group, each driven by
// its own worker thread with a FIFO queue, so an all-gather (gather lane)
// overlaps a reduce-scatter (reduce lane). The collectives are written here
// on tcp::Mesh's ordered byte streams (mesh.h); the contract is
// make_tcp_group's in fsdp/comm/backends.h.
#pragma once

#include "comm/store_barrier.h"
#include "comm/tcp_transport.h"
#include "fsdp/comm/backends.h"
#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

namespace fsdp::comm {

class TcpLane;

class TcpProcessGroup final : public ProcessGroup {
 public:
  // Connects both lanes (blocking). `address` may be null only when size == 1.
  TcpProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::string name,
                  std::chrono::milliseconds timeout, std::shared_ptr<const tcp::ListenAddress> address);
  // Runs the work already queued on each lane, then joins the lane threads.
  ~TcpProcessGroup() override;

  at::Device device() const override { return at::kCPU; }
  std::string backend() const override { return "tcp"; }
  std::string transport() const override { return transport_; }
  void barrier(std::chrono::milliseconds timeout) override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          const std::string& tag) override;

 protected:
  WorkPtr do_all_gather(const at::Tensor& out, const at::Tensor& in) override;
  WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override;
  WorkPtr do_all_reduce(const at::Tensor& t, ReduceOp op) override;
  WorkPtr do_broadcast(const at::Tensor& t, int root) override;
  WorkPtr do_all_to_all(const at::Tensor& out, const at::Tensor& in) override;

 public:
  int64_t wire_bytes_sent() const override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<const tcp::ListenAddress> address_;  // shared with sub-groups
  std::unique_ptr<TcpLane> gather_lane_;               // all_gather, broadcast
  std::unique_ptr<TcpLane> reduce_lane_;               // reduce_scatter, all_reduce
  StoreBarrier barrier_;
  std::string transport_ = "tcp";
};

}  // namespace fsdp::comm

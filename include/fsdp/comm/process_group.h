// Process groups: collectives over flat tensors, with asynchronous handles.
//
// A ProcessGroup knows tensors and ranks, nothing about modules. Every collective
// takes flat, contiguous tensors and returns a Work handle; the call only
// enqueues. Collectives of one kind run in issue order, and every rank of the
// group must issue the same sequence of collectives of each kind.
//
// Lanes. Work is ordered per lane, and lanes run concurrently (the CPU analogue
// of NCCL streams): all_gather and broadcast run on the gather lane;
// reduce_scatter, all_reduce and all_to_all on the reduce lane. FSDP overlaps the next
// unit's all-gather with the previous unit's reduce-scatter this way.
//
// Lifetimes. A Work handle holds references to its tensors until it completes;
// the caller must not read an output, nor write an input, before wait().
// On the CPU (tcp) group, wait() blocks the calling thread; with NCCL it makes the caller's
// current CUDA stream wait on the collective's event (no host sync).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace fsdp::comm {

// How a reduction combines the ranks' values: sum, mean (sum / size), maximum.
enum class ReduceOp { kSum, kAvg, kMax };
// "sum", "avg", "max" (for messages).
const char* to_string(ReduceOp op);

// Bytes moved by this rank's calls, counted on the full logical buffer of each
// collective (the all-gather output, the reduce-scatter input, the all-reduce
// tensor, the broadcast tensor), in the tensors' own dtype. A group of one
// rank counts calls but no bytes: nothing crosses the wire.
struct CommCounters {
  int64_t allgather_bytes = 0;       // all_gather outputs
  int64_t reduce_scatter_bytes = 0;  // reduce_scatter inputs
  int64_t allreduce_bytes = 0;       // all_reduce tensors
  int64_t broadcast_bytes = 0;       // broadcast tensors
  int64_t alltoall_bytes = 0;        // all_to_all inputs
  int64_t allgather_calls = 0;       // all_gather calls
  int64_t reduce_scatter_calls = 0;  // reduce_scatter calls
  int64_t allreduce_calls = 0;       // all_reduce calls
  int64_t broadcast_calls = 0;       // broadcast calls
  int64_t alltoall_calls = 0;        // all_to_all calls
};

// The handle of a collective in flight (every collective is asynchronous).
class Work {
 public:
  virtual ~Work() = default;
  // Blocks (tcp) or orders the current stream after the collective (NCCL).
  // Rethrows the collective's failure as fsdp::Failure naming group and operation.
  virtual void wait() = 0;
  // True once the collective finished (successfully or not). Never blocks.
  virtual bool completed() = 0;
};
// Shared: the issuer and whoever waits may both hold it.
using WorkPtr = std::shared_ptr<Work>;

// A Work that is already done (world size 1, empty tensors).
WorkPtr completed_work();

// A group of ranks that run collectives together: the TCP group on CPU
// (backends.h: make_tcp_group) or NCCL on GPU, made by init_process_group
// (rendezvous.h) and new_group. Collectives are issued in the same order on
// every rank of the group; each returns a Work to wait on.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }  // this process's rank in the group, 0 .. size() - 1
  int size() const { return size_; }  // ranks in the group
  // Human-readable name used in errors ("world", "shard", "replicate", ...).
  const std::string& name() const { return name_; }
  // The device collectives expect tensors on (CPU for tcp, cuda:N for NCCL).
  virtual at::Device device() const = 0;
  virtual std::string backend() const = 0;  // "tcp" or "nccl"
  // How bytes move between this rank and its peers, for logs: backend() unless
  // the backend says more ("tcp, shared memory with 3 of 3 peers").
  virtual std::string transport() const { return backend(); }

  // out: size() * in.numel() elements; rank r's `in` lands in out[r*n, (r+1)*n).
  // `in` may be out's own chunk (in-place). Same dtype and device for both.
  WorkPtr all_gather(const at::Tensor& out, const at::Tensor& in);

  // in: size() * out.numel() elements; out = op over ranks of chunk rank() of in.
  // The sum is taken in rank order 0..size()-1 on every rank (deterministic).
  // `in` is left unchanged.
  WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op);

  // In place, identical bits on every rank afterwards.
  WorkPtr all_reduce(const at::Tensor& t, ReduceOp op);

  // In place: every rank ends with root's values. root is a rank of this group.
  WorkPtr broadcast(const at::Tensor& t, int root);

  // in and out: size() * n elements each, same dtype, not overlapping. Chunk j
  // of `in` goes to rank j; chunk j of `out` is what rank j sent to this rank
  // (chunk rank() is copied locally). Runs on the reduce lane (it carries
  // gradients: the compressed reduce-scatter). The tcp group has it; other
  // backends throw fsdp::UsageError.
  WorkPtr all_to_all(const at::Tensor& out, const at::Tensor& in);

  // Bytes this rank's transport has put on the wire to its peers since the
  // group was made, counted where they leave (the tcp group's meshes: what
  // the sockets and shared-memory rings took), or -1 where the backend cannot
  // tell (NCCL). Read it while no collective is in flight.
  virtual int64_t wire_bytes_sent() const { return -1; }

  // Blocks until every rank of the group arrived. On timeout throws
  // fsdp::Failure naming the group and the ranks that did not arrive.
  virtual void barrier(std::chrono::milliseconds timeout) = 0;

  // A group over `ranks` (ranks of this group, strictly increasing). Every
  // member of `ranks` must call it with the same ranks and tag; non-members
  // must not call it. The tag names the group in errors and keeps the
  // rendezvous keys of different groups apart.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                                  const std::string& tag) = 0;

  // Default timeout of collectives issued on this group.
  std::chrono::milliseconds timeout() const { return timeout_; }

  CommCounters counters() const;  // this rank's traffic on this group since creation or reset_counters()
  void reset_counters();          // counters() back to zero

 protected:
  // For the backends: this process is `rank` of `size`; `name` for errors; `timeout` for collectives.
  ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout);

  // The backends' collectives, with the public wrappers' contracts; arguments are validated
  // and counted by the wrappers.
  virtual WorkPtr do_all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
  // See reduce_scatter.
  virtual WorkPtr do_reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  // See all_reduce.
  virtual WorkPtr do_all_reduce(const at::Tensor& t, ReduceOp op) = 0;
  // See broadcast.
  virtual WorkPtr do_broadcast(const at::Tensor& t, int root) = 0;
  // See all_to_all. The default throws fsdp::UsageError naming the backend.
  virtual WorkPtr do_all_to_all(const at::Tensor& out, const at::Tensor& in);

  // For new_group implementations: checks `ranks` and `tag` against new_group's
  // contract (throws fsdp::UsageError naming this group) and says where the new
  // group stands.
  struct NewGroupPlan {
    int rank;  // this rank's index in `ranks`
    int size;  // ranks.size()
    // "group/<tag>/<r0,r1,...>/<n>": n counts earlier calls with the same tag and
    // ranks, so each call's rendezvous keys are its own.
    std::string store_prefix;
  };
  // See NewGroupPlan.
  NewGroupPlan plan_new_group(const std::vector<int>& ranks, const std::string& tag);

 private:
  int64_t wire_bytes(const at::Tensor& t) const;

  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  struct Counters;
  std::shared_ptr<Counters> counters_;
  std::mutex new_group_mu_;
  std::map<std::string, int> new_group_count_;  // "<tag>/<ranks>" -> plan_new_group calls so far
};

// Shared by the runtime, the engine and the checkpoint code that use one group.
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Two-level layout for HYBRID_SHARD: consecutive blocks of `shard_size` ranks
// form shard groups; ranks with the same position in their block form
// replicate groups. Every rank of `world` must call it.
struct HybridGroups {
  ProcessGroupPtr shard;      // size shard_size
  ProcessGroupPtr replicate;  // size world/shard_size
};
// Builds this rank's HybridGroups (above). Collective over `world`.
HybridGroups make_hybrid_groups(ProcessGroup& world, int shard_size);

}  // namespace fsdp::comm

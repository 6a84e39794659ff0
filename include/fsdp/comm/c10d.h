// The engine over PyTorch's own distributed runtime: a ProcessGroup of ours
// over a c10d::Backend (ProcessGroupGloo, ProcessGroupNCCL, or any backend a
// program already holds). See docs/library.md, "A c10d backend you already have".
//
// Example (examples/c10d_backend/c10d_backend.cpp runs it):
//
//   c10::intrusive_ptr<c10d::Backend> gloo = ...;  // the program's own, e.g. a ProcessGroupGloo
//   fsdp::comm::C10dGroupOptions g;
//   g.store = store;  // the store it was made with: sub-groups (HYBRID, hpZ) need it
//   auto sharded = fsdp::fully_shard(model.ptr(), gloo, fsdp::FsdpOptions{}, g);
//
// Semantics kept (the contract of process_group.h): every collective returns at
// once with a Work; wait() rethrows a failure as fsdp::Failure naming the group
// and the operation (c10d's message follows, without its stack trace).
//  - Lanes (process_group.h): c10d matches collectives by their place in one
//    sequence per backend. With C10dGroupOptions::reduce_backend (a second
//    backend over the same ranks; make_gloo_group makes two) each lane has
//    its own, and lanes may interleave differently on different ranks, as
//    with the TCP group. With one backend, as FSDP2 uses one process group,
//    both lanes share its sequence: every rank must then issue the same
//    sequence of collectives across both lanes, not only within each. The
//    engine does (its schedule is one pure function of the model and the
//    options, issued from one thread); Gloo aborts the process on a mismatch.
//  - On the CPU, a c10d collective runs on the backend's own threads
//    (ProcessGroupGloo: 2) and wait() blocks. On CUDA, wait() is c10d's
//    Work::wait: the caller's current stream waits on the collective's stream
//    (no host sync), the way FSDP2's lanes wait.
//  - Reductions (Note [c10d reductions] in src/comm/c10d_group.cpp): with
//    C10dReductions::kRankOrder (the default on the CPU), reduce_scatter is an
//    alltoall plus a local sum in rank order, and all_reduce an all-gather plus
//    the same sum: bit-identical to our TCP group's results. kBackend uses the
//    backend's own reduce_scatter and allreduce (Gloo's ring: another summation
//    order; the only choice on CUDA).
//  - Data movement (all_gather, broadcast, all_to_all) moves raw bytes, so
//    every dtype of process_group.h moves, int16 included (which Gloo refuses).
//  - Collectives write through views without autograd metadata: the version
//    counters of the caller's tensors stay put (as with the TCP group).
#pragma once

#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::comm {

// How a c10d-backed group reduces (see the header comment).
enum class C10dReductions {
  kRankOrder,  // alltoall / all-gather + a local rank-order sum (CPU only)
  kBackend,    // the backend's reduce_scatter and allreduce
};
const char* to_string(C10dReductions r);  // "rank-order", "backend"

// Makes the c10d backend of a sub-group: `store` is private to it (already
// prefixed), `ranks` are ranks of the parent group (strictly increasing, this
// rank among them), `rank` is this process's index in `ranks`.
using C10dSubgroupFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks, int rank,
    std::chrono::milliseconds timeout)>;

struct C10dGroupOptions {
  std::string name = "world";  // in errors
  // Where the collectives take tensors: nullopt picks cuda:<current device>
  // for a backend named "nccl", the CPU otherwise.
  std::optional<at::Device> device;
  // Default timeout of collectives and barrier(); also set on the backend
  // (Backend::setTimeout, where the backend has it).
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // The store the backend was made with (any prefix of it that the job's
  // ranks share). barrier() uses it (naming the ranks that did not arrive),
  // and new_group makes sub-groups under it. Null: barrier() is the
  // backend's own, and new_group throws fsdp::UsageError.
  c10::intrusive_ptr<c10d::Store> store;
  // nullopt: kRankOrder on the CPU, kBackend on CUDA. kRankOrder on CUDA is a
  // UsageError.
  std::optional<C10dReductions> reductions;
  // The reduce lane's backend (reduce_scatter, all_reduce, all_to_all), over
  // the same ranks; null: the backend carries both lanes (see above).
  c10::intrusive_ptr<c10d::Backend> reduce_backend;
  // How new_group makes a sub-group's backend (one per lane); empty: the
  // lane's own Backend::split (ProcessGroupGloo and ProcessGroupNCCL have it).
  C10dSubgroupFactory make_subgroup;
  // For logs (ProcessGroup::transport()); empty: "c10d <backend name>".
  std::string description;
};

// Our ProcessGroup over `backend` (non-null, already connected: c10d backends
// connect when constructed). backend() is "c10d-" + the backend's name
// ("c10d-gloo", "c10d-nccl"). The group keeps a reference to the backend.
ProcessGroupPtr make_c10d_group(const c10::intrusive_ptr<c10d::Backend>& backend,
                                const C10dGroupOptions& options = {});

}  // namespace fsdp::comm

// fully_shard over a c10d backend the program already holds (PyTorch's
// ProcessGroupGloo, ProcessGroupNCCL, or any c10d::Backend): no second set of
// communicators, rendezvous or timeout policy. The backend becomes the world
// group through comm::make_c10d_group (fsdp/comm/c10d.h says what the engine
// keeps over it and what changes: one backend carries both lanes unless
// group.reduce_backend gives the reduce lane its own; sums in rank order on
// the CPU). examples/c10d_backend runs it; docs/library.md, "A c10d backend
// you already have".
//
//   c10::intrusive_ptr<c10d::Backend> pg = ...;  // e.g. a ProcessGroupGloo over a TCPStore
//   fsdp::comm::C10dGroupOptions g;
//   g.store = store;  // for the sub-groups of HYBRID_SHARD and hpZ; optional otherwise
//   auto sharded = fsdp::fully_shard(model.ptr(), pg, options, g);
#pragma once

#include "fsdp/comm/c10d.h"
#include "fsdp/fsdp.h"

namespace fsdp {

// fully_shard(root, comm::make_c10d_group(backend, group), options): the
// contract of fsdp.h's fully_shard, with the backend's ranks as the world.
inline std::shared_ptr<ShardedModel> fully_shard(const std::shared_ptr<nn::UnitBase>& root,
                                                 const c10::intrusive_ptr<c10d::Backend>& backend,
                                                 const FsdpOptions& options,
                                                 const comm::C10dGroupOptions& group = {}) {
  return fully_shard(root, comm::make_c10d_group(backend, group), options);
}

}  // namespace fsdp

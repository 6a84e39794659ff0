// Concrete process groups, built from a store. Most code calls
// comm::init_process_group (rendezvous.h) instead; these are the building blocks
// it uses, exposed for tools and tests that bring their own store.
#pragma once

#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace fsdp::comm {

// How a Gloo group finds the address its peers connect to.
struct GlooTransportOptions {
  // MASTER_ADDR of the job. Loopback ("127.0.0.1", "localhost", "::1") or empty:
  // bind to 127.0.0.1. Otherwise the interface named by `socket_ifname` if set,
  // else the address this host's name resolves to (as c10d's
  // createDeviceForHostname does).
  std::string master_addr;
  // First entry of GLOO_SOCKET_IFNAME (PyTorch's variable), "" if unset.
  std::string socket_ifname;
  // All ranks on this host: if the hostname does not resolve to a usable
  // address, fall back to 127.0.0.1 instead of failing.
  bool single_node = true;
};

// A Gloo group of `size` ranks. Blocks until every rank connected (each lane's
// full mesh) or `timeout` passed. `store`'s keys must be private to this group
// (wrap it in a c10d::PrefixStore); the group keeps a reference to it for
// barrier() and new_group(). Size 1 never touches the network nor the store.
// Throws fsdp::Failure if the peers cannot be reached.
// Gloo specifics: reduce_scatter and all_reduce sum in rank order 0..W-1
// (bit-identical to a local rank-order sum; bf16/fp16 accumulate in fp32 and
// round once), so results do not depend on timing. Memory: the reduce lane
// keeps one scratch buffer as large as the largest reduce_scatter / all_reduce
// input seen so far, released with the group; all_reduce also allocates
// numel/W (+ padding when W does not divide numel) per call.
// A collective that fails or times out breaks its lane: later collectives on
// that lane fail at once with the first error.
ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                const GlooTransportOptions& transport);

// True when this build has the NCCL group (cmake -DFSDP_WITH_NCCL=ON).
bool nccl_available();

// An NCCL group on CUDA device `device_index`; the NCCL unique id travels
// through `store`. Throws fsdp::UsageError when nccl_available() is false.
ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                int device_index);

// Store-based barrier shared by the backends: rank r sets <prefix>/<r>, then
// waits until all `size` keys exist. On timeout throws fsdp::Failure naming
// `group` and the ranks whose keys are missing. Polls with check(): c10d 1.13's
// wait() leaves the connection out of step after a timeout.
void store_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                   const std::string& group, std::chrono::milliseconds timeout);

}  // namespace fsdp::comm

// Concrete process groups, built from a store. Most code calls
// comm::init_process_group (rendezvous.h) instead; these are the building blocks
// it uses, exposed for tools and tests that bring their own store.
#pragma once

#include "fsdp/comm/c10d.h"
#include "fsdp/comm/process_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace fsdp::comm {

// How a TCP group picks the address its peers connect to. The rules are c10d
// Gloo's, so GLOO_SOCKET_IFNAME keeps the meaning PyTorch users know.
struct TcpTransportOptions {
  // MASTER_ADDR of the job. Loopback ("127.0.0.1", "localhost", "::1") or empty:
  // listen on 127.0.0.1. Otherwise the interface named by `socket_ifname` if set
  // (its first IPv4 address, else its IPv6 one), else the address this host's
  // name resolves to, if a socket can bind it (as c10d's createDeviceForHostname).
  std::string master_addr;
  // First entry of GLOO_SOCKET_IFNAME (PyTorch's variable), "" if unset.
  std::string socket_ifname;
  // All ranks on this host: if the hostname does not resolve to a usable
  // address, fall back to 127.0.0.1 instead of failing.
  bool single_node = true;
  // Ranks on the same host (same boot id and /dev/shm) exchange through a
  // shared-memory segment per lane instead of loopback TCP; ranks on other
  // hosts, and any pair whose segment could not be mapped, through TCP. The
  // results are the same to the bit. See Note [Shared memory] in
  // src/comm/shm_transport.cpp.
  bool shared_memory = true;
};

// The CPU process group (backend() == "tcp"): `size` ranks over our own TCP
// transport, no third-party communication library. Blocks until every rank
// connected (one full mesh of connections per lane) or `timeout` passed.
// `store`'s keys must be private to this group (wrap it in a
// c10d::PrefixStore); the group keeps a reference to it for barrier() and
// new_group(). Size 1 never touches the network nor the store.
// Connecting: each rank listens on an ephemeral port of the address chosen by
// `transport` and publishes it in `store`; a handshake checks group, lane, rank
// and world size on both ends. Throws fsdp::UsageError when a peer was started
// with another world size (naming both), fsdp::Failure when a peer cannot be
// reached in time (naming it).
// Results: reduce_scatter and all_reduce sum in rank order 0..W-1
// (bit-identical to a local rank-order sum; bf16/fp16 accumulate in fp32 and
// round once), so results do not depend on timing; all_reduce leaves identical
// bits on every rank. Memory: the reduce lane keeps grow-only scratch buffers,
// released with the group: one as large as the largest reduce_scatter /
// all_reduce input seen so far, one as large as the largest all_reduce input
// whose numel W does not divide (a padded copy), and two of at most 2 MiB
// (one pipeline segment, and its fp32 accumulator for bf16/fp16 sums).
// Failures: a peer that closes its connection (exit, crash) fails the waiting
// collective at once, naming that rank; a timeout names the ranks whose bytes
// are missing and how many arrived. A collective that fails breaks its lane:
// later collectives on that lane fail at once with the first error, and the
// lane's connections close, so the peers fail at once too.
ProcessGroupPtr make_tcp_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               const std::string& name, std::chrono::milliseconds timeout,
                               const TcpTransportOptions& transport);

// True when this build has the NCCL group (cmake -DFSDP_WITH_NCCL=ON).
bool nccl_available();

// An NCCL group on CUDA device `device_index`; the NCCL unique id travels
// through `store`. Throws fsdp::UsageError when nccl_available() is false.
ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                int device_index);

// PyTorch's Gloo (c10d::ProcessGroupGloo) as our ProcessGroup (c10d.h):
// backend() "c10d-gloo", the CPU. Its device binds the address `transport`
// chooses (the TCP group's rules); its keys live under `store` (private to
// the group, as for make_tcp_group), and its sub-groups are ProcessGroupGloo
// too. Blocks until every rank connected or `timeout` passed (fsdp::Failure
// naming the group). Reductions: C10dReductions (c10d.h); kRankOrder gives
// the TCP group's bits.
ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                const TcpTransportOptions& transport,
                                C10dReductions reductions = C10dReductions::kRankOrder);

// True when this build has PyTorch's ProcessGroupNCCL (cmake -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON).
bool torch_nccl_available();

// PyTorch's NCCL (c10d::ProcessGroupNCCL) as our ProcessGroup on cuda:device_index
// (which must be the current device): backend() "c10d-nccl", the backend's
// own reductions (NCCL's order). Throws fsdp::UsageError when
// torch_nccl_available() is false.
ProcessGroupPtr make_torch_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                      const std::string& name, std::chrono::milliseconds timeout,
                                      int device_index);

}  // namespace fsdp::comm

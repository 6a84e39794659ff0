// PyTorch's process groups by name: make_gloo_group and make_torch_nccl_group
// (fsdp/comm/backends.h), our ProcessGroup over c10d's backends (c10d.h).
#include "comm/c10d_backends.h"

#include "comm/listen_address.h"
#include "fsdp/comm/backends.h"
#include "fsdp/comm/c10d.h"
#include "fsdp/common/error.h"
#include "fsdp/common/internals.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace fsdp::comm {
namespace {

// c10d's first line, without its stack trace.
std::string first_line_of(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  const std::string m = c10 ? c10->what_without_backtrace() : e.what();
  return m.substr(0, m.find('\n'));
}

using MakeBackend = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;

// Our group over two backends made by `make` (`what`, for errors), one per
// lane, each with keys of its own under `store`/`prefix`, apart from the
// group's (barrier, sub-groups); its sub-groups are made the same way. `o`
// says the rest (name, device, reductions, description).
ProcessGroupPtr group_of(const char* what, const char* prefix, const MakeBackend& make,
                         const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, C10dGroupOptions o) {
  auto connect = [what, make](const c10::intrusive_ptr<c10d::Store>& s, int r, int n, std::chrono::milliseconds t,
                              const std::string& group) -> c10::intrusive_ptr<c10d::Backend> {
    try {
      return make(s, r, n, t);
    } catch (const fsdp::Failure&) {
      throw;
    } catch (const std::exception& e) {
      FSDP_FAIL("connecting ", what, " for group '", group, "' (rank ", r, " of ", n, ") failed within ", t.count(),
                " ms: ", first_line_of(e),
                " — check that every rank started and can reach the others; InitOptions::timeout (FSDP_TIMEOUT) sets "
                "this limit");
    }
  };
  o.store = store;
  o.make_subgroup = [connect](const c10::intrusive_ptr<c10d::Store>& s, const std::vector<int>& ranks, int r,
                              std::chrono::milliseconds t) {
    return connect(s, r, static_cast<int>(ranks.size()), t, "sub-group");
  };
  auto lane = [&](const char* which) {
    return connect(c10::make_intrusive<c10d::PrefixStore>(detail::cat(prefix, "/", which), store), rank, size,
                   o.timeout, o.name);
  };
  auto gather = lane("gather");
  o.reduce_backend = lane("reduce");
  return make_c10d_group(gather, o);
}

}  // namespace

ProcessGroupPtr make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::string& name, std::chrono::milliseconds timeout,
                                const TcpTransportOptions& transport, C10dReductions reductions) {
  FSDP_CHECK(size >= 1 && rank >= 0 && rank < size, "make_gloo_group('", name, "'): rank ", rank,
             " must be in [0, ", size, ")");
  FSDP_CHECK(store, "make_gloo_group('", name, "'): needs a store");
  // The TCP group's rules (c10d's own, plus the route to MASTER_ADDR across nodes).
  const tcp::ListenAddress address = tcp::choose_listen_address(transport);
  C10dGroupOptions o;
  o.name = name;
  o.device = at::kCPU;
  o.timeout = timeout;
  o.reductions = reductions;
  o.description = detail::cat("c10d ProcessGroupGloo (LibTorch ", internals::torch_version(), "); address ",
                              address.host, " (", address.how, ")");
  const std::string host = address.host;
  return group_of("c10d ProcessGroupGloo", "c10d-gloo",
                  [host](const c10::intrusive_ptr<c10d::Store>& s, int r, int n, std::chrono::milliseconds t) {
                    return make_gloo_backend(s, r, n, t, host);
                  },
                  store, rank, size, o);
}

#if FSDP_WITH_TORCH_NCCL
bool torch_nccl_available() { return true; }

ProcessGroupPtr make_torch_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                      const std::string& name, std::chrono::milliseconds timeout, int device_index) {
  FSDP_CHECK(store, "make_torch_nccl_group('", name, "'): needs a store");
  C10dGroupOptions o;
  o.name = name;
  o.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  o.timeout = timeout;
  o.reductions = C10dReductions::kBackend;
  o.description = detail::cat("c10d ProcessGroupNCCL (LibTorch ", internals::torch_version(), ") on cuda:",
                              device_index);
  return group_of("c10d ProcessGroupNCCL", "c10d-nccl", make_torch_nccl_backend, store, rank, size, o);
}
#else
bool torch_nccl_available() { return false; }

ProcessGroupPtr make_torch_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int, const std::string& name,
                                      std::chrono::milliseconds, int) {
  FSDP_CHECK(false, "process group '", name,
             "': backend c10d-nccl (PyTorch's ProcessGroupNCCL) is not available in this build — reconfigure with "
             "cmake -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON, or use gloo or tcp (CPU)");
  return nullptr;
}
#endif

}  // namespace fsdp::comm

// Note [Gloo headers]
// LibTorch's ProcessGroupGloo.hpp includes Gloo's own headers, which the
// PyTorch wheel does not ship; Debian's libgloo-dev has them, from a 2022
// snapshot, while libtorch_cpu.so carries the Gloo PyTorch pinned. That is
// safe only where the headers contribute declarations and nothing of Gloo
// is compiled or called from here: ProcessGroupGloo and its Options hold
// Gloo's types behind std::shared_ptr only (their layout does not depend on
// Gloo's), and this file calls only c10d's exported functions (Options'
// constructor, createDeviceForHostname, ProcessGroupGloo's constructor), so
// no inline Gloo function, vtable or type layout of the old headers reaches
// the binary. tests/comm/gloo_abi.py holds libfsdp_comm.a to that: it fails
// if any object of the library defines or references a symbol of Gloo's.
// This is the only file that includes the header, compiled without the
// shared precompiled header.
#include "comm/c10d_backends.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace fsdp::comm {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout,
                                                    const std::string& host) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace fsdp::comm

// The c10d backends made by name (private to comm/). Each lives in a
// translation unit of its own, the only one that includes its c10d header:
// gloo_backend.cpp (ProcessGroupGloo.hpp, which includes Gloo's headers;
// Note [Gloo headers]) and torch_nccl_backend.cpp (ProcessGroupNCCL.hpp,
// CUDA builds only).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace fsdp::comm {

// c10d::ProcessGroupGloo of `size` ranks over `store`, its device bound to
// `host` (a numeric address), collectives timing out after `timeout`.
// Blocks until every rank connected; throws what c10d throws.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int size, std::chrono::milliseconds timeout,
                                                    const std::string& host);

// c10d::ProcessGroupNCCL on the current CUDA device (CUDA builds only).
c10::intrusive_ptr<c10d::Backend> make_torch_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, std::chrono::milliseconds timeout);

}  // namespace fsdp::comm

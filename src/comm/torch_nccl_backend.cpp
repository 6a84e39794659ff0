// PyTorch's ProcessGroupNCCL, made by name (CUDA builds with NCCL only; see
// comm/c10d_backends.h). Its header needs nccl.h, hence a file of its own.
#include "comm/c10d_backends.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace fsdp::comm {

c10::intrusive_ptr<c10d::Backend> make_torch_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                          int size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace fsdp::comm

// Built when FSDP_WITH_NCCL is OFF: the NCCL entry points explain how to get them.
#include "fsdp/comm/backends.h"
#include "fsdp/common/error.h"

namespace fsdp::comm {

bool nccl_available() { return false; }

ProcessGroupPtr make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                const std::string& name, std::chrono::milliseconds, int) {
  FSDP_CHECK(false, "process group '", name,
             "': backend nccl is not available in this build — reconfigure with "
             "cmake -DFSDP_WITH_NCCL=ON (and a CUDA LibTorch), or use the tcp backend (CPU)");
  return nullptr;
}

}  // namespace fsdp::comm

// Every LibTorch-version-dependent call lives here (1.13 from Debian on CPU,
// 2.x from the PyTorch wheel on the GPU machine). Code elsewhere calls these
// functions and never tests TORCH_VERSION_* itself.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#define FSDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fsdp::compat {

// "1.13.1" etc., for logs and --version.
inline const char* torch_version() { return TORCH_VERSION; }

}  // namespace fsdp::compat

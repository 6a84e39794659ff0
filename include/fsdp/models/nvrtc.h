// NVRTC, the CUDA runtime compiler, loaded at run time (no link to it: the
// CPU build and a machine without a GPU load it only when asked), and the
// compilation of one CUDA program to a CUBIN for one architecture. NVRTC
// needs no GPU: CI compiles every kernel for sm_90 with the wheel's NVRTC
// (tests/models/test_kernels_nvrtc.cpp), and a CUDA run compiles them for its
// device (src/models/row_kernels.cpp).
#pragma once

#include <string>
#include <vector>

namespace fsdp::models {

class Nvrtc {
 public:
  // The NVRTC library at `path` (a file, or a soname already loaded in the
  // process, as LibTorch's CUDA build loads libnvrtc.so.<major>), opened once
  // per path and kept for the process. Loads the builtins library that lies
  // beside it first: NVRTC opens it by name at its first compile, and no
  // search path of a fresh machine names the wheel's directory. FsdpError
  // naming the path and dlerror when it cannot be opened or lacks an entry
  // point.
  static const Nvrtc& load(const std::string& path);

  // `source` compiled for sm_<arch> (90 for Hopper) with the options the
  // jiterator uses (C++17, functions device by default): the CUBIN, or empty
  // with *error set to NVRTC's error and log.
  std::vector<char> cubin(const std::string& source, int arch, std::string* error) const;

  // The file the library was loaded from (dladdr of an entry point).
  const std::string& path() const { return path_; }

 private:
  Nvrtc() = default;
  struct Api;
  const Api* api_ = nullptr;
  std::string path_;
};

}  // namespace fsdp::models

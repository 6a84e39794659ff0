// The entry points of a library loaded at run time (dlopen): NVRTC
// (nvrtc.cpp) and the CUDA driver (row_kernels.cpp), which this project
// loads rather than links so that one build runs with or without them.
#pragma once

#include <dlfcn.h>

#include <string>

#include "fsdp/common/error.h"

namespace fsdp::models {

// `*out` = the entry point `name` of the library `handle`; a missing one is an
// error naming `library` (for messages), the entry point and `fix`.
template <typename F>
void bind_symbol(void* handle, const char* name, F* out, const std::string& library, const std::string& fix) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  FSDP_CHECK(*out != nullptr, library, " has no entry point ", name, ": ", fix);
}

}  // namespace fsdp::models

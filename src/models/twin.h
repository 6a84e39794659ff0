// FSDP_TWIN(NAME, code): compiles `code` here (the CPU twin) and keeps its
// text as NAME_code, which CUDA compiles with NVRTC at run time — one text
// for both devices (Note [Kernels and their CPU twins] in kernels.cpp).
#pragma once

#define FSDP_TWIN(NAME, ...) \
  __VA_ARGS__                \
  constexpr const char* NAME##_code = #__VA_ARGS__;

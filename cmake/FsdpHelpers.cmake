# Build helpers shared by every directory.

# Gloo: Debian ships libgloo with a CMake config; the LibTorch inside a PyTorch
# wheel carries Gloo's headers and symbols itself, so nothing extra is linked.
function(fsdp_find_gloo)
  find_package(Gloo CONFIG QUIET)
  if(TARGET gloo)
    set(FSDP_GLOO_LIBS gloo PARENT_SCOPE)
    message(STATUS "fsdp: Gloo from its CMake package")
  else()
    set(FSDP_GLOO_LIBS "" PARENT_SCOPE)
    message(STATUS "fsdp: Gloo expected inside LibTorch")
  endif()
endfunction()

function(fsdp_find_nccl)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME}/include /usr/local/cuda/include /usr/include)
  find_library(NCCL_LIBRARY nccl HINTS $ENV{NCCL_HOME}/lib /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu)
  find_package(CUDAToolkit REQUIRED)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "FSDP_WITH_NCCL=ON but nccl.h / libnccl were not found; set NCCL_HOME")
  endif()
  set(FSDP_NCCL_INCLUDE ${NCCL_INCLUDE_DIR} PARENT_SCOPE)
  set(FSDP_NCCL_LIBS ${NCCL_LIBRARY} CUDA::cudart PARENT_SCOPE)
endfunction()

# fsdp_add_test(NAME SOURCES a.cpp ... LIBS fsdp_libs... [TIMEOUT s] [LABELS l...])
# One gtest binary; each TEST becomes its own CTest test so `ctest -j` spreads them.
function(fsdp_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} fsdp_test_support GTest::gtest)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_precompile_headers(${name} REUSE_FROM fsdp_pch)
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

# fsdp_add_library(NAME SOURCES a.cpp ... [DEPS other_fsdp_libs...])
# One static library per layer (see DESIGN.md); DEPS may only name lower layers.
function(fsdp_add_library name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include
                                     PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${L_DEPS} torch Threads::Threads)
  target_precompile_headers(${name} REUSE_FROM fsdp_pch)
endfunction()

# Development aid: -DFSDP_AREAS="common;comm;fsdp" configures only those
# layers (src/ and tests/). Empty (the default): everything.
set(FSDP_AREAS "" CACHE STRING "Configure only these layers (development); empty: all")
function(fsdp_area dir)
  if(NOT FSDP_AREAS OR dir IN_LIST FSDP_AREAS)
    add_subdirectory(${dir})
  endif()
endfunction()

# FSDP_WITH_CUDA: sets FSDP_CUDA_INCLUDES, the include directories that the
# sources reading FSDP_WITH_CUDA add privately. A CUDA LibTorch brings its
# CUDA headers through the torch target; a CPU-only LibTorch (Debian's) ships
# c10/cuda headers without the generated c10/cuda/impl/cuda_cmake_macros.h, so
# a stand-in is written here: enough to compile the CUDA paths as a check, not
# to link or run them (there is no libc10_cuda to link).
function(fsdp_find_cuda)
  find_package(CUDAToolkit REQUIRED)
  set(includes ${CUDAToolkit_INCLUDE_DIRS})
  find_file(FSDP_C10_CUDA_MACROS c10/cuda/impl/cuda_cmake_macros.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(NOT FSDP_C10_CUDA_MACROS)
    set(shim ${CMAKE_BINARY_DIR}/cuda-compile-check)
    file(WRITE ${shim}/c10/cuda/impl/cuda_cmake_macros.h
         "#pragma once\n// Stand-in written by fsdp-cpp's CMake for compile checks against a CPU-only LibTorch.\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    list(APPEND includes ${shim})
    message(STATUS "fsdp: LibTorch has no CUDA build: CUDA sources compile as a check only (they cannot link)")
  endif()
  set(FSDP_CUDA_INCLUDES ${includes} PARENT_SCOPE)
endfunction()

# LibTorch from the project's Python environment (scripts/venv.sh), as an imported target `fsdp::torch`.
# The installed package (fsdp_cppConfig.cmake) calls the same functions to find LibTorch again in
# the project that uses it.
#
# TorchConfig.cmake is not used: PyPI's Linux wheel is a CUDA build, and its CMake config stops
# ("uses CUDA but I cannot find the CUDA libraries") on any machine without a CUDA toolkit — a
# laptop building for the CPU. The wheel carries everything else itself: headers, libtorch_cpu,
# and for the CUDA build libtorch_cuda with the CUDA runtime headers and libraries and NCCL in its
# nvidia-* packages. Our sources are plain C++ (no .cu files), so no nvcc is needed either.
#
# Where LibTorch is looked for, first match wins (every one names a torch package directory,
# site-packages/torch, or an unpacked libtorch archive, which has the same layout):
#   FSDP_TORCH_DIR   the directory itself (cache variable)
#   Torch_DIR        <dir>/share/cmake/Torch, as find_package(Torch) takes it
#   FSDP_PYTHON      an interpreter whose environment has torch (scripts/build.sh passes the
#                    project's), located without importing it (that takes seconds)
#   FSDP_TORCH_BUILT_DIR  (the installed package only) the LibTorch the package was built against
#   python3 on PATH  (the installed package only) the active Python environment's torch
# Outputs: target `fsdp::torch`; FSDP_TORCH_DIR_FOUND (internal), FSDP_TORCH_VERSION (major.minor);
# with FSDP_WITH_CUDA the CUDA libraries on `fsdp::torch`, and fsdp_find_nccl() finds the wheel's NCCL
# (target `fsdp::nccl`).

set(FSDP_PYTHON "" CACHE FILEPATH "Python of the project's environment (scripts/venv.sh prints it)")
set(FSDP_TORCH_DIR "" CACHE PATH "The torch package directory (site-packages/torch); found from FSDP_PYTHON when empty")

# The torch package directory of `python`'s environment, or "" (why in `err_var`).
function(_fsdp_torch_of_python python out_var err_var)
  execute_process(
    COMMAND "${python}" -c
            "import importlib.util, os; s = importlib.util.find_spec('torch'); print(os.path.dirname(s.origin) if s else '')"
    OUTPUT_VARIABLE dir ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT dir)
    string(STRIP "${err}" err)
    set(${out_var} "" PARENT_SCOPE)
    set(${err_var} "${python} has no torch package ${err}" PARENT_SCOPE)
  else()
    set(${out_var} "${dir}" PARENT_SCOPE)
  endif()
endfunction()

# Sets `out_var` to the torch directory to use (see the list above), or stops with the list of
# what was tried. `installed`: called from the installed package (two more places to look).
function(_fsdp_locate_torch installed out_var)
  if(FSDP_TORCH_DIR)
    set(${out_var} "${FSDP_TORCH_DIR}" PARENT_SCOPE)
    return()
  endif()
  if(Torch_DIR)
    get_filename_component(dir "${Torch_DIR}/../../.." ABSOLUTE)
    set(${out_var} "${dir}" PARENT_SCOPE)
    return()
  endif()
  if(FSDP_PYTHON)
    _fsdp_torch_of_python("${FSDP_PYTHON}" dir err)
    if(NOT dir)
      message(FATAL_ERROR "fsdp: FSDP_PYTHON: ${err}. Run scripts/venv.sh and pass -DFSDP_PYTHON=<its path>/bin/python.")
    endif()
    set(${out_var} "${dir}" PARENT_SCOPE)
    return()
  endif()
  if(NOT installed)
    message(FATAL_ERROR "fsdp: no LibTorch given. Build with scripts/build.sh (it creates the project's Python "
                        "environment with the pinned PyTorch), or pass -DFSDP_PYTHON=<python with torch 2.x>, "
                        "-DTorch_DIR=<libtorch>/share/cmake/Torch or -DFSDP_TORCH_DIR=<site-packages/torch>.")
  endif()
  set(tried "")
  if(FSDP_TORCH_BUILT_DIR AND EXISTS "${FSDP_TORCH_BUILT_DIR}/lib/libtorch_cpu.so")
    set(${out_var} "${FSDP_TORCH_BUILT_DIR}" PARENT_SCOPE)
    return()
  endif()
  string(APPEND tried "\n  the LibTorch it was built against: ${FSDP_TORCH_BUILT_DIR} (gone)")
  find_program(_fsdp_python3 NAMES python3 python)
  if(_fsdp_python3)
    _fsdp_torch_of_python("${_fsdp_python3}" dir err)
    if(dir)
      set(${out_var} "${dir}" PARENT_SCOPE)
      return()
    endif()
    string(APPEND tried "\n  the Python on PATH: ${err}")
  else()
    string(APPEND tried "\n  the Python on PATH: none")
  endif()
  message(FATAL_ERROR "fsdp_cpp: no LibTorch found. Tried:${tried}\nPass the LibTorch ${FSDP_TORCH_BUILT_VERSION} "
                      "fsdp_cpp was built with: -DTorch_DIR=<libtorch>/share/cmake/Torch, "
                      "-DFSDP_PYTHON=<python with torch ${FSDP_TORCH_BUILT_VERSION}> or "
                      "-DFSDP_TORCH_DIR=<site-packages/torch>, or activate a Python environment that has it.")
endfunction()

# fsdp_find_torch([INSTALLED]): INSTALLED when the installed package calls it.
function(fsdp_find_torch)
  set(installed OFF)
  if(ARGV0 STREQUAL "INSTALLED")
    set(installed ON)
  endif()
  _fsdp_locate_torch(${installed} dir)
  set(need "scripts/venv.sh installs the pinned one")
  if(installed)
    set(need "fsdp_cpp was built against ${FSDP_TORCH_BUILT_VERSION}: point Torch_DIR, FSDP_PYTHON or FSDP_TORCH_DIR at it")
  endif()
  # A build directory follows its environment: after a pin change (a new venv-<hash>) the paths
  # found for the old one are forgotten, not kept pointing at a directory that may be deleted.
  if(DEFINED FSDP_TORCH_DIR_FOUND AND NOT FSDP_TORCH_DIR_FOUND STREQUAL dir)
    foreach(v FSDP_CUDA_RUNTIME_INCLUDE FSDP_CUDA_CCCL_INCLUDE FSDP_CUDART_LIBRARY NCCL_INCLUDE_DIR NCCL_LIBRARY)
      unset(${v} CACHE)
    endforeach()
  endif()
  set(version_h "${dir}/include/torch/headeronly/version.h")  # 2.x's; 1.x had include/torch/version.h
  if(NOT EXISTS "${version_h}" OR NOT EXISTS "${dir}/lib/libtorch_cpu.so")
    message(FATAL_ERROR "fsdp: ${dir} is not a torch 2.x package with LibTorch (no "
                        "include/torch/headeronly/version.h or lib/libtorch_cpu.so); fsdp-cpp needs LibTorch "
                        "2.x (${need}).")
  endif()
  file(STRINGS "${version_h}" major REGEX "#define TORCH_VERSION_MAJOR ")
  file(STRINGS "${version_h}" minor REGEX "#define TORCH_VERSION_MINOR ")
  string(REGEX REPLACE ".* ([0-9]+).*" "\\1" major "${major}")
  string(REGEX REPLACE ".* ([0-9]+).*" "\\1" minor "${minor}")
  set(version "${major}.${minor}")
  if(major LESS 2)
    message(FATAL_ERROR "fsdp: LibTorch ${version} at ${dir}: fsdp-cpp needs LibTorch 2.x (${need}).")
  endif()
  # An installed package checks the version before the CUDA parts: another LibTorch is the error
  # to name, whatever else it lacks.
  if(installed AND NOT version VERSION_EQUAL FSDP_TORCH_BUILT_VERSION)
    message(FATAL_ERROR "fsdp_cpp: LibTorch ${version} at ${dir}, but fsdp_cpp was built against LibTorch "
                        "${FSDP_TORCH_BUILT_VERSION} (${FSDP_TORCH_BUILT_DIR}) and the C++ ABI differs between "
                        "versions. Point Torch_DIR, FSDP_PYTHON or FSDP_TORCH_DIR at LibTorch "
                        "${FSDP_TORCH_BUILT_VERSION}, or rebuild fsdp_cpp against this one.")
  endif()

  add_library(fsdp::torch INTERFACE IMPORTED GLOBAL)
  # The fmt that c10's headers include is the wheel's own (torch/include/fmt), used header-only
  # everywhere so that every translation unit sees one definition.
  set_target_properties(fsdp::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${dir}/include;${dir}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1"
    INTERFACE_LINK_LIBRARIES "${dir}/lib/libtorch_cpu.so;${dir}/lib/libc10.so")
  if(FSDP_WITH_CUDA)
    # The wheel's nvidia-* packages sit beside the torch package directory itself: a Torch_DIR or
    # FSDP_TORCH_DIR reached through a link (an alias of site-packages/torch) must not look beside
    # the link (issue 39: FSDP_CUDA_RUNTIME_INCLUDE-NOTFOUND on a machine without /usr/local/cuda).
    get_filename_component(real_dir "${dir}" REALPATH)
    set(nvidia "${real_dir}/../nvidia")
    # The runtime headers need crt/ (nvidia-cuda-crt) and CCCL's nv/target (nvidia-cuda-cccl),
    # which the torch wheel does not pull in: a directory counts only when it has them.
    set(cuda_include_dirs "${nvidia}/cu13/include" "${nvidia}/cuda_runtime/include" $ENV{CUDA_HOME}/include
                          /usr/local/cuda/include)
    find_path(FSDP_CUDA_RUNTIME_INCLUDE NAMES crt/host_config.h PATHS ${cuda_include_dirs} NO_DEFAULT_PATH)
    find_path(FSDP_CUDA_CCCL_INCLUDE NAMES nv/target PATHS ${cuda_include_dirs} NO_DEFAULT_PATH)
    find_library(FSDP_CUDART_LIBRARY NAMES libcudart.so.13 cudart NAMES_PER_DIR
                 PATHS "${nvidia}/cu13/lib" "${nvidia}/cuda_runtime/lib" $ENV{CUDA_HOME}/lib64 /usr/local/cuda/lib64
                 NO_DEFAULT_PATH)
    if(NOT EXISTS "${dir}/lib/libtorch_cuda.so" OR NOT FSDP_CUDA_RUNTIME_INCLUDE OR NOT FSDP_CUDA_CCCL_INCLUDE
       OR NOT FSDP_CUDART_LIBRARY)
      message(FATAL_ERROR "fsdp: FSDP_WITH_CUDA=ON needs a CUDA build of LibTorch with the CUDA runtime "
                          "(libtorch_cuda.so: ${dir}/lib; crt/host_config.h: ${FSDP_CUDA_RUNTIME_INCLUDE}; "
                          "nv/target: ${FSDP_CUDA_CCCL_INCLUDE}; libcudart: ${FSDP_CUDART_LIBRARY}). "
                          "scripts/venv.sh installs them (nvidia-cuda-crt, nvidia-cuda-cccl); or set CUDA_HOME "
                          "to a CUDA 13 toolkit.")
    endif()
    # libtorch_cuda registers the CUDA kernels from static initializers: nothing references it by
    # symbol, so it must be linked even where --as-needed would drop it.
    set_property(TARGET fsdp::torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${FSDP_CUDA_RUNTIME_INCLUDE}"
                                                                           "${FSDP_CUDA_CCCL_INCLUDE}")
    set_property(TARGET fsdp::torch APPEND PROPERTY INTERFACE_LINK_LIBRARIES
      "-Wl,--no-as-needed" "${dir}/lib/libtorch_cuda.so" "-Wl,--as-needed" "${dir}/lib/libc10_cuda.so"
      "${FSDP_CUDART_LIBRARY}")
  endif()
  set(FSDP_TORCH_DIR_FOUND "${dir}" CACHE INTERNAL "The torch package directory in use")
  set(FSDP_TORCH_VERSION "${version}" PARENT_SCOPE)
  message(STATUS "fsdp: LibTorch ${version} from ${dir}")
endfunction()

# NCCL from the wheel's nvidia-nccl package (or NCCL_HOME / a CUDA toolkit): target fsdp::nccl, and
# FSDP_NCCL_INCLUDE (nccl.h's directory, for the sources that include it).
function(fsdp_find_nccl)
  get_filename_component(real_dir "${FSDP_TORCH_DIR_FOUND}" REALPATH)  # as fsdp_find_torch: beside the real one
  set(nvidia "${real_dir}/../nvidia")
  find_path(NCCL_INCLUDE_DIR nccl.h
            PATHS "${nvidia}/nccl/include" $ENV{NCCL_HOME}/include $ENV{CUDA_HOME}/include /usr/local/cuda/include
            NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
               PATHS "${nvidia}/nccl/lib" $ENV{NCCL_HOME}/lib $ENV{CUDA_HOME}/lib64 /usr/local/cuda/lib64
               NO_DEFAULT_PATH)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "fsdp: FSDP_WITH_NCCL=ON but nccl.h / libnccl were not found (looked in the wheel's "
                        "${nvidia}/nccl, NCCL_HOME, CUDA_HOME); set NCCL_HOME")
  endif()
  # The library on an imported target, so that the installed package names the target and finds
  # NCCL again where it is used, instead of recording this machine's path.
  add_library(fsdp::nccl INTERFACE IMPORTED GLOBAL)
  set_target_properties(fsdp::nccl PROPERTIES INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}")
  set(FSDP_NCCL_INCLUDE ${NCCL_INCLUDE_DIR} PARENT_SCOPE)
  message(STATUS "fsdp: NCCL ${NCCL_LIBRARY} (${NCCL_INCLUDE_DIR}/nccl.h)")
endfunction()

#!/usr/bin/env bash
# The GPU build and its test suite, in one call on a machine with a GPU,
# PyTorch 2.x (its LibTorch and CMake config), nvcc, NCCL, cmake and ninja:
# nothing is installed or downloaded. Configures build-gpu/ against the
# LibTorch inside the installed PyTorch with CUDA and NCCL on (sm_90 unless
# CUDA_ARCH says otherwise), builds, and runs the test suite.
#
#   scripts/gpu.sh                # configure, build, test
#   scripts/gpu.sh --build-only   # configure and build (bench/gpu/run.sh uses this)
#   scripts/gpu.sh -R Parity      # extra arguments go to ctest
#
# NCCL: NCCL_HOME if set, else the nvidia-nccl package inside the Python
# environment, else the CUDA toolkit's own copy.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FSDP_GPU_BUILD_DIR:-build-gpu}
build_only=0
if [[ ${1:-} == --build-only ]]; then build_only=1; shift; fi

PYTHON=$(scripts/torch-python.sh)  # the Python that imports torch
die() { echo "scripts/gpu.sh: $*" >&2; exit 2; }
command -v nvcc > /dev/null || [[ -x ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc ]] || die "no nvcc: set CUDA_HOME to the CUDA toolkit"
torch_cmake=$("$PYTHON" -c 'import torch, torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
  die "$PYTHON cannot import torch: this script builds against the LibTorch inside PyTorch 2.x"
torch_info=$("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())')
read -r torch_version torch_cuda cuda_ok <<< "$torch_info"
[[ $torch_cuda != None ]] || die "PyTorch $torch_version is a CPU build; the GPU build needs a CUDA PyTorch"
torch_root=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
[[ -f $torch_root/include/gloo/algorithm.h ]] ||
  echo "scripts/gpu.sh: warning: no Gloo headers under $torch_root/include; the CPU process groups need them" >&2

if [[ -z ${NCCL_HOME:-} ]]; then
  nccl_py=$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null || true)
  if [[ -n $nccl_py && -f $nccl_py/include/nccl.h ]]; then
    export NCCL_HOME=$nccl_py
    # The wheel ships libnccl.so.2 only: give the linker the name it looks for.
    if [[ ! -e $NCCL_HOME/lib/libnccl.so && -e $NCCL_HOME/lib/libnccl.so.2 ]]; then
      mkdir -p "$BUILD_DIR/nccl-lib"
      ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$BUILD_DIR/nccl-lib/libnccl.so"
      export LIBRARY_PATH="$PWD/$BUILD_DIR/nccl-lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
      nccl_lib_hint="-DNCCL_LIBRARY=$PWD/$BUILD_DIR/nccl-lib/libnccl.so"
    fi
  fi
fi
echo "scripts/gpu.sh: PyTorch $torch_version (CUDA $torch_cuda, device available: $cuda_ok), NCCL from ${NCCL_HOME:-the CUDA toolkit}"

arch=${CUDA_ARCH:-90}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$((arch / 10)).$((arch % 10))}
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_cmake" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON ${nccl_lib_hint:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
[[ $build_only -eq 1 ]] && exit 0

[[ $cuda_ok == True ]] || die "PyTorch sees no CUDA device: the build is done, the tests need a GPU"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"

#!/usr/bin/env bash
# The GPU build and its test suite, in one call on a machine with a GPU and
# the build's dependencies (scripts/deps.sh's headers; a machine without them,
# like a lent GPU machine, runs the GPU pack instead: scripts/gpu-pack.sh),
# a CUDA PyTorch 2.x (its LibTorch, CUDA runtime and NCCL packages), cmake and
# ninja: nothing is installed or downloaded. Configures build-gpu/ against the
# LibTorch inside that PyTorch with CUDA and NCCL on (the same configuration
# scripts/test.sh links on every CI run), builds, and runs the test suite.
#
#   scripts/gpu.sh                # configure, build, test
#   scripts/gpu.sh --build-only   # configure and build (bench/gpu/run.sh uses this)
#   scripts/gpu.sh -R Parity      # extra arguments go to ctest
#
# NCCL: the nvidia-nccl package beside torch, else NCCL_HOME, else the CUDA
# toolkit's own copy (cmake/FsdpTorch.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FSDP_GPU_BUILD_DIR:-build-gpu}
build_only=0
if [[ ${1:-} == --build-only ]]; then build_only=1; shift; fi

PYTHON=$(scripts/torch-python.sh)  # the Python that imports torch
die() { echo "scripts/gpu.sh: $*" >&2; exit 2; }
torch_info=$("$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>/dev/null) ||
  die "$PYTHON cannot import torch: this script builds against the LibTorch inside PyTorch 2.x (set PYTHON)"
read -r torch_version torch_cuda cuda_ok <<< "$torch_info"
[[ $torch_cuda != None ]] || die "PyTorch $torch_version is a CPU build; the GPU build needs a CUDA PyTorch"
echo "scripts/gpu.sh: PyTorch $torch_version (CUDA $torch_cuda, device available: $cuda_ok)"

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFSDP_PYTHON="$PYTHON" \
  -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON
cmake --build "$BUILD_DIR" -j "$(nproc)"
[[ $build_only -eq 1 ]] && exit 0

[[ $cuda_ok == True ]] || die "PyTorch sees no CUDA device: the build is done, the tests need a GPU"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"

#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite.
# Extra arguments go to ctest (e.g. -R Parity).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh

# The CUDA paths — the NCCL process group (direct nccl.h) and the device
# layer — must compile wherever a CUDA toolkit is installed, even with this
# CPU-only LibTorch; they link and run only in a GPU build (scripts/gpu.sh).
# Only these two sources read FSDP_WITH_CUDA / FSDP_WITH_NCCL; every other
# source compiles the same as in the CPU build above.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ -f "$CUDA_HOME/include/nccl.h" && -x "$CUDA_HOME/bin/nvcc" ]]; then
  echo "test.sh: compiling the CUDA paths (NCCL group, device layer) against $CUDA_HOME"
  cmake -S . -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_WITH_NCCL=ON -DFSDP_WITH_CUDA=ON \
    -DCUDAToolkit_ROOT="$CUDA_HOME" -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-nccl -j "$(nproc)" \
    --target src/comm/CMakeFiles/fsdp_comm.dir/nccl_group.cpp.o src/common/CMakeFiles/fsdp_common.dir/device.cpp.o
else
  echo "test.sh: no CUDA toolkit with nccl.h under $CUDA_HOME: CUDA compile check skipped"
fi

cd "${FSDP_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"

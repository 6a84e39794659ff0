#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite.
# Extra arguments go to ctest (e.g. -R Parity).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh

# The NCCL process group (direct nccl.h) must compile wherever a CUDA toolkit
# is installed, even with this CPU-only LibTorch; it runs only on a GPU machine.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ -f "$CUDA_HOME/include/nccl.h" ]]; then
  echo "test.sh: compiling the NCCL process group against $CUDA_HOME"
  cmake -S . -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_WITH_NCCL=ON \
    -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_BENCH=OFF >/dev/null
  cmake --build build-nccl --target fsdp_comm -j "$(nproc)"
else
  echo "test.sh: no CUDA toolkit with nccl.h under $CUDA_HOME: NCCL compile check skipped"
fi

cd "${FSDP_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"

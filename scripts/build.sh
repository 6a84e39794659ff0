#!/usr/bin/env bash
# Configures and builds fsdp-cpp into ./build (Release, Ninja).
# Extra arguments go to cmake's configure step, e.g. -DFSDP_WITH_NCCL=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FSDP_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"

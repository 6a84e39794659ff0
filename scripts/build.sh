#!/usr/bin/env bash
# Configures and builds fsdp-cpp into ./build (Release, Ninja) against the LibTorch of the
# project's Python environment (scripts/venv.sh creates it if needed).
# Extra arguments go to cmake's configure step, e.g. -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FSDP_BUILD_DIR:-build}
VENV=$(scripts/venv.sh)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_PYTHON="$VENV/bin/python" "$@" > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"

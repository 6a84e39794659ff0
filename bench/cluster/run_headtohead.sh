#!/usr/bin/env bash
# fsdp-train against PyTorch FSDP2 (gloo) on the emulated cluster: network namespaces joined by
# links shaped with tc tbf, 2x1, 4x1 and 2x2 processes, 150 and 1000 Mbit/s, fp32 and bf16,
# FULL and HYBRID, and fsdp-train's compressed collectives (how: bench/cluster/headtohead.py).
# About 25 minutes on 2 quiet cores; needs root.
#
#   bench/cluster/run_headtohead.sh [--rows NAME,...] [--steps 4] [--warmup 2] [--busy 0,2,4] [--no-record]
#
# Builds fsdp-train and peer_batches in $FSDP_BUILD_DIR (default build/, configured by
# scripts/build.sh). Appends the table to bench/RESULTS.md unless --no-record.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${FSDP_BUILD_DIR:-build}
record=(--record)
pass=()
for arg in "$@"; do
  if [[ "$arg" == --no-record ]]; then record=(); else pass+=("$arg"); fi
done
cmake --build "$BUILD" -j "$(nproc)" --target fsdp-train peer_batches > /dev/null
PY=$(scripts/venv.sh)/bin/python
exec "$PY" bench/cluster/headtohead.py --build "$BUILD" "${record[@]}" \
  --command "bench/cluster/run_headtohead.sh $*" "${pass[@]}"

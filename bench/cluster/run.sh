#!/usr/bin/env bash
# The step-time model (fsdp-inspect --estimate) against measured multi-node runs on the
# emulated cluster: 13 configurations (1-4 nodes, FULL_SHARD / SHARD_GRAD_OP / HYBRID,
# fp32 / bf16, with and without activation checkpointing, int8 / bf16 wire formats,
# 1000 and 150 Mbit/s links).
# Each is calibrated, predicted and measured on its own fresh cluster (how:
# bench/cluster/estimate_vs_measured.py). About 6 minutes on 2 quiet cores; needs root.
#
#   bench/cluster/run.sh [--configs NAME,...] [--steps 8] [--rounds 3] [--no-record]
#
# Builds fsdp-train and fsdp-inspect in $FSDP_BUILD_DIR (default build/, configured by
# scripts/build.sh). Appends the table to bench/RESULTS.md unless --no-record.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${FSDP_BUILD_DIR:-build}
record=(--record)
pass=()
for arg in "$@"; do
  if [[ "$arg" == --no-record ]]; then record=(); else pass+=("$arg"); fi
done
cmake --build "$BUILD" -j "$(nproc)" --target fsdp-train fsdp-inspect > /dev/null
PY=$(scripts/venv.sh)/bin/python
exec "$PY" bench/cluster/estimate_vs_measured.py --train "$BUILD/apps/fsdp-train" \
  --inspect "$BUILD/apps/fsdp-inspect" "${record[@]}" --command "bench/cluster/run.sh $*" "${pass[@]}"

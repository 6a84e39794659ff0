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
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
cluster_bench_setup "fsdp-train peer_batches" "$@"
exec "$PY" bench/cluster/headtohead.py --build "$BUILD" "${record[@]}" \
  --command "bench/cluster/run_headtohead.sh $*" "${pass[@]}"

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
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
cluster_bench_setup "fsdp-train fsdp-inspect" "$@"
exec "$PY" bench/cluster/estimate_vs_measured.py --train "$BUILD/apps/fsdp-train" \
  --inspect "$BUILD/apps/fsdp-inspect" "${record[@]}" --command "bench/cluster/run.sh $*" "${pass[@]}"

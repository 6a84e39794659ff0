#!/usr/bin/env bash
# README command 1: install dependencies, build, prepare the embedded corpus
# (Debian's fortunes, converted to JSON lines) and train the `tiny` Llama with
# FULL_SHARD on 2 local CPU processes, printing the training log.
# Extra arguments go to fsdp-train (e.g. --max-steps 100 --sharding hybrid).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
scripts/prepare_data.sh
exec build/apps/fsdp-train --model tiny --data build/data/corpus.jsonl --nproc-per-node 2 \
  --seq-len 128 --batch-size 8 --lr 1e-3 --warmup-steps 20 --min-lr 1e-4 --max-steps 300 --log-every 10 \
  --metrics-file build/demo-metrics.jsonl "$@"

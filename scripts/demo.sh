#!/usr/bin/env bash
# README command 1: install dependencies, build, prepare the embedded corpus
# (Debian's fortunes, converted to JSON lines) and its SentencePiece tokenizer,
# and train the `tiny` Llama with FULL_SHARD on 2 local CPU processes (a few
# minutes on 2 cores), printing the training log:
#  - evaluation on the held-out split every 100 steps ("Eval Loss: X");
#  - sharded checkpoints every 100 steps in build/demo-ckpt (the newest 2 kept);
#    running the demo again resumes from the newest one (after a finished run
#    there is nothing left to train; delete build/demo-ckpt to start over), and
#    Ctrl-C or SIGTERM stops after the current step with a checkpoint;
#  - the final weights as Hugging Face safetensors + config.json +
#    tokenizer.model in build/demo-hf;
#  - what to look at afterwards: TensorBoard event files in build/demo-tb
#    (tensorboard --logdir build/demo-tb), a timeline of steps 20..22 on both
#    ranks in build/demo-trace.json (ui.perfetto.dev or chrome://tracing), the
#    metrics in build/demo-metrics.jsonl, the effective configuration beside
#    them (build/demo-metrics.config.toml), and PNG charts of loss, throughput
#    and memory in build/demo-plots.
# Extra arguments go to fsdp-train (e.g. --max-steps 100 --sharding hybrid).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
scripts/prepare_data.sh
build/apps/fsdp-train --model tiny --data build/data/corpus.jsonl --tokenizer build/data/tokenizer.model \
  --val-data build/data/corpus.val.jsonl --eval-every 100 \
  --nproc-per-node 2 --seq-len 128 --batch-size 8 --lr 1e-3 --warmup-steps 20 --min-lr 1e-4 --max-steps 300 \
  --log-every 10 --metrics-file build/demo-metrics.jsonl \
  --checkpoint-dir build/demo-ckpt --checkpoint-every 100 --keep-last 2 --resume \
  --tensorboard build/demo-tb --profile-steps 20:23 --profile-file build/demo-trace.json \
  --export-hf build/demo-hf "$@"
"$(scripts/venv.sh)/bin/python" scripts/plot_metrics.py build/demo-metrics.jsonl --out build/demo-plots

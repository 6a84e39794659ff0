#!/usr/bin/env bash
# Head-to-head on one GPU, in one call: fsdp-train (a) against PyTorch FSDP (b)
# and FSDP2 (c), each training Hugging Face-shaped Llama 3.2 1B on the same
# random tokens at world size 1, bf16, seq 2048, activation checkpointing off
# and on; then the FSDP tutorial MLP (8 x Linear 20480) with and without CPU
# offload. Prints tokens/s, MFU (against the bf16 matmul rate measured in the
# same call) and peak device memory, with the ratios of (a) to (b) and (c),
# and appends the table to bench/RESULTS.md with the command, date and card.
#
#   bench/gpu/run.sh [--model llama3.2-1b] [--seq-len 2048] [--batch-size 8]
#                    [--ckpt-batch-size 16] [--steps 10] [--warmup 3]
#                    [--mlp-width 20480] [--mlp-batch-size 8] [--only a,b,c,mlp]
#   bench/gpu/run.sh --dry-run   # CPU, tiny sizes, nothing recorded
#
# GPU: uses the CUDA build in build-gpu/, building it with scripts/gpu.sh
# --build-only when it is missing. (b) and (c) need PyTorch 2.x with
# Hugging Face transformers (FSDP2: PyTorch >= 2.4).
# --dry-run: the CPU build in build/, the `tiny` preset, a few steps: checks
# the harness end to end on a machine without a GPU. (b) and (c) run there
# only where transformers is installed; otherwise their rows say why not.
# Exit status: 0 when every row produced a result, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."

dry=0
model=llama3.2-1b seq=2048 batch=8 ckpt_batch=16 steps=10 warmup=3
mlp_width=20480 mlp_batch=8 only="a,b,c,mlp"
args=("$@")
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1; model=tiny seq=64 batch=2 ckpt_batch=2 steps=2 warmup=1 mlp_width=256 mlp_batch=4; shift ;;
    --model) model=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --ckpt-batch-size) ckpt_batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --mlp-width) mlp_width=$2; shift 2 ;;
    --mlp-batch-size) mlp_batch=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "bench/gpu/run.sh: unknown argument '$1' (see the header of bench/gpu/run.sh)" >&2; exit 2 ;;
  esac
done
PYTHON=$(scripts/torch-python.sh)  # the Python that imports torch
wants() { [[ ",$only," == *",$1,"* ]]; }

if [[ $dry -eq 1 ]]; then
  device=cpu build=${FSDP_BUILD_DIR:-build}
  [[ -x $build/bench/gpu/bench_mlp ]] || { scripts/deps.sh; scripts/build.sh; }
else
  device=cuda build=${FSDP_GPU_BUILD_DIR:-build-gpu}
  [[ -x $build/apps/fsdp-train && -x $build/bench/gpu/bench_mlp ]] || scripts/gpu.sh --build-only
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results.jsonl
: > "$results"

# A row that failed: its reason (the last line of its error output) in place of numbers.
failed_row() {  # row kind ckpt logfile
  "$PYTHON" -c 'import json,sys; lines=[l.strip() for l in open(sys.argv[4], errors="replace") if l.strip()];
print(json.dumps({"row": sys.argv[1], "kind": sys.argv[2], "ckpt": sys.argv[3] == "1",
                  "error": (lines[-1] if lines else "no output")[:200]}))' "$@" >> "$results"
}

echo "bench/gpu/run.sh: $model, seq $seq, batch $batch (checkpointing: $ckpt_batch), $warmup warm-up + $steps measured steps, device $device"
"$build/apps/fsdp-inspect" --model "$model" --write-hf-config "$work/config.json" > /dev/null
"$PYTHON" bench/gpu/matmul_peak.py --device "$device" $([[ $dry -eq 1 ]] && echo "--n 512 --iters 5") > "$work/peak.json"
vocab=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$work/config.json")

# Random token ids (uint32, below the vocabulary size): enough for the largest run.
ntok=$(( (warmup + steps) * (batch > ckpt_batch ? batch : ckpt_batch) * seq + seq + 1 ))
"$PYTHON" - "$work/tokens.bin" "$ntok" "$vocab" <<'PY'
import array, random, sys
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1234)
a = array.array("I", (rng.randrange(vocab) for _ in range(n)))
if sys.byteorder != "little":
    a.byteswap()
open(path, "wb").write(a.tobytes())
PY

for ckpt in 0 1; do
  b=$([[ $ckpt -eq 1 ]] && echo "$ckpt_batch" || echo "$batch")
  ac_flag=$([[ $ckpt -eq 1 ]] && echo "--activation-checkpointing" || true)
  if wants a; then
    rm -f "$work/metrics.jsonl"
    # Sequential windows (no shuffle effect on speed); bf16 params and bf16
    # reduction, as the recipes' MixedPrecision.
    if "$build/apps/fsdp-train" --model "$model" --data "$work/tokens.bin" --token-dtype u32 --seq-len "$seq" \
        --batch-size "$b" --max-steps $((warmup + steps)) --log-every 1 --metrics-file "$work/metrics.jsonl" \
        --mixed-precision bf16 --reduce-dtype bf16 --lr 1e-4 --warmup-steps 1 --device "$device" $ac_flag \
        > "$work/a.log" 2>&1; then
      "$PYTHON" bench/gpu/report.py train-row --metrics "$work/metrics.jsonl" --row "(a) fsdp-train" \
        $([[ $ckpt -eq 1 ]] && echo --ckpt) --batch-size "$b" --seq-len "$seq" --warmup "$warmup" >> "$results"
    else
      failed_row "(a) fsdp-train" llama "$ckpt" "$work/a.log"
    fi
  fi
  for impl in fsdp1 fsdp2; do
    letter=$([[ $impl == fsdp1 ]] && echo b || echo c)
    name=$([[ $impl == fsdp1 ]] && echo "(b) PyTorch FSDP" || echo "(c) PyTorch FSDP2")
    wants "$letter" || continue
    if ! "$PYTHON" bench/gpu/hf_fsdp.py --impl "$impl" --row "$name" --config "$work/config.json" \
        --tokens "$work/tokens.bin" --seq-len "$seq" --batch-size "$b" --steps "$steps" --warmup "$warmup" \
        --device "$device" $ac_flag >> "$results" 2> "$work/$letter.log"; then
      failed_row "$name" llama "$ckpt" "$work/$letter.log"
    fi
  done
done

if wants mlp; then
  for offload in "" --cpu-offload; do
    if ! "$build/bench/gpu/bench_mlp" --device "$device" --width "$mlp_width" --batch-size "$mlp_batch" \
        --precision "$([[ $device == cuda ]] && echo bf16 || echo fp32)" --steps "$steps" --warmup "$warmup" \
        $offload >> "$results" 2> "$work/mlp.log"; then
      failed_row "MLP ${offload:-on-device}" mlp 0 "$work/mlp.log"
    fi
  done
fi

status=0
"$PYTHON" bench/gpu/report.py table --results "$results" --config "$work/config.json" --seq-len "$seq" \
  --peak "$work/peak.json" | tee "$work/table.md" || status=$?

if [[ $dry -eq 0 ]]; then
  {
    echo
    echo "## GPU head-to-head — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Command: \`bench/gpu/run.sh ${args[*]}\`"
    echo "Card: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo unknown);" \
         "PyTorch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    echo
    cat "$work/table.md"
  } >> bench/RESULTS.md
  echo "bench/gpu/run.sh: appended to bench/RESULTS.md"
fi
exit $status

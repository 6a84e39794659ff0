#!/usr/bin/env bash
# Head-to-head on one GPU: fsdp-train (a) against PyTorch FSDP (b), FSDP2
# (c) and FSDP2 with torch.compile per decoder layer (d, torchtitan's way),
# each training the Hugging Face-shaped Llama 3.2 1B on the same random
# tokens at world size 1, bf16, seq 2048, activation checkpointing off and on
# (on: fsdp-train's default --ac-policy tail, then full and selective; off:
# also --kernels fused, that with --attention-backend cudnn, and with
# --fp8-linear rowwise, labelled FP8);
# then the FSDP tutorial MLP (8 x Linear 20480) with and without CPU offload.
# Prints tokens/s, MFU (against the bf16 matmul rate measured in the same
# call) and peak device memory (each side's peak after its setup), with the
# ratios of (a) to (b), (c) and (d).
#
# The order, so that a call cut short still has the main ratio, (a) against
# FSDP2 eager measured in the same call: (c) then (a) without checkpointing,
# the same with it; then (d) off and on (a machine that cannot compile says
# why in the row, and the table cites torchtitan's published gain
# of compile instead); (b) off and on; the further rows of (a); then (c)
# again, off and on, so the two eager FSDP2 rows bound the drift of every
# Llama row between them; the MLP last. (d)'s warm-up steps absorb the
# compilation (its row's note says how long it took). A --budget-s too short
# for every row stops the last ones: the MLP, then the drift's bound.
#
#   bench/gpu/run.sh [--bin DIR] [--out DIR] [--long] [--model llama3.2-1b] [--seq-len 2048]
#                    [--batch-size 4] [--ckpt-batch-size 8] [--steps 5] [--warmup 2]
#                    [--mlp-width 20480] [--mlp-batch-size 8] [--only a,b,c,d,mlp] [--run-timeout 150]
#                    [--budget-s SECONDS] [--clip-grad 1.0]
#   bench/gpu/run.sh --dry-run   # CPU, tiny sizes
#
# Sizes: the defaults fit an 80 GB card on both sides (the peers upcast all
# logits to fp32 for the loss: batch x 2048 x 128,256 x 4 bytes, 4.2 GB at
# batch 4, and as much again in the log-softmax; estimated, not measured);
# --long measures longer (10 steps after 3 warm-up) at the same batches and
# adds a row of (a) at twice the checkpointed batch, where fsdp-train may fit
# what the peers do not (its loss never holds the logits), with the MLP at
# width 8192 (537M parameters: its offloaded run pins 9 GB of host state,
# not the 54 GB of width 20480).
#
# The same training step on every side: bf16 parameters and reductions,
# AdamW with the fused kernel (fsdp-train's default; torch.optim.AdamW with
# fused=True for the peers), the gradient norm clipped to --clip-grad on
# every side (0: off on every side), the model's own loss.
#
# --bin DIR: fsdp-train, fsdp-inspect and bench_mlp are in DIR (the GPU pack,
#   scripts/gpu-pack.sh); otherwise the build tree's: build-gpu/ (built by
#   scripts/gpu.sh --build-only when missing), build/ with --dry-run.
# --out DIR: where the results stay: bench.log (every run's output, in
#   order), results.jsonl (one line per run) and DIR/table.md, the last two
#   rewritten after every run, so a call cut short keeps what it measured.
#   The card's measured rates also become DIR/cluster.json (docs/estimate.md:
#   fsdp-inspect --estimate --cluster DIR/cluster.json), and every row of (a)
#   is estimated from it with the row's own flags (--ac-policy, --kernels,
#   --fp8-linear; the cuDNN row with cuDNN's attention rate, where measured)
#   just before it runs: the estimate in bench.log (its text and its line of
#   the table's estimates), and the table's note beside the row gives
#   predicted / measured. No other file: the GPU pack's OUT holds at most 8.
#   DIR may exist, but must not hold results.jsonl or DIR/table.md; bench.log is
#   appended to (the GPU pack's run.sh logs its own lines there too).
#   Default: a new folder under bench/gpu/out/. Nothing else is written
#   outside a temporary folder, which is removed.
# --budget-s SECONDS: the whole call's time: each run gets --run-timeout or
#   what is left of the budget (less a reserve for the table), whichever is
#   less; a run that would get under 15 s is not started, and its row says so.
#   Each run also gets FSDP_TIMEOUT, unless set, of a third of its limit, so a
#   hung collective is named in bench.log before the run is stopped.
# --dry-run: the CPU, the `tiny` preset, a few steps: the harness end to end on
#   a machine without a GPU: (b), (c) and (d) run there on gloo (FSDP1 is given
#   the CPU as its device, activation checkpointing included); (d) compiles
#   with inductor's C++ backend (about a minute a row on 2 busy cores), or,
#   without a C++ compiler, its rows say so.
# The Python is $PYTHON, else the one that imports torch (scripts/torch-python.sh
# in the checkout; python3 in the pack).
# Exit status: 0 when every row produced a result, 1 otherwise, 2 usage.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

dry=0 long=0 bin="" out=""
model=llama3.2-1b seq=2048 batch=4 ckpt_batch=8 steps=5 warmup=2
mlp_width=20480 mlp_batch=8 only="a,b,c,d,mlp" run_timeout=150 budget=0 clip=1.0
args=("$@")
usage() { echo "bench/gpu/run.sh: $*; see the header of bench/gpu/run.sh" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  [[ $1 == --dry-run || $1 == --long || $# -ge 2 ]] || usage "$1 needs a value"
  case "$1" in
    --dry-run) dry=1; model=tiny seq=64 batch=2 ckpt_batch=2 steps=2 warmup=1 mlp_width=256 mlp_batch=4; shift ;;
    --long) long=1; steps=10 warmup=3 mlp_width=8192; shift ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --ckpt-batch-size) ckpt_batch=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --mlp-width) mlp_width=$2; shift 2 ;;
    --mlp-batch-size) mlp_batch=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --run-timeout) run_timeout=$2; shift 2 ;;
    --budget-s) budget=$2; shift 2 ;;
    --clip-grad) clip=$2; shift 2 ;;
    *) usage "unknown argument '$1'" ;;
  esac
done
for n in "$seq" "$batch" "$ckpt_batch" "$steps" "$warmup" "$mlp_width" "$mlp_batch" "$run_timeout"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || usage "'$n' is not a positive whole number"
done
[[ $budget =~ ^[0-9]+$ ]] || usage "--budget-s '$budget' is not a whole number of seconds"
[[ $clip =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage "--clip-grad '$clip' is not a number >= 0"
start=$SECONDS
wants() { [[ ",$only," == *",$1,"* ]]; }

device=$([[ $dry -eq 1 ]] && echo cpu || echo cuda)
if [[ -n $bin ]]; then
  train=$bin/fsdp-train inspect=$bin/fsdp-inspect mlp_bin=$bin/bench_mlp
  PYTHON=${PYTHON:-python3}
else
  root=$(cd "$here/../.." && pwd)
  PYTHON=${PYTHON:-$("$root/scripts/torch-python.sh")}
  if [[ $dry -eq 1 ]]; then
    build=${FSDP_BUILD_DIR:-$root/build}
    [[ -x $build/bench/gpu/bench_mlp ]] || (cd "$root" && scripts/deps.sh && scripts/build.sh)
  else
    build=${FSDP_GPU_BUILD_DIR:-$root/build-gpu}
    [[ -x $build/apps/fsdp-train && -x $build/bench/gpu/bench_mlp ]] || "$root/scripts/gpu.sh" --build-only
  fi
  train=$build/apps/fsdp-train inspect=$build/apps/fsdp-inspect mlp_bin=$build/bench/gpu/bench_mlp
fi
for b in "$train" "$inspect" "$mlp_bin"; do [[ -x $b ]] || usage "no executable $b"; done
if [[ -z $out ]]; then
  mkdir -p "$here/out"
  out=$(mktemp -d "$here/out/$(date -u +%Y%m%d-%H%M%S)-XXXX")
fi
mkdir -p "$out"
for f in results.jsonl table.md; do
  [[ ! -e $out/$f ]] || usage "--out $out already holds $f: results are never overwritten; name a new folder"
done
log=$out/bench.log results=$out/results.jsonl
touch "$log" "$results"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
touch "$work/estimates.jsonl"
readonly kTableReserve=10  # seconds of the budget kept for the table

# The limit of the next run: --run-timeout, or what the budget has left.
run_limit() {
  local limit=$run_timeout rest
  if ((budget > 0)); then
    rest=$((budget - kTableReserve - (SECONDS - start)))
    ((rest < limit)) && limit=$rest
  fi
  echo "$limit"
}
# One run: its command and output appended to bench.log under a header;
# bounded by run_limit (a run that would get under 15 s is not started:
# status 125). Returns the command's status (124: timed out). The timeout
# stays in this process group (--foreground), so stopping this script stops
# the run too.
run_logged() {  # name command...
  local name=$1 rc=0 limit
  shift
  limit=$(run_limit)
  : > "$work/run.out"
  if ((limit < 15)); then
    echo "not started: the budget of ${budget}s is spent" > "$work/run.err"
    { echo; echo "=== $name: not started, the budget of ${budget}s is spent"; } >> "$log"
    return 125
  fi
  { echo; echo "=== $name ($(date -u +%H:%M:%S), at most ${limit}s)"; echo "\$ $*"; } >> "$log"
  FSDP_TIMEOUT=${FSDP_TIMEOUT:-$((limit / 3 < 10 ? 10 : limit / 3))} \
    timeout --foreground -k 10 "$limit" "$@" > "$work/run.out" 2> "$work/run.err" || rc=$?
  cat "$work/run.err" >> "$log"
  [[ $rc -eq 124 ]] && echo "timed out after ${limit}s" >> "$work/run.err"
  echo "=== $name: exit $rc" >> "$log"
  return $rc
}
# The table so far (DIR/table.md of --out, rewritten whole): after every row.
write_table() {
  local status=0
  {
    echo "Command: \`bench/gpu/run.sh ${args[*]}\`, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "Card: $(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true);" \
         "PyTorch $torch_version"
    echo
    "$PYTHON" "$here/report.py" table --results "$results" --config "$work/config.json" --seq-len "$seq" \
      --peak "$work/peak.json" --estimates "$work/estimates.jsonl"
  } > "$work/table.md" || status=$?
  mv "$work/table.md" "$out/table.md"
  return $status
}
# The run's result line from its output (libraries print there too: NCCL's
# version banner on a GPU machine).
result_line() { "$PYTHON" "$here/report.py" result-line --output "$work/run.out"; }
# A row that failed: its reason (the last line of its error output) in place of numbers.
failed_row() {  # row kind ckpt
  "$PYTHON" "$here/report.py" failed-row --row "$1" --kind "$2" $([[ $3 -eq 1 ]] && echo --ckpt) \
    --stderr "$work/run.err" >> "$results"
}

echo "bench/gpu/run.sh: $model, seq $seq, batch $batch (checkpointing: $ckpt_batch), $warmup warm-up + $steps measured steps, device $device; results in $out"
"$inspect" --model "$model" --write-hf-config "$work/config.json" > /dev/null
torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2> /dev/null || echo "(torch does not import)")
# The MFU's denominator, and the card's rates for the step-time model (memory bandwidth, attention at the
# plain rows' shape). Without them the rows still run; MFU says "-".
attention_shape=$("$PYTHON" - "$work/config.json" "$batch" "$seq" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
h = c["num_attention_heads"]
print(",".join(str(x) for x in (sys.argv[2], h, c.get("num_key_value_heads", h), sys.argv[3],
                                c.get("head_dim") or c["hidden_size"] // h)))
PY
)
if ! run_logged "matmul peak" "$PYTHON" "$here/matmul_peak.py" --device "$device" --attention "$attention_shape" \
    $([[ $dry -eq 1 ]] && echo "--n 512 --iters 5 --memory-elements 1048576") ||
    ! result_line > "$work/peak.json" 2>> "$work/run.err"; then
  "$PYTHON" -c 'import json,sys; print(json.dumps({"error": sys.argv[1][:200]}))' \
    "$(tail -n 1 "$work/run.err" 2> /dev/null)" > "$work/peak.json"
fi
# This card's rates as a cluster file (docs/estimate.md), from which ours() estimates each row of (a).
"$PYTHON" "$here/report.py" cluster-file --peak "$work/peak.json" --out "$out/cluster.json" \
  --cudnn-out "$work/cluster-cudnn.json" 2>> "$log" || true
vocab=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$work/config.json")

# Random token ids (uint32, below the vocabulary size): enough for the largest run.
big=$((batch > ckpt_batch ? batch : ckpt_batch))
[[ $long -eq 1 ]] && big=$((2 * ckpt_batch > batch ? 2 * ckpt_batch : batch))
ntok=$(( (warmup + steps) * big * seq + seq + 1 ))
"$PYTHON" - "$work/tokens.bin" "$ntok" "$vocab" <<'PY'
import array, random, sys
path, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1234)
a = array.array("I", (rng.randrange(vocab) for _ in range(n)))
if sys.byteorder != "little":
    a.byteswap()
open(path, "wb").write(a.tobytes())
PY

# fsdp-inspect's estimate of a row of (a), with the row's own flags, from the card's measured rates
# (cluster.json; with cuDNN's attention first, cluster.json with cuDNN's attention rate where it was
# measured, else the estimate is the flash row's, said in bench.log): the text and the table's line
# (estimates.jsonl, in the temporary folder) in bench.log.
estimate_row() {  # row ckpt batch [fsdp-train flag...]
  local row=$1 ckpt=$2 b=$3 cluster=$out/cluster.json
  local extra=("${@:4}") flags
  [[ -f $cluster ]] || return 0
  if [[ " ${extra[*]} " == *" --attention-backend cudnn "* ]]; then
    if [[ -f $work/cluster-cudnn.json ]]; then
      cluster=$work/cluster-cudnn.json
    else
      echo "--- cuDNN's attention rate was not measured: the estimate of $row times flash's" >> "$log"
    fi
  fi
  flags=(--model "$model" --nproc-per-node 1 --seq-len "$seq" --mixed-precision bf16 --reduce-dtype bf16
         --batch-size "$b" --clip-grad "$clip")
  if [[ $ckpt -eq 1 ]]; then flags+=(--activation-checkpointing); fi
  flags+=("${extra[@]}")
  { echo "--- the estimate of $row from $(basename "$cluster")"; echo "\$ fsdp-inspect --estimate ${flags[*]}"; } >> "$log"
  timeout 120 "$inspect" --estimate --cluster "$cluster" "${flags[@]}" >> "$log" 2>&1 || true
  if timeout 120 "$inspect" --estimate --json --cluster "$cluster" "${flags[@]}" > "$work/estimate.json" \
      2>> "$log" &&
      "$PYTHON" "$here/report.py" estimate-row --estimate "$work/estimate.json" --row "$row" \
        $([[ $ckpt -eq 1 ]] && echo --ckpt) --cluster "$(basename "$cluster")" > "$work/estimate.line" 2>> "$log"; then
    tee -a "$work/estimates.jsonl" < "$work/estimate.line" >> "$log"
  fi
}

ours() {  # row ckpt batch [fsdp-train flag...]
  local row=$1 ckpt=$2 b=$3
  local extra=("${@:4}")
  estimate_row "$@"
  rm -f "$work/metrics.jsonl"
  # Sequential windows (no shuffle effect on speed); bf16 params and bf16
  # reduction, as the peers' MixedPrecision.
  if run_logged "$row" "$train" --model "$model" --data "$work/tokens.bin" --token-dtype u32 --seq-len "$seq" \
      --batch-size "$b" --max-steps $((warmup + steps)) --log-every 1 --metrics-file "$work/metrics.jsonl" \
      --mixed-precision bf16 --reduce-dtype bf16 --lr 1e-4 --warmup-steps 1 --clip-grad "$clip" --device "$device" \
      $([[ $ckpt -eq 1 ]] && echo --activation-checkpointing) "${extra[@]}"; then
    "$PYTHON" "$here/report.py" train-row --metrics "$work/metrics.jsonl" --row "$row" \
      $([[ $ckpt -eq 1 ]] && echo --ckpt) --batch-size "$b" --seq-len "$seq" --warmup "$warmup" >> "$results"
  else
    failed_row "$row" llama "$ckpt"
  fi
  write_table || true
}

# One row of a PyTorch peer (hf_fsdp.py).
peer() {  # row impl ckpt batch
  local name=$1 impl=$2 ckpt=$3 b=$4
  if ! run_logged "$name" "$PYTHON" "$here/hf_fsdp.py" --impl "$impl" --row "$name" --config "$work/config.json" \
      --tokens "$work/tokens.bin" --seq-len "$seq" --batch-size "$b" --steps "$steps" --warmup "$warmup" \
      --clip-grad "$clip" --device "$device" $([[ $ckpt -eq 1 ]] && echo --activation-checkpointing) ||
      ! result_line >> "$results" 2>> "$work/run.err"; then
    failed_row "$name" llama "$ckpt"
  fi
  write_table || true
}
batch_of() { [[ $1 -eq 1 ]] && echo "$ckpt_batch" || echo "$batch"; }  # ckpt

# The order of the header: the main ratio first, the drift's bound last.
for ckpt in 0 1; do
  wants c && peer "(c) PyTorch FSDP2" fsdp2 "$ckpt" "$(batch_of "$ckpt")"
  wants a && ours "(a) fsdp-train" "$ckpt" "$(batch_of "$ckpt")"
done
for ckpt in 0 1; do
  wants d && peer "(d) PyTorch FSDP2, compiled" fsdp2-compile "$ckpt" "$(batch_of "$ckpt")"
done
for ckpt in 0 1; do
  wants b && peer "(b) PyTorch FSDP" fsdp1 "$ckpt" "$(batch_of "$ckpt")"
done
# What checkpointing recomputes (fsdp-train --ac-policy; the row above is the
# default, tail): the whole layer as before, and selective.
for policy in full selective; do
  wants a && ours "(a) fsdp-train --ac-policy $policy" 1 "$ckpt_batch" --ac-policy "$policy"
done
# The fused layer kernels (fsdp-train --kernels fused: RMSNorm, SwiGLU, rotary), without checkpointing.
wants a && ours "(a) fsdp-train --kernels fused" 0 "$batch" --kernels fused
# The same with cuDNN's attention tried first (flash as its fallback; the run's
# log names the kernel SDPA picked: docs/training.md, --attention-backend).
wants a && ours "(a) fsdp-train --kernels fused --attention-backend cudnn" 0 "$batch" --kernels fused \
  --attention-backend cudnn
# FP8: the decoder's products as rowwise-scaled e4m3 (_scaled_mm), with the fused kernels.
wants a && ours "(a) fsdp-train --kernels fused --fp8-linear rowwise (FP8)" 0 "$batch" --kernels fused \
  --fp8-linear rowwise
# Where fsdp-train fits a larger batch than the peers were given.
[[ $long -eq 1 ]] && wants a && ours "(a) fsdp-train, 2x batch" 1 $((2 * ckpt_batch))
# FSDP2 eager again: with the first (c) rows, the bounds of the card's drift.
for ckpt in 0 1; do
  wants c && peer "(c) PyTorch FSDP2, again" fsdp2 "$ckpt" "$(batch_of "$ckpt")"
done

if wants mlp; then
  for offload in "" --cpu-offload; do
    name="MLP ${offload:-on-device}"
    if ! run_logged "$name" "$mlp_bin" --device "$device" --width "$mlp_width" --batch-size "$mlp_batch" \
        --precision "$([[ $device == cuda ]] && echo bf16 || echo fp32)" --steps "$steps" --warmup "$warmup" $offload ||
        ! result_line >> "$results" 2>> "$work/run.err"; then
      failed_row "$name" mlp 0
    fi
    write_table || true
  done
fi

status=0
write_table || status=$?
cat "$out/table.md"
echo "bench/gpu/run.sh: results in $out (table.md, results.jsonl, bench.log)"
exit $status

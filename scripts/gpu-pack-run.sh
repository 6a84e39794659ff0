#!/usr/bin/env bash
# fsdp-cpp on a GPU machine, in one call, from this pack alone (built by
# scripts/gpu-pack.sh, which copies this file to <pack>/run.sh; docs/gpu.md).
#
#   PACK/run.sh          the probe, the CUDA tests, fsdp-train --device cuda
#                        against --device cpu, the head-to-head at sizes that fit
#                        80 GB and the tutorial MLP with and without CPU offload:
#                        under 9 minutes
#   PACK/run.sh --long   the probe, then the full head-to-head (a second call)
#   PACK/run.sh --ranks  the probe, then several ranks on the one GPU: NCCL at
#                        world sizes 2 and 4 (the CudaRanks tests) and
#                        fsdp-train --device cuda:0 at 2 ranks against 1 (a
#                        short call; the default call ends with it when time
#                        is left)
#   PACK/run.sh --dry-run  the same phases on the CPU with tiny sizes, on any
#                        machine (CI runs it on every run)
#   PACK/run.sh --self-test  the probe, then a phase made to hang: it must be
#                        reported TIMED OUT and leave no process behind (seconds)
#
# Results: the folder OUT (default <pack>/results, <pack>/results-long with
# --long), new or empty — nothing is ever overwritten. OUT/summary.md gets one
# row per phase the moment the phase ends (passed, FAILED, TIMED OUT; seconds;
# what it found), then the head-to-head's table: a call cut short still leaves
# the rows of the phases it finished. Each phase keeps its log: probe.log,
# cuda-tests.log (the several-ranks phase too), agreement.log (the kernels
# and FP8 phases too), and the head-to-head's bench.log (with results.jsonl, OUT/table.md,
# both rewritten after every row, and cluster.json, the card's rates). Eight
# files at most. Temporary files live in a folder under TMPDIR, removed at the end.
#
# PYTHON (default python3) is the Python with PyTorch: the binaries use its
# torch libraries (torch/lib and the nvidia-* packages beside it) and this
# pack's lib/, nothing else. lib/fallback/ (a newer libstdc++ than this machine
# may have) is used only where the probe finds this machine's own copies do not
# do, and then only by the pack's binaries, never by Python.
#
# Every phase runs in its own process group under its own limit, inside a
# budget of 9 minutes for the call (FSDP_PACK_BUDGET_S to change it); a phase
# that runs out of time is stopped with its whole group (TERM, then KILL), and
# anything a finished phase left running is killed and named. Collectives time
# out well before their phase does (FSDP_TIMEOUT, a third of the limit of each
# run unless set), so a hung collective is named in the phase's log instead of
# the phase being killed silently; NCCL_DEBUG=WARN unless set.
#
# Exit status: 0 every phase passed; 1 a phase failed or ran out of time; 2
# usage, or the probe found this machine unfit (another torch than the pack
# was built against, a library missing): the run stops there and says why.
set -uo pipefail
pack=$(cd "$(dirname "$0")" && pwd)
mode=quick
case "${1:-}" in
  "") ;;
  --long) mode=long ;;
  --ranks) mode=ranks ;;
  --dry-run) mode=dry ;;
  --self-test) mode=selftest ;;
  -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
  *) echo "run.sh: unknown argument '$1' (--long, --ranks, --dry-run, --self-test, or nothing)" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "run.sh: one argument at most" >&2; exit 2; }
OUT=${OUT:-$pack/results$([[ $mode == long || $mode == ranks ]] && echo "-$mode")}
mkdir -p "$OUT" || exit 2
[[ -z $(ls -A "$OUT") ]] || { echo "run.sh: OUT=$OUT is not empty; results are never overwritten: set OUT to a new folder" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
budget=${FSDP_PACK_BUDGET_S:-540}
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: FSDP_PACK_BUDGET_S='$budget' is not a positive number of seconds" >&2; exit 2; }
readonly kReserve=5  # seconds kept for the summary at the end of the budget
readonly kGrace=10   # seconds between TERM and KILL
start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$pack/bin  # the probe may point it at wrappers that add lib/fallback
device=$([[ $mode == dry || $mode == selftest ]] && echo cpu || echo cuda)
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
failed=0
summary=$OUT/summary.md
{
  echo "# fsdp-cpp GPU pack: run.sh${1:+ $1}, started $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Pack: $(sed -n 's/^project_commit=//p' "$pack/PACK" | head -n 1), torch $(sed -n 's/^torch_version=//p' "$pack/PACK" | head -n 1); budget ${budget}s."
  echo
  echo "| phase | result | seconds | details |"
  echo "|---|---|---|---|"
} > "$summary"

# Seconds the call has left for a phase.
left() { echo $((budget - kReserve - (SECONDS - start))); }
# `timeout` for a command inside a phase: in the phase's process group
# (--foreground: GNU timeout would otherwise start a group of its own, which
# the phase's kill would miss), and never with 0 seconds (no limit at all).
bounded() {  # seconds command...
  local s=$1
  shift
  if ((s < 1)); then
    echo "run.sh: no time left to run $1" >&2
    return 124
  fi
  timeout --foreground -k "$kGrace" "$s" "$@"
}
# The collective timeout for a run limited to `s` seconds: a third of it
# (at least 10 s), unless FSDP_TIMEOUT is set.
collective_timeout() { local t=$(($1 / 3)); echo "${FSDP_TIMEOUT_SET:-$((t < 10 ? 10 : t))}"; }
FSDP_TIMEOUT_SET=${FSDP_TIMEOUT:-}
# The live processes of group `pgid`, as "pid command" (no ps on a minimal
# machine); zombies, already dead and waiting to be reaped, are not counted.
group_members() {
  local stat f pid rest state pg
  for f in /proc/[0-9]*/stat; do
    { stat=$(< "$f"); } 2> /dev/null || continue
    pid=${stat%% *}
    rest=${stat##*) }  # after the command name, which may hold spaces
    read -r state _ pg _ <<< "$rest"
    [[ $pg == "$1" && $state != Z ]] && echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | cut -c1-60)"
  done
}

# A phase: its function in a process group of its own, its output appended to
# its log in OUT, its own limit (never past the budget), its row appended to
# the summary as it ends. The function may write one line of details to
# $PHASE_DETAIL.
phase() {  # name log max_seconds function
  local name=$1 log=$2 max=$3 fn=$4 t0=$SECONDS rc=0 limit pid wd detail result stray
  limit=$(left)
  ((limit > max)) && limit=$max
  if ((limit < max && limit < 10)); then
    echo "| $name | not run | 0 | the call's budget of ${budget}s is spent |" >> "$summary"
    failed=1
    return 1
  fi
  echo "run.sh: $name (at most ${limit}s) ..."
  : > "$work/detail"
  set -m  # each background job below gets a process group of its own
  (
    trap - EXIT
    export PHASE_LIMIT=$limit PHASE_DETAIL=$work/detail
    "$fn"
  ) >> "$OUT/$log" 2>&1 &
  pid=$!
  (
    trap - EXIT
    sleep "$limit"
    echo "$limit" > "$work/timed-out"
    kill -TERM -- "-$pid" 2> /dev/null
    sleep "$kGrace"
    kill -KILL -- "-$pid" 2> /dev/null
  ) > /dev/null 2>&1 &
  wd=$!
  set +m
  wait "$pid" || rc=$?
  kill -KILL -- "-$wd" 2> /dev/null
  wait "$wd" 2> /dev/null
  # Whatever the phase left behind (a background child, a process that
  # ignored TERM) goes with its group.
  stray=$(group_members "$pid")
  if [[ -n $stray ]]; then
    kill -KILL -- "-$pid" 2> /dev/null
    sleep 1
    echo "run.sh: killed what the phase left running: $(tr '\n' ';' <<< "$stray")" >> "$OUT/$log"
  fi
  detail=$(head -n 1 "$work/detail")
  result=passed
  if [[ -f $work/timed-out ]]; then
    rm -f "$work/timed-out"
    result="TIMED OUT"
    rc=124
    detail="stopped after ${limit}s (its last lines are in $log)${detail:+; $detail}"
  elif ((rc != 0)); then
    result=FAILED
  fi
  if [[ -n $stray ]]; then
    detail+="${detail:+; }it left $(wc -l <<< "$stray") process(es) running, killed"
    [[ -n $(group_members "$pid") ]] && detail+=", and some SURVIVED"
  fi
  ((rc == 0)) || failed=1
  local secs=$((SECONDS - t0))
  echo "| $name | $result | $secs | ${detail:-see $log} |" >> "$summary"
  echo "run.sh: $name: $result in ${secs}s${detail:+: $detail}"
  return $rc
}
say() { echo "$*" > "$PHASE_DETAIL"; }  # the phase's details, for its row

# ---- probe ----------------------------------------------------------------------
pack_value() { sed -n "s/^$1=//p" "$pack/PACK" | head -n 1; }
probe() {
  echo "pack: $(pack_value project_commit), built $(pack_value built_utc) against torch $(pack_value torch_version)" \
       "(git $(pack_value torch_git), CUDA $(pack_value torch_cuda), NCCL $(pack_value nccl_built))"
  local info
  info=$(bounded 60 "$PYTHON" - "$device" <<'PY'
import glob, os, sys
import torch
d = os.path.dirname(torch.__file__)
site = os.path.dirname(d)
libs = [os.path.join(d, "lib")] + sorted(p for p in glob.glob(os.path.join(site, "nvidia", "*", "lib")) if os.path.isdir(p))
print("torch_version=" + torch.__version__)
print("torch_git=" + str(torch.version.git_version))
print("torch_cuda=" + str(torch.version.cuda))
print("libs=" + ":".join(libs))
if sys.argv[1] == "cuda":
    ok = torch.cuda.is_available()
    print("cuda_available=" + str(ok))
    if ok:
        p = torch.cuda.get_device_properties(0)
        print(f"device={p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}, "
              f"{torch.cuda.device_count()} visible")
    v = torch.cuda.nccl.version()
    print("nccl=" + (".".join(map(str, v)) if isinstance(v, tuple) else str(v)))
    print("cudnn=" + str(torch.backends.cudnn.version()))
PY
) || { say "'$PYTHON' cannot import torch (set PYTHON to the Python with PyTorch)"; cat "$PHASE_DETAIL"; return 2; }
  echo "$info"
  v() { sed -n "s/^$1=//p" <<< "$info"; }
  if [[ $(v torch_version) != "$(pack_value torch_version)" || $(v torch_git) != "$(pack_value torch_git)" ]]; then
    say "torch $(v torch_version) (git $(v torch_git)) here, but the pack was built against $(pack_value torch_version) (git $(pack_value torch_git)): rebuild the pack against this torch"
    echo "MISMATCH: $(cat "$PHASE_DETAIL")"
    return 2
  fi
  # Every binary and library of the pack against the torch libraries and
  # lib/: nothing "not found" or undefined, and every library the pack
  # carries resolved to the pack's own copy (a copy of this machine's would
  # hide a pack that is incomplete, as libsentencepiece once did).
  unresolved() {  # LD_LIBRARY_PATH
    local f out bad="" soname arrow path
    for f in "$pack"/bin/* "$pack"/lib/*.so*; do
      out=$(LD_LIBRARY_PATH=$1 ldd -r "$f" 2>&1)
      if grep -Eq 'not found|undefined symbol' <<< "$out"; then
        bad+="$(basename "$f"): $(grep -E 'not found|undefined symbol' <<< "$out" | head -n 3 | tr -s ' \t\n' ' '); "
      fi
      while read -r soname arrow path _; do
        [[ $arrow == "=>" && -e $pack/lib/$soname && $path != not ]] || continue
        [[ $(realpath "$path") == "$(realpath "$pack/lib/$soname")" ]] ||
          bad+="$(basename "$f"): $soname resolves to $path, not the pack's lib/$soname; "
      done <<< "$out"
    done
    echo "$bad"
  }
  local libs bad need have fallback=""
  libs=$(v libs)
  bad=$(unresolved "$libs")
  need=$(pack_value glibc_needed)
  if [[ (-n $bad || -n ${FSDP_PACK_FORCE_FALLBACK:-}) && -n $(ls -A "$pack/lib/fallback" 2> /dev/null) ]]; then
    echo "without lib/fallback: ${bad:-(resolves; FSDP_PACK_FORCE_FALLBACK is set)}"
    fallback=$pack/lib/fallback
    bad=$(unresolved "$libs:$fallback")
    local f n
    for f in "$fallback"/*; do  # their C library needs count now
      n=$(sed -n "s|^carried=lib/fallback/$(basename "$f") .*needs GLIBC \([0-9.]*\)).*|\1|p" "$pack/PACK")
      [[ -n $n && $(printf '%s\n%s\n' "$need" "$n" | sort -V | tail -n 1) == "$n" ]] && need=$n
    done
  fi
  echo "LD_LIBRARY_PATH for every phase: $libs"
  have=$(ldd --version 2> /dev/null | head -n 1 | grep -o '[0-9]\+\.[0-9]\+$')
  echo "GLIBC: needed $need, here $have"
  if [[ -n $need && -n $have && $(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -n 1) != "$have" ]]; then
    bad+="the C library here is GLIBC $have, the pack needs $need; "
  fi
  if [[ -n $bad ]]; then
    say "libraries: $bad"
    echo "MISSING: $bad"
    return 2
  fi
  # What the later phases use: the torch libraries for every process; the
  # fallbacks only for the pack's binaries, through wrappers (a newer
  # libstdc++ in Python's LD_LIBRARY_PATH would replace the one torch was
  # loaded with there).
  echo "export LD_LIBRARY_PATH=$(printf '%q' "$libs")" > "$work/env"
  if [[ -n $fallback ]]; then
    mkdir -p "$work/bin"
    local b
    for b in "$pack"/bin/*; do
      printf '#!/bin/sh\nLD_LIBRARY_PATH="$LD_LIBRARY_PATH:%s" exec %q "$@"\n' "$fallback" "$b" > "$work/bin/$(basename "$b")"
      chmod +x "$work/bin/$(basename "$b")"
    done
    echo "bin=$(printf '%q' "$work/bin")" >> "$work/env"
    echo "lib/fallback: for the pack's binaries only (wrappers in $work/bin)"
  fi
  source "$work/env"
  bounded 30 "${bin:-$pack/bin}/fsdp-train" --version || { say "fsdp-train does not start (exit $?)"; return 2; }
  # Python, like every process but the pack's own binaries, never sees lib/fallback.
  local py_path
  py_path=$(bounded 30 "$PYTHON" -c 'import os; print(os.environ.get("LD_LIBRARY_PATH", ""))')
  [[ $py_path != *lib/fallback* ]] || { say "lib/fallback leaked into Python's LD_LIBRARY_PATH ($py_path)"; return 2; }
  if [[ $device == cuda ]]; then
    [[ $(v cuda_available) == True ]] || { say "torch sees no CUDA device here; use --dry-run on a machine without a GPU"; return 2; }
    bounded 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || true
    say "$(v device); NCCL $(v nccl) (pack: $(pack_value nccl_built)), cuDNN $(v cudnn); torch $(v torch_version) as built${fallback:+; lib/fallback only for the binaries of the pack}"
  else
    say "on the CPU; torch $(v torch_version) as built; libraries resolve in the pack${fallback:+; lib/fallback only for the binaries of the pack}"
  fi
}
phase "probe" probe.log 90 probe
probe_rc=$?
if ((probe_rc != 0)); then
  { echo; echo "The probe stopped the run."; } >> "$summary"
  cat "$summary"
  exit 2
fi
# The probe's library path and binaries (it ran in a subshell) serve every later phase.
source "$work/env"
export LD_LIBRARY_PATH

# ---- the CUDA tests ----------------------------------------------------------------
cuda_tests() {
  mkdir -p "$work/tests"
  local rc=0
  FSDP_TIMEOUT=$(collective_timeout "$PHASE_LIMIT") FSDP_TEST_TMPDIR=$work/tests FSDP_TEST_DEVICE=$device \
    bounded "$PHASE_LIMIT" "$bin/test_cuda" --gtest_filter='Cuda.*' || rc=$?
  say "FSDP_TEST_DEVICE=$device: $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/cuda-tests.log" | tr '\n' ' ')"
  return $rc
}

# ---- fsdp-train on the device against the CPU ------------------------------------------
# The tiny model's token files, once: $work/tokens.bin, runs of counting
# tokens from random starts, and $work/markov.bin, an order-2 Markov chain over
# the vocabulary's first 64 tokens (each pair picks the next among 4 of its
# own with probabilities 0.6, 0.25, 0.1, 0.05: 1.03 nats a token at best,
# where random tokens leave the loss at ln V; over the whole vocabulary the
# pairs were too many to learn in 40 steps). Both learnable, both seeded.
make_tokens() {
  [[ -f $work/tokens.bin && -f $work/markov.bin ]] && return 0
  "$bin/fsdp-inspect" --model tiny --write-hf-config "$work/tiny.json" > /dev/null || return 1
  "$PYTHON" - "$work/tiny.json" "$work/tokens.bin" "$work/markov.bin" <<'PY'
import array, json, random, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
def write(path, ids):
    a = array.array("I", ids)
    if sys.byteorder != "little":
        a.byteswap()
    open(path, "wb").write(a.tobytes())
rng = random.Random(7)
ids = []
while len(ids) < 300_000:
    s = rng.randrange(vocab)
    ids.extend((s + k) % vocab for k in range(rng.randrange(8, 64)))
write(sys.argv[2], ids)
rng = random.Random(11)
k = min(vocab, 64)
ids = [rng.randrange(k), rng.randrange(k)]
weights = [0.6, 0.25, 0.1, 0.05]
while len(ids) < 300_000:
    a, b = ids[-2], ids[-1]
    j = rng.choices(range(4), weights)[0]
    ids.append((a * 31 + b * 17 + j * 7 + 1) % k)
write(sys.argv[3], ids)
PY
}

# fsdp-train on the tiny model: run NAME, then the flags that differ (after the
# common ones); each run limited to `each` seconds; metrics in $work/NAME.jsonl.
tiny_run() {  # name each steps seq tokens flags...
  local name=$1 each=$2 steps=$3 seq=$4 tokens=$5 rc=0
  shift 5
  echo "--- $name: fsdp-train $*"
  FSDP_TIMEOUT=$(collective_timeout "$each") bounded "$each" "$bin/fsdp-train" --model tiny --data "$work/$tokens.bin" \
    --token-dtype u32 --seq-len "$seq" --max-steps "$steps" --log-every 1 --lr 3e-3 --warmup-steps 3 \
    --metrics-file "$work/$name.jsonl" "$@" || { rc=$?; say "$name ($*) exited $rc"; }
  return $rc
}

# Compares the per-step losses of runs A and B: the verdict on one line (the
# phase's details), the table on stderr (its log). `last`: only the last
# step's difference is held to the tolerance (the others are shown).
losses_agree() {  # A B steps tolerance [last]
  "$PYTHON" - "$work/$1.jsonl" "$work/$2.jsonl" "$1" "$2" "$3" "$4" "${5:-every}" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "step" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
name_a, name_b, steps, tol, which = sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
print(f"{'step':>4} {name_a:>14} {name_b:>14} {'rel diff':>9}", file=sys.stderr)
worst = 0.0
for i, (x, y) in enumerate(zip(a, b)):
    d = abs(x - y) / abs(y)
    worst = max(worst, d)
    print(f"{i:>4} {x:>14.6f} {y:>14.6f} {d:>9.2e}", file=sys.stderr)
held = worst if which == "every" else abs(a[-1] - b[-1]) / abs(b[-1]) if a and b else float("inf")
ok = len(a) == len(b) == steps and held <= tol and a[-1] < a[0]
print(f"{len(a)} and {len(b)} steps (of {steps}), worst relative difference {worst:.2e}"
      + ("" if which == "every" else f", at the last step {held:.2e}")
      + f" (tolerance {tol}); loss {a[0]:.4f} -> {a[-1]:.4f}"
      + ("" if ok else " — DISAGREE or did not learn"))
sys.exit(0 if ok else 1)
PY
}

agreement() {
  make_tokens || return 1
  # A dry run compares the CPU with itself at a size the CPU runs in seconds.
  local steps=30 batch=8 seq=64 rc=0 d each verdict
  [[ $mode == dry ]] && steps=8 batch=2 seq=32
  each=$((PHASE_LIMIT / 2 - 5))
  local run=0
  for d in "$device" cpu; do  # the device under test, then the CPU (in a dry run the CPU twice)
    run=$((run + 1))
    tiny_run "run$run-$d" "$each" "$steps" "$seq" tokens --batch-size "$batch" --mixed-precision bf16 --device "$d" ||
      return
  done
  # bf16 on both sides; another device's kernels round differently.
  verdict=$(losses_agree "run1-$device" run2-cpu "$steps" 0.02) || rc=$?
  say "$verdict"
  echo "$verdict"
  return $rc
}

# ---- the fused kernels against the reference; FP8 linears against bf16 -------------------
# Two runs of the tiny model on the device, bf16, 40 steps of the Markov chain
# (a stream the model learns, so the two runs' losses part if a kernel is
# wrong), that differ in one flag: FLAG A, then FLAG B; their losses compared.
flag_pair() {  # prefix flag A B tolerance [last]
  make_tokens || return 1
  local steps=40 batch=8 seq=64 rc=0 value each verdict
  [[ $mode == dry ]] && steps=8 batch=2 seq=32
  each=$((PHASE_LIMIT / 2 - 5))
  for value in "$3" "$4"; do
    tiny_run "$1-$value" "$each" "$steps" "$seq" markov --batch-size "$batch" --mixed-precision bf16 \
      --device "$device" "$2" "$value" || return
  done
  verdict=$(losses_agree "$1-$3" "$1-$4" "$steps" "$5" "${6:-every}") || rc=$?
  say "$verdict"
  echo "$verdict"
  return $rc
}
# --kernels fused against --kernels reference: every step within 0.5%.
kernels() { flag_pair kernels --kernels fused reference 0.005; }
# --fp8-linear rowwise (the decoder's products through _scaled_mm; emulated on
# the CPU) against --fp8-linear off: the last step within 1.5%.
fp8() { flag_pair fp8 --fp8-linear rowwise off 0.015 last; }

# ---- several ranks on the one GPU ----------------------------------------------------
# Note [Several ranks on one GPU] (src/comm/launcher.cpp): the CudaRanks tests
# (NCCL at world sizes 2 and 4 on GPU 0, each rank with its own NCCL_HOSTID:
# collectives, the two lanes, HYBRID and hpZ sub-groups, the bf16 wire, a peer
# that left, and NCCL's refusal without per-rank ids), then fsdp-train
# --device cuda:0 at 2 ranks against 1 rank on the same global batch.
ranks() {
  mkdir -p "$work/ranks-tests"
  local phase_start=$SECONDS rc=0 tests_limit=$((PHASE_LIMIT * 2 / 3)) gpu=cpu steps=12 seq=64 each tests verdict
  [[ $device == cuda ]] && gpu=cuda:0
  [[ $mode == dry ]] && steps=8 seq=32
  FSDP_TIMEOUT=$(collective_timeout "$tests_limit") FSDP_TEST_TMPDIR=$work/ranks-tests FSDP_TEST_DEVICE=$device \
    bounded "$tests_limit" "$bin/test_cuda" --gtest_filter='CudaRanks.*' || rc=$?
  tests="CudaRanks on $device: $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/cuda-tests.log" | tail -n 1)"
  make_tokens || { say "$tests; no token file"; return 1; }
  each=$(((PHASE_LIMIT - (SECONDS - phase_start)) / 2 - 5))
  # fp32, so that only the order of the two ranks' sums differs from one rank's.
  tiny_run one-rank "$each" "$steps" "$seq" tokens --device "$gpu" --batch-size 4 --global-batch-size 8 &&
    tiny_run two-ranks "$each" "$steps" "$seq" tokens --device "$gpu" --nproc-per-node 2 --batch-size 4 \
      --global-batch-size 8 || { say "$tests; $(< "$PHASE_DETAIL")"; return 1; }
  verdict=$(losses_agree two-ranks one-rank "$steps" 1e-4) || rc=$?
  say "$tests; fsdp-train --device $gpu at 2 ranks against 1: $verdict"
  echo "$verdict"
  return $rc
}

# ---- the head-to-head and the tutorial MLP -------------------------------------------
head_to_head() {
  local flags=()
  case $mode in
    dry) flags=(--dry-run --run-timeout 120) ;;
    # The MLP at width 8192 (537M parameters): at 20480 its offloaded run pins
    # and steps 54 GB of host state, minutes of the budget.
    quick) flags=(--run-timeout 100 --mlp-width 8192) ;;
    long) flags=(--long --run-timeout 150) ;;
  esac
  say "table below; every run's output in bench.log"
  # Its own budget: the phase's limit less the grace its stop would take, so
  # that every row it reaches gets a bounded share and the table is written.
  FSDP_TIMEOUT=$FSDP_TIMEOUT_SET "$pack/bench/run.sh" --bin "$bin" --out "$OUT" --budget-s $((PHASE_LIMIT - kGrace)) \
    "${flags[@]}"
}

# ---- the self-test: a phase that hangs ------------------------------------------
hang() {
  # A child in the background, and one that ignores TERM: both must go.
  (exec -a fsdp-pack-selftest-hang sleep 1000) &
  (trap '' TERM; exec -a fsdp-pack-selftest-hang sleep 1000) &
  echo "started two processes that never end; waiting to be stopped"
  wait
}

case $mode in
  selftest)
    phase "self-test: a phase that hangs" selftest.log "${FSDP_PACK_SELFTEST_S:-5}" hang
    if grep -q '^| self-test: a phase that hangs | TIMED OUT |' "$summary" && ! grep -q SURVIVED "$summary"; then
      echo "run.sh: self-test passed: the hung phase was reported and stopped" >> "$summary"
      failed=0
    else
      echo "run.sh: self-test FAILED: the hung phase was not reported as TIMED OUT, or left processes" >> "$summary"
      failed=1
    fi
    ;;
  ranks)
    phase "several ranks on the one GPU" cuda-tests.log 300 ranks
    ;;
  *)
    if [[ $mode != long ]]; then
      phase "CUDA tests" cuda-tests.log 150 cuda_tests
      phase "--device $device against --device cpu" agreement.log 90 agreement
      phase "--kernels fused against reference" agreement.log 60 kernels
      phase "FP8: --fp8-linear rowwise against off" agreement.log 60 fp8
    fi
    # The dry run has time for every phase; on the GPU the default call's
    # head-to-head takes what is left, and --ranks is a call of its own.
    [[ $mode == dry ]] && phase "several ranks on the one GPU" cuda-tests.log 300 ranks
    # Whatever the earlier phases left of the budget, up to 8 minutes.
    phase "head-to-head and tutorial MLP" bench.log 480 head_to_head
    [[ $mode == quick ]] && echo "| several ranks on the one GPU | not in this call | 0 | run.sh --ranks runs it |" >> "$summary"
    if [[ -f $OUT/table.md ]]; then
      { echo; cat "$OUT/table.md"; } >> "$summary"
    fi
    ;;
esac
{
  echo
  echo "Finished after $((SECONDS - start)) s: $([[ $failed == 0 ]] && echo "every phase passed" || echo "NOT every phase passed") (exit $failed)."
} >> "$summary"
cat "$summary"
files=$(ls -A "$OUT" | wc -l)
((files <= 8)) || { echo "run.sh: $files files in OUT, more than 8" >&2; failed=1; }
exit $failed

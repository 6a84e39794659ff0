#!/usr/bin/env bash
# fsdp-cpp on a GPU machine, in one call, from this pack alone (built by
# scripts/gpu-pack.sh, which copies this file to <pack>/run.sh; docs/gpu.md).
#
#   PACK/run.sh          the probe, the CUDA tests, fsdp-train --device cuda
#                        against --device cpu, the head-to-head at sizes that fit
#                        80 GB and the tutorial MLP with and without CPU offload:
#                        under 9 minutes
#   PACK/run.sh --long   the probe, then the full head-to-head (a second call)
#   PACK/run.sh --dry-run  the same phases on the CPU with tiny sizes, on any
#                        machine (CI runs it on every run)
#
# Results: the folder OUT (default <pack>/results, <pack>/results-long with
# --long), new or empty — nothing is ever overwritten. OUT/summary.md has one row
# per phase (passed, FAILED or timed out; seconds; what it found) and the
# head-to-head's table; each phase keeps its log: probe.log, cuda-tests.log,
# agreement.log, and the head-to-head's bench.log, results.jsonl and OUT/table.md.
# Seven files (at most eight). Temporary files live in a folder under TMPDIR,
# removed at the end.
#
# PYTHON (default python3) is the Python with PyTorch: the binaries use its
# torch libraries (torch/lib and the nvidia-* packages beside it) and this
# pack's lib/, nothing else. lib/fallback/ (a newer libstdc++ than this machine
# may have) is used only where the probe finds this machine's own copies do not
# do, and then only by the pack's binaries, never by Python. Every phase runs under its own timeout, inside a
# budget of 9 minutes for the call (FSDP_PACK_BUDGET_S to change it).
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
  --dry-run) mode=dry ;;
  -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
  *) echo "run.sh: unknown argument '$1' (--long, --dry-run, or nothing)" >&2; exit 2 ;;
esac
[[ $# -le 1 ]] || { echo "run.sh: one argument at most" >&2; exit 2; }
OUT=${OUT:-$pack/results$([[ $mode == long ]] && echo -long)}
mkdir -p "$OUT" || exit 2
[[ -z $(ls -A "$OUT") ]] || { echo "run.sh: OUT=$OUT is not empty; results are never overwritten: set OUT to a new folder" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
budget=${FSDP_PACK_BUDGET_S:-540}
start=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$pack/bin
device=$([[ $mode == dry ]] && echo cpu || echo cuda)
failed=0
rows=()

# A phase: its log in OUT, its own timeout (never past the budget), one row.
left() { echo $((budget - (SECONDS - start))); }
phase() {  # name log max_seconds function
  local name=$1 log=$2 max=$3 fn=$4 t0=$SECONDS rc=0 limit
  limit=$(left)
  ((limit > max)) && limit=$max
  if ((limit < 10)); then
    rows+=("| $name | not run | 0 | the call's budget of ${budget}s is spent |")
    failed=1
    return 1
  fi
  detail=""
  echo "run.sh: $name (at most ${limit}s) ..."
  PHASE_LIMIT=$limit "$fn" >> "$OUT/$log" 2>&1 || rc=$?
  local secs=$((SECONDS - t0)) result=passed
  if ((rc == 124 || rc == 137)); then
    result="TIMED OUT"
    detail="stopped after ${limit}s; ${detail}"
  elif ((rc != 0)); then
    result=FAILED
  fi
  ((rc == 0)) || failed=1
  rows+=("| $name | $result | $secs | ${detail:-see $log} |")
  echo "run.sh: $name: $result in ${secs}s${detail:+: $detail}"
  return $rc
}

# ---- probe ----------------------------------------------------------------------
pack_value() { sed -n "s/^$1=//p" "$pack/PACK" | head -n 1; }
probe() {
  echo "pack: $(pack_value project_commit), built $(pack_value built_utc) against torch $(pack_value torch_version)" \
       "(git $(pack_value torch_git), CUDA $(pack_value torch_cuda), NCCL $(pack_value nccl_built))"
  local info
  info=$(timeout 60 "$PYTHON" - "$device" <<'PY'
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
) || { detail="'$PYTHON' cannot import torch (set PYTHON to the Python with PyTorch)"; echo "$detail"; return 2; }
  echo "$info"
  v() { sed -n "s/^$1=//p" <<< "$info"; }
  if [[ $(v torch_version) != "$(pack_value torch_version)" || $(v torch_git) != "$(pack_value torch_git)" ]]; then
    detail="torch $(v torch_version) (git $(v torch_git)) here, but the pack was built against $(pack_value torch_version) (git $(pack_value torch_git)): rebuild the pack against this torch"
    echo "MISMATCH: $detail"
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
    detail="libraries: $bad"
    echo "MISSING: $bad"
    return 2
  fi
  # What the later phases use: the torch libraries for every process; the
  # fallbacks only for the pack's binaries, through wrappers (a newer
  # libstdc++ in Python's LD_LIBRARY_PATH would replace the one torch was
  # loaded with there).
  export LD_LIBRARY_PATH=$libs
  if [[ -n $fallback ]]; then
    mkdir -p "$work/bin"
    local b
    for b in "$pack"/bin/*; do
      printf '#!/bin/sh\nLD_LIBRARY_PATH="$LD_LIBRARY_PATH:%s" exec %q "$@"\n' "$fallback" "$b" > "$work/bin/$(basename "$b")"
      chmod +x "$work/bin/$(basename "$b")"
    done
    bin=$work/bin
    echo "lib/fallback: for the pack's binaries only (wrappers in $work/bin)"
  fi
  "$bin/fsdp-train" --version || { detail="fsdp-train does not start"; return 2; }
  # Python, like every process but the pack's own binaries, never sees lib/fallback.
  local py_path
  py_path=$("$PYTHON" -c 'import os; print(os.environ.get("LD_LIBRARY_PATH", ""))')
  [[ $py_path != *lib/fallback* ]] || { detail="lib/fallback leaked into Python's LD_LIBRARY_PATH ($py_path)"; return 2; }
  if [[ $mode != dry ]]; then
    [[ $(v cuda_available) == True ]] || { detail="torch sees no CUDA device here; use --dry-run on a machine without a GPU"; return 2; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || true
    detail="$(v device); NCCL $(v nccl) (pack: $(pack_value nccl_built)), cuDNN $(v cudnn); torch $(v torch_version) as built${fallback:+; lib/fallback only for the binaries of the pack}"
  else
    detail="dry run on the CPU; torch $(v torch_version) as built; libraries resolve in the pack${fallback:+; lib/fallback only for the binaries of the pack}"
  fi
}
phase "probe" probe.log 90 probe
probe_rc=$?
if ((probe_rc != 0)); then
  # Keep the variables the probe found for the rows, then stop.
  {
    echo "# fsdp-cpp GPU pack: run.sh${1:+ $1}, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| phase | result | seconds | details |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "The probe stopped the run."
  } > "$OUT/summary.md"
  cat "$OUT/summary.md"
  exit 2
fi
# The probe's library path (it ran in this shell) serves every later phase.
export LD_LIBRARY_PATH

# ---- the CUDA tests ----------------------------------------------------------------
cuda_tests() {
  mkdir -p "$work/tests"
  local rc=0
  FSDP_TEST_TMPDIR=$work/tests FSDP_TEST_DEVICE=$device timeout -k 10 "$PHASE_LIMIT" "$bin/test_cuda" || rc=$?
  detail="FSDP_TEST_DEVICE=$device: $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/cuda-tests.log" | tr '\n' ' ')"
  return $rc
}

# ---- fsdp-train on the device against the CPU ------------------------------------------
agreement() {
  "$bin/fsdp-inspect" --model tiny --write-hf-config "$work/tiny.json" > /dev/null || return 1
  "$PYTHON" - "$work/tiny.json" "$work/tokens.bin" <<'PY' || return 1
import array, json, random, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
rng = random.Random(7)
# A learnable stream: runs of counting tokens from random starts.
ids = []
while len(ids) < 300_000:
    s = rng.randrange(vocab)
    ids.extend((s + k) % vocab for k in range(rng.randrange(8, 64)))
a = array.array("I", ids)
if sys.byteorder != "little":
    a.byteswap()
open(sys.argv[2], "wb").write(a.tobytes())
PY
  # A dry run compares the CPU with itself at a size the CPU runs in seconds.
  local steps=30 batch=8 seq=64 rc=0 d run=0
  [[ $mode == dry ]] && steps=8 batch=2 seq=32
  for d in "$device" cpu; do  # run 1: the device under test; run 2: the CPU
    run=$((run + 1))
    echo "--- run $run: fsdp-train --device $d"
    timeout -k 10 $((PHASE_LIMIT / 2 - 5)) "$bin/fsdp-train" --model tiny --data "$work/tokens.bin" --token-dtype u32 \
      --seq-len "$seq" --batch-size "$batch" --max-steps "$steps" --log-every 1 --lr 3e-3 --warmup-steps 3 \
      --mixed-precision bf16 --device "$d" --metrics-file "$work/metrics-$run.jsonl" || { rc=$?; detail="--device $d exited $rc"; return $rc; }
  done
  detail=$("$PYTHON" - "$work/metrics-1.jsonl" "$work/metrics-2.jsonl" "$device" "$steps" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "step" in r]
a, b, dev, steps = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tol = 0.02  # bf16 on both sides; another device's kernels round differently
print(f"{'step':>4} {dev:>10} {'cpu':>10} {'rel diff':>9}", file=sys.stderr)
worst = 0.0
for i, (x, y) in enumerate(zip(a, b)):
    d = abs(x - y) / abs(y)
    worst = max(worst, d)
    print(f"{i:>4} {x:>10.5f} {y:>10.5f} {d:>9.2e}", file=sys.stderr)
ok = len(a) == len(b) == steps and worst <= tol and a[-1] < a[0]
print(f"{len(a)} and {len(b)} steps (of {steps}), worst relative difference {worst:.2e} (tolerance {tol}); loss {a[0]:.4f} -> {a[-1]:.4f}"
      + ("" if ok else " — DISAGREE or did not learn"))
sys.exit(0 if ok else 1)
PY
) || rc=$?
  echo "$detail"
  return $rc
}

# ---- the head-to-head and the tutorial MLP -------------------------------------------
head_to_head() {
  local rc=0 flags=()
  case $mode in
    dry) flags=(--dry-run --run-timeout 120) ;;
    # The MLP at width 8192 (537M parameters): at 20480 its offloaded run pins
    # and steps 54 GB of host state, minutes of the budget.
    quick) flags=(--run-timeout 100 --mlp-width 8192) ;;
    long) flags=(--long --run-timeout 150) ;;
  esac
  timeout -k 10 "$PHASE_LIMIT" "$pack/bench/run.sh" --bin "$bin" --out "$work/bench" "${flags[@]}" || rc=$?
  local f
  for f in bench.log results.jsonl table.md; do [[ -f $work/bench/$f ]] && mv "$work/bench/$f" "$OUT/$f"; done
  detail="table below; every run's output in bench.log"
  return $rc
}

if [[ $mode != long ]]; then
  phase "CUDA tests" cuda-tests.log 150 cuda_tests
  phase "--device $device against --device cpu" agreement.log 90 agreement
fi
# Whatever the earlier phases left of the budget, up to 8 minutes.
phase "head-to-head and tutorial MLP" bench.log.tmp 480 head_to_head
# The phase's own output (the bench script's progress) goes after its log.
if [[ -f $OUT/bench.log.tmp ]]; then
  cat "$OUT/bench.log.tmp" >> "$OUT/bench.log"
  rm -f "$OUT/bench.log.tmp"
fi

{
  echo "# fsdp-cpp GPU pack: run.sh${1:+ $1}, $(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - start)) s"
  echo
  echo "Pack: $(pack_value project_commit), torch $(pack_value torch_version)."
  echo
  echo "| phase | result | seconds | details |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  if [[ -f $OUT/table.md ]]; then
    echo
    cat "$OUT/table.md"
  fi
} > "$OUT/summary.md"
cat "$OUT/summary.md"
files=$(ls -A "$OUT" | wc -l)
((files <= 8)) || { echo "run.sh: $files files in OUT, more than 8" >&2; failed=1; }
exit $failed

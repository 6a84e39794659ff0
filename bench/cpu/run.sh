#!/usr/bin/env bash
# CPU head-to-head: fsdp-train against PyTorch FSDP2 eager (transformers' LlamaForCausalLM,
# fully_shard per decoder layer + root, SDPA attention) on the `small` preset (25.7M) and a
# 99.9M Llama (bench/cpu/llama-100m.json), at 1 and 2 processes, FULL_SHARD fp32, seq 256,
# batch 4 per rank, the same weights, batches and AdamW on both sides, the same threads per
# process. Prints tokens/s (wall time between rank 0's per-step log lines) and peak RSS per
# rank (ru_maxrss of each rank process), both measured from outside the processes, with the
# ratios ours / FSDP2, and appends the table to bench/RESULTS.md with the command, the date
# and the machine. How both sides are run and measured: bench/cpu/headtohead.py.
#
#   bench/cpu/run.sh [--models small,100m] [--nproc 1,2] [--seq-len 256] [--batch-size 4]
#                    [--steps 10] [--warmup 3] [--threads N] [--ac off,tail] [--rounds 1] [--profile]
#                    [--no-record]
#   bench/cpu/run.sh --short     # 1 warm-up + 3 measured steps: checks the harness end to end
#
# --ac: activation checkpointing rows, comma-separated: off, or an --ac-policy of ours (full, tail,
# selective) against FSDP2 with every decoder layer checkpointed (non-reentrant torch.utils.checkpoint).
# --rounds N: every row N times in turn, each ratio against FSDP2's run of the same round; the table gives
# the medians (a loaded machine's speed drifts between runs far more than the sides differ).
# --profile: also runs each side once at 1 process under `perf record` (and torch.profiler on
# the FSDP2 side) and prints where the CPU time goes; the profile is not recorded.
# Timings need a quiet machine: the script prints the load average it started with.
# Builds fsdp-train, fsdp-inspect and peer_batches in $FSDP_BUILD_DIR (default build/, which
# must be configured: scripts/build.sh). Python: the project's environment (scripts/venv.sh).
# Exit status: 0 when every row was measured and both sides' first-step losses agree.
set -euo pipefail
cd "$(dirname "$0")/../.."

args=("$@")
record=1
short=0
pass=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-record) record=0; shift ;;
    --short) short=1; pass+=(--steps 3 --warmup 1); shift ;;
    --profile) pass+=("$1"); shift ;;
    --models|--nproc|--seq-len|--batch-size|--steps|--warmup|--threads|--profile-steps|--ac|--rounds)
      [[ $# -ge 2 ]] || { echo "bench/cpu/run.sh: $1 needs a value" >&2; exit 2; }
      pass+=("$1" "$2"); shift 2 ;;
    *) echo "bench/cpu/run.sh: unknown argument '$1' (see the header of bench/cpu/run.sh)" >&2; exit 2 ;;
  esac
done

build=${FSDP_BUILD_DIR:-build}
[[ -f $build/build.ninja ]] || { echo "bench/cpu/run.sh: $build is not a configured Ninja build directory;" \
  "run scripts/build.sh (or set FSDP_BUILD_DIR)" >&2; exit 2; }
ninja -C "$build" fsdp-train fsdp-inspect peer_batches > /dev/null
PYTHON="$(scripts/venv.sh)/bin/python"

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench/cpu/run.sh: load average before the run: $load_before" >&2
table=$(mktemp)
trap 'rm -f "$table"' EXIT
status=0
"$PYTHON" bench/cpu/headtohead.py --build "$build" --table-out "$table" "${pass[@]}" || status=$?

if [[ $record -eq 1 && -s $table ]]; then
  {
    echo
    echo "## CPU head-to-head vs PyTorch FSDP2 — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Command: \`bench/cpu/run.sh ${args[*]}\`"
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m)," \
         "load average $load_before before the run"
    echo "Processor: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    [[ $short -eq 0 ]] || echo "Short mode (1 warm-up + 3 measured steps): a check of the harness, not a measurement."
    echo
    cat "$table"
  } >> bench/RESULTS.md
  echo "bench/cpu/run.sh: appended to bench/RESULTS.md" >&2
fi
exit $status

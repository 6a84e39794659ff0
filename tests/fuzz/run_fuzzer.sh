#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS REGRESSIONS WORK RUNS [SECONDS]
# RUNS = 0: runs every input in SEEDS and REGRESSIONS once (a replay).
# Otherwise fuzzes RUNS inputs with the fixed seed FSDP_FUZZ_SEED (1), starting from SEEDS,
# REGRESSIONS and WORK/corpus (what earlier runs found, kept between runs), so that a clean
# checkout always tries the same inputs and a test result does not depend on the machine's
# speed; SECONDS (300) caps the time. RUNS = -1 fuzzes for SECONDS with a random seed (the
# exploring mode of docs/testing.md, "Fuzzing"). Exits non-zero on a finding, whose input is saved
# as WORK/crash-* (or leak-*, timeout-*, oom-*): to keep it as a regression, copy it into
# REGRESSIONS once the bug is fixed.
set -euo pipefail
fuzzer=$1 seeds=$2 regressions=$3 work=$4 runs=$5 seconds=${6:-300}
mkdir -p "$work/corpus" "$work/files"
export FSDP_FUZZ_DIR="$work/files"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$work/")
# A target's dictionary (tests/fuzz/dicts/<target>.dict), when it has one: tokens the mutations splice in.
dict="$(dirname "$0")/dicts/$(basename "$seeds").dict"
[[ -f $dict ]] && limits+=(-dict="$dict")
if [[ $runs == 0 ]]; then
  inputs=()
  for d in "$seeds" "$regressions"; do
    [[ -d $d ]] && inputs+=("$d"/*)
  done
  echo "run_fuzzer.sh: replaying ${#inputs[@]} inputs"
  exec "$fuzzer" "${limits[@]}" "${inputs[@]}"
fi
dirs=("$work/corpus" "$seeds")
[[ -d $regressions ]] && dirs+=("$regressions")
budget=(-max_total_time="$seconds")
((runs > 0)) && budget+=(-runs="$runs" -seed="${FSDP_FUZZ_SEED:-1}")
exec "$fuzzer" "${limits[@]}" "${budget[@]}" -print_final_stats=1 "${dirs[@]}"

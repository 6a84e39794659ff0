#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS REGRESSIONS WORK SECONDS
# SECONDS = 0: runs every input in SEEDS and REGRESSIONS once (a replay).
# Otherwise fuzzes for SECONDS, starting from SEEDS, REGRESSIONS and WORK/corpus (what
# earlier runs found, kept between runs). Exits non-zero on a finding, whose input is
# saved as WORK/crash-* (or leak-*, timeout-*, oom-*): to keep it as a regression, copy
# it into REGRESSIONS once the bug is fixed.
set -euo pipefail
fuzzer=$1 seeds=$2 regressions=$3 work=$4 seconds=$5
mkdir -p "$work/corpus" "$work/files"
export FSDP_FUZZ_DIR="$work/files"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$work/")
if [[ $seconds == 0 ]]; then
  inputs=()
  for d in "$seeds" "$regressions"; do
    [[ -d $d ]] && inputs+=("$d"/*)
  done
  echo "run_fuzzer.sh: replaying ${#inputs[@]} inputs"
  exec "$fuzzer" "${limits[@]}" "${inputs[@]}"
fi
dirs=("$work/corpus" "$seeds")
[[ -d $regressions ]] && dirs+=("$regressions")
exec "$fuzzer" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 "${dirs[@]}"

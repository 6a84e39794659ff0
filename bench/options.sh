#!/usr/bin/env bash
# Runs the FSDP option sweep (bench_options: small Llama, 2 CPU processes) and
# appends its table to bench/RESULTS.md with the command, the date and the
# machine. Extra arguments go to bench_options (e.g. --steps 8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cmd="build/bench/options/bench_options $*"
$cmd | tee "$out"
{
  echo
  echo "## Option sweep — $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Command: \`bench/options.sh $*\` ($cmd)"
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  grep -v '^|-' "$out" | sed -n '1p'
  grep '^|' "$out"
} >> bench/RESULTS.md
echo "bench/options.sh: appended to bench/RESULTS.md"

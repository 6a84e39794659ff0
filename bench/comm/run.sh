#!/usr/bin/env bash
# Collective bandwidth of the CPU process group (bench_comm) through shared memory between
# the ranks (the default on one host), through loopback TCP (FSDP_SHM=0), of c10d's
# ProcessGroupGloo under our ProcessGroup in the same binary (bench_comm's RESULT-GLOO lines:
# rank-order sums; RESULT-GLOO-NATIVE: Gloo's own), and of PyTorch's gloo backend from Python
# (torch_gloo.py in the project's Python environment), same sizes, same timing rule, same run,
# on 127.0.0.1. The three alternate for --rounds rounds (a shared
# machine's load drifts) and each keeps its best round. Prints GB/s of each and the ratios,
# and appends the table to bench/RESULTS.md with the command, the date and the machine
# (--no-record: print only).
#
#   bench/comm/run.sh [--build DIR] [--nproc N] [--iters K] [--mib a,b,c] [--rounds R] [--no-record]
#
# --build: a configured build directory with bench_comm built (default: build;
# cmake --build DIR --target bench_comm).
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "bench/comm/run.sh: $*" >&2; exit 2; }

build=build nproc=2 iters=10 mib=1,16,64 rounds=2 record=1
args=("$@")
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-record) record=0; shift ;;
    *) die "unknown argument $1 (see the header of this script)" ;;
  esac
done
bin=$build/bench/comm/bench_comm
[[ -x $bin ]] || die "no $bin — configure with -DFSDP_BUILD_BENCH=ON and build it: cmake --build $build --target bench_comm"
python=$(scripts/venv.sh)/bin/python

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for ((i = 1; i <= rounds; ++i)); do
  echo "--- round $i/$rounds: bench_comm (shared memory)"
  FSDP_SHM=1 "$bin" --nproc "$nproc" --iters "$iters" --mib "$mib" | tee "$out/shm.$i"
  echo "--- round $i/$rounds: bench_comm (loopback TCP, FSDP_SHM=0)"
  FSDP_SHM=0 "$bin" --nproc "$nproc" --iters "$iters" --mib "$mib" | tee "$out/ours.$i"
  echo "--- round $i/$rounds: torch gloo"
  "$python" bench/comm/torch_gloo.py --nproc "$nproc" --iters "$iters" --mib "$mib" | tee "$out/theirs.$i"
done

table=$("$python" - "$out" "$nproc" "$iters" "$rounds" <<'EOF'
import glob, sys
out, nproc, iters, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def best(pattern, label="RESULT"):
    r = {}
    for f in glob.glob(f"{out}/{pattern}.*"):
        for line in open(f):
            if line.startswith(label + " "):
                _, op, mib, _, gbs = line.split()
                key = (op, int(mib))
                r[key] = max(r.get(key, 0.0), float(gbs))
    return r
shm, ours, theirs = best("shm"), best("ours"), best("theirs")
# c10d's ProcessGroupGloo ran inside both bench_comm runs: the best of them.
def best_of(patterns, label):
    r = {}
    for p in patterns:
        for k, v in best(p, label).items():
            r[k] = max(r.get(k, 0.0), v)
    return r
gloo, native = best_of(["shm", "ours"], "RESULT-GLOO"), best_of(["shm", "ours"], "RESULT-GLOO-NATIVE")
print(f"{nproc} processes on 127.0.0.1, fp32, {iters} calls per size, best of {rounds} alternating rounds; "
      "GB/s of the full buffer (higher is better). c10d gloo: c10d's ProcessGroupGloo under our ProcessGroup "
      "in bench_comm's processes (rank-order sums; native: Gloo's own reduce_scatter and allreduce); "
      "torch gloo: PyTorch's from Python")
print()
print("| op             |   MiB |   shm GB/s |   tcp GB/s | c10d gloo GB/s | gloo native GB/s | torch gloo GB/s "
      "| shm / tcp | shm / c10d gloo | shm / gloo native | shm / torch gloo |")
print("|----------------|-------|------------|------------|----------------|------------------|-----------------"
      "|-----------|-----------------|-------------------|------------------|")
def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"
for key in sorted(ours, key=lambda k: (k[1], ["all_gather", "reduce_scatter", "all_reduce"].index(k[0]))):
    s, a, g, n, b = shm.get(key), ours[key], gloo.get(key), native.get(key), theirs.get(key)
    print(f"| {key[0]:<14} | {key[1]:>5} | {(s or 0):>10.2f} | {a:>10.2f} | {(g or 0):>14.2f} | {(n or 0):>16.2f} | "
          f"{(b or 0):>15.2f} | {ratio(s, a):>9} | {ratio(s, g):>15} | {ratio(s, n):>17} | {ratio(s, b):>16} |")
EOF
)
echo
echo "$table"
if [[ $record == 1 ]]; then
  {
    echo
    echo "## Collectives: shared memory and TCP vs c10d Gloo (same binary) and PyTorch gloo — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "Command: \`bench/comm/run.sh ${args[*]}\` ($bin; bench/comm/torch_gloo.py, torch $("$python" -c 'import torch; print(torch.__version__)'))"
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m), load average $load_before before the run"
    echo
    echo "$table"
  } >> bench/RESULTS.md
  echo "bench/comm/run.sh: appended to bench/RESULTS.md"
fi

# shellcheck shell=bash disable=SC2034  # BUILD, record, pass and PY are the callers'
# Sourced by bench/cluster/run.sh and run_headtohead.sh: what both do before their benchmark.
#
#   cluster_bench_setup "TARGET ..." "$@"
#
# Moves to the repository's root; sets BUILD ($FSDP_BUILD_DIR, default build/, configured by
# scripts/build.sh), record (--record, or nothing when the arguments hold --no-record), pass (the
# other arguments) and PY (the project's Python); builds the targets in BUILD.
cluster_bench_setup() {
  local targets=$1
  shift
  cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
  BUILD=${FSDP_BUILD_DIR:-build}
  record=(--record)
  pass=()
  local arg
  for arg in "$@"; do
    if [[ "$arg" == --no-record ]]; then record=(); else pass+=("$arg"); fi
  done
  # shellcheck disable=SC2086  # a list of targets
  cmake --build "$BUILD" -j "$(nproc)" --target $targets > /dev/null
  PY=$(scripts/venv.sh)/bin/python
}

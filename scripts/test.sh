#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite (what CI runs).
# Extra arguments go to ctest (e.g. -R Parity).
#
# Steps (docs/testing.md, "How CI runs"):
#  1. scripts/deps.sh: Debian packages and the project's Python environment.
#  2. The CUDA build (build-cuda/: -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON against the CUDA LibTorch and
#     NCCL of the same PyTorch wheel): every target, the CUDA tests included. The whole CPU suite
#     runs from it (ctest -LE cuda: the tests labelled `cuda` need a GPU; their checks also run on
#     the CPU as cpu.*), so a test that fails only in the CUDA configuration fails CI, and one build
#     serves both (its start-up cost per test process is in docs/testing.md).
#  3. The CPU-only configuration (build/, the default of scripts/build.sh): the libraries whose
#     sources differ between the two configurations (fsdp_common: device.cpp; fsdp_comm: the NCCL
#     stub) are compiled, so that configuration keeps building.
#  4. The fuzz build (build-fuzz/: clang++, -DFSDP_FUZZ=ON, only the parsers, with the sanitizers) and
#     its tests (label fuzz: each fuzz target replays its corpus, then fuzzes 20,000 inputs with a
#     fixed seed); after the main suite. FSDP_SKIP_FUZZ=1 leaves it out.
#  5. The GPU pack (scripts/gpu-pack.sh) on a machine like the GPU machine: inside a minimal Debian
#     12 root (scripts/minroot.sh: debootstrap minbase plus python3, built once per machine and
#     cached), where the only other things are the pack and the project's Python environment
#     (read-only, at their own paths): its run.sh --self-test (a phase made to hang must be
#     reported and leave no process), then run.sh --dry-run, whose table must give the compiled
#     FSDP2 rows' reason (the root has no C++ compiler). FSDP_SKIP_PACK=1 leaves it out (and
#     it is left out when ctest arguments select tests).
# Under CI=true a skipped test fails the run; the summary names every skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
BUILD_DIR=${FSDP_BUILD_DIR:-build-cuda}

echo "test.sh: the CUDA build ($BUILD_DIR: -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON)"
SECONDS=0
FSDP_BUILD_DIR=$BUILD_DIR scripts/build.sh -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON
echo "test.sh: CUDA build done in ${SECONDS}s"

echo "test.sh: the CPU-only configuration (build: fsdp_common, fsdp_comm)"
SECONDS=0
mkdir -p build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_PYTHON="$(scripts/venv.sh)/bin/python" > build/configure.log ||
  { cat build/configure.log; echo "test.sh: configuring build/ failed" >&2; exit 1; }
cmake --build build -j "$(nproc)" --target fsdp_common fsdp_comm > build/build.log 2>&1 ||
  { tail -n 40 build/build.log; echo "test.sh: the CPU-only configuration failed to compile (build/build.log)" >&2; exit 1; }
echo "test.sh: CPU-only libraries compiled in ${SECONDS}s"

fuzz=0
if [[ "${FSDP_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "test.sh: building the fuzz targets (build-fuzz: clang++, -DFSDP_FUZZ=ON)"
  SECONDS=0
  mkdir -p build-fuzz
  FSDP_BUILD_DIR=build-fuzz scripts/build.sh -DFSDP_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ > build-fuzz/build.log 2>&1 ||
    { tail -n 40 build-fuzz/build.log; echo "test.sh: the fuzz build failed (build-fuzz/build.log)" >&2; exit 1; }
  echo "test.sh: fuzz build done in ${SECONDS}s"
  fuzz=1
fi

junits=("$BUILD_DIR/ctest-junit.xml")
rm -f "${junits[0]}" build-fuzz/ctest-junit.xml
rc=0
SECONDS=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 900 -LE '^cuda$' --output-junit ctest-junit.xml "$@") ||
  rc=$?
echo "test.sh: the CPU suite took ${SECONDS}s"
if ((fuzz)); then
  junits+=(build-fuzz/ctest-junit.xml)
  (cd build-fuzz && ctest --output-on-failure -j "$(nproc)" --timeout 900 --output-junit ctest-junit.xml "$@") || rc=$?
fi

# The GPU pack, as the GPU machine gets it: built, then run inside a minimal root that has nothing
# else: no build tree, no checkout, none of this machine's libraries beyond the base system (run.sh
# finds torch through the Python; the pack's binaries carry no path into the checkout or the
# environment). The self-test first (seconds): a hung phase is stopped with its whole process group.
if [[ "${FSDP_SKIP_PACK:-0}" != 1 && $# -eq 0 ]]; then
  SECONDS=0
  fresh=$(mktemp -d)
  trap 'rm -rf "$fresh"' EXIT
  pack_rc=0
  FSDP_CUDA_BUILD_DIR=$BUILD_DIR scripts/gpu-pack.sh "$fresh/pack" || pack_rc=$?
  venv=$(scripts/venv.sh)
  mkdir -p "$fresh/out"
  in_root() { scripts/minroot.sh --ro "$fresh/pack" --ro "$venv" --rw "$fresh/out" -- /usr/bin/env PYTHON="$venv/bin/python" "$@"; }
  if ((pack_rc == 0)); then
    # With the fallback libraries forced on: the wrappers that keep them from Python are used.
    in_root OUT="$fresh/out/self-test" FSDP_PACK_FORCE_FALLBACK=1 "$fresh/pack/run.sh" --self-test || pack_rc=$?
    if pgrep -f fsdp-pack-selftest-hang > /dev/null; then
      echo "test.sh: the pack's self-test left processes running: $(pgrep -af fsdp-pack-selftest-hang)" >&2
      kill -KILL $(pgrep -f fsdp-pack-selftest-hang) 2> /dev/null
      pack_rc=1
    fi
  fi
  if ((pack_rc == 0)); then
    in_root OUT="$fresh/out/dry-run" "$fresh/pack/run.sh" --dry-run || pack_rc=$?
    # The root has no C++ compiler: FSDP2's compiled rows must say so in the table, not vanish.
    for ckpt in off on; do
      row="| (d) PyTorch FSDP2, compiled | $ckpt | - | skipped: no C++ compiler for inductor's CPU backend"
      grep -qF "$row" "$fresh/out/dry-run/table.md" ||
        { echo "test.sh: the dry run's table has no row '$row...'" >&2; pack_rc=1; }
    done
  fi
  if ((pack_rc != 0)); then
    echo "test.sh: the GPU pack's build, self-test or dry run failed (exit $pack_rc) after ${SECONDS}s" >&2
    rc=1
  else
    echo "test.sh: GPU pack built, self-tested and dry-run in a minimal root in ${SECONDS}s"
  fi
fi

# Skipped tests: named always; a failure under CI=true.
# CTest writes a skipped test (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION) as status="notrun" with
# a <skipped> element, and a disabled one as status="disabled"; both count as skipped here. Tests
# excluded by -LE cuda are not in the report at all: they run on a GPU (scripts/gpu-pack.sh).
skipped=()
for junit in "${junits[@]}"; do
  [[ -f "$junit" ]] || continue
  mapfile -t -O "${#skipped[@]}" skipped < <(sed -n -E 's/.*<testcase name="([^"]*)".*status="(skipped|notrun|disabled)".*/\1/p' "$junit")
done
if [[ -f "${junits[0]}" ]]; then
  if ((${#skipped[@]} > 0)); then
    echo "test.sh: ${#skipped[@]} skipped: ${skipped[*]}"
    if [[ "${CI:-}" == true ]]; then
      echo "test.sh: CI=true: a skipped test is a failure" >&2
      rc=1
    fi
  else
    echo "test.sh: no test skipped"
  fi
fi
exit $rc

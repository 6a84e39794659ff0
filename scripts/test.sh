#!/usr/bin/env bash
# README command 2: install dependencies, build, run the whole test suite (what CI runs).
# Extra arguments go to ctest (e.g. -R Parity).
#
# Steps:
#  1. scripts/deps.sh: Debian packages and the project's Python environment.
#  2. The CPU build (build/) and its test suite.
#  3. The CUDA build (build-cuda/): every target compiled and linked against the CUDA LibTorch and
#     NCCL of the same PyTorch wheel, so a GPU session has only running left. Nothing of it runs
#     here (no GPU); FSDP_SKIP_CUDA_BUILD=1 leaves it out.
#  4. The fuzz build (build-fuzz/: clang++, -DFSDP_FUZZ=ON, only the parsers, with the sanitizers) and
#     its tests (label fuzz: each fuzz target replays its corpus, then fuzzes 20,000 inputs with a fixed seed); after the main
#     suite. FSDP_SKIP_FUZZ=1 leaves it out.
# Under CI=true a skipped test fails the run; the summary names every skipped test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh

if [[ "${FSDP_SKIP_CUDA_BUILD:-0}" != 1 ]]; then
  echo "test.sh: linking the CUDA build (build-cuda: -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON)"
  SECONDS=0
  mkdir -p build-cuda
  FSDP_BUILD_DIR=build-cuda scripts/build.sh -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON > build-cuda/build.log 2>&1 ||
    { tail -n 40 build-cuda/build.log; echo "test.sh: the CUDA build failed (build-cuda/build.log)" >&2; exit 1; }
  echo "test.sh: CUDA build linked every target in ${SECONDS}s"
fi

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

BUILD_DIR=${FSDP_BUILD_DIR:-build}
junits=("$BUILD_DIR/ctest-junit.xml")
rm -f "${junits[0]}" build-fuzz/ctest-junit.xml
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 900 --output-junit ctest-junit.xml "$@") || rc=$?
if ((fuzz)); then
  junits+=(build-fuzz/ctest-junit.xml)
  (cd build-fuzz && ctest --output-on-failure -j "$(nproc)" --timeout 900 --output-junit ctest-junit.xml "$@") || rc=$?
fi

# Skipped tests: named always; a failure under CI=true. (The CPU suite has no CUDA-only test:
# those live in the CUDA build, which scripts/gpu.sh runs on a GPU machine.)
# CTest writes a skipped test (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION) as status="notrun" with
# a <skipped> element, and a disabled one as status="disabled"; both count as skipped here.
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

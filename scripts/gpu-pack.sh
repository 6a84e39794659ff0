#!/usr/bin/env bash
# The GPU pack: everything a first run on a GPU machine needs, built here, so
# that machine — PyTorch with CUDA installed, nothing else, no installs — only
# runs it (docs/gpu.md).
#
#   scripts/gpu-pack.sh DIR
#
# Builds fsdp-train, fsdp-inspect, bench_mlp and the CUDA tests (test_cuda) in
# the CUDA configuration (-DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON; the build
# tree $FSDP_CUDA_BUILD_DIR, default build-cuda/, configured first if needed)
# and stages into DIR, which must not exist or be empty:
#   bin/     the executables, stripped; RUNPATH $ORIGIN/../lib, nothing else
#   lib/     the shared libraries they need that neither the torch installation
#            nor the C library provides — found from the binaries' own needs
#            (ldd), e.g. zlib, libsentencepiece and its module — stripped,
#            RUNPATH $ORIGIN (each finds its carried neighbours beside it: the
#            module its libsentencepiece, on a machine that has none);
#            lib/fallback/ those of them that need a newer C library than the
#            binaries do (this machine's libstdc++ and libgcc_s), RUNPATH
#            $ORIGIN too: run.sh uses them only where the GPU machine's own
#            copies are missing or too old, and only for the pack's binaries
#   bench/   the head-to-head's scripts (bench/gpu/: run.sh, hf_fsdp.py,
#            matmul_peak.py, report.py)
#   run.sh   the one call on the GPU machine (see its header)
#   PACK     what it was built from: torch version, git hash, CUDA and NCCL of
#            the build, the project's commit, the highest GLIBC version needed,
#            and each carried library with the binary that needs it
# Nothing in it names a path of this machine: run.sh finds the torch
# libraries through the Python that imports torch on the machine it runs on.
# At most 32 MB (checked: the command fails above that). Every library the pack
# carries must resolve to the pack's own copy from every file that needs it
# (checked here with ldd, and again by run.sh's probe on the machine it runs
# on). Needs patchelf (scripts/deps.sh installs it).
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
die() { echo "scripts/gpu-pack.sh: $*" >&2; exit "${2:-1}"; }
[[ $# -eq 1 && $1 != -* ]] || die "usage: scripts/gpu-pack.sh DIR (a new or empty folder)" 2
dest=$1
if [[ -e $dest ]]; then
  [[ -d $dest && -z $(ls -A "$dest") ]] || die "$dest exists and is not an empty folder; name a new one" 2
fi
readonly kMaxBytes=$((32 * 1024 * 1024))

build=${FSDP_CUDA_BUILD_DIR:-build-cuda}
VENV=$(scripts/venv.sh)
PYTHON=$VENV/bin/python
if [[ ! -f $build/CMakeCache.txt ]]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_PYTHON="$PYTHON" \
    -DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON > "$build/configure.log" ||
    die "configuring $build failed ($build/configure.log)"
fi
grep -q '^FSDP_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" && grep -q '^FSDP_WITH_NCCL:BOOL=ON' "$build/CMakeCache.txt" ||
  die "$build is not a CUDA build (FSDP_WITH_CUDA and FSDP_WITH_NCCL must be ON); set FSDP_CUDA_BUILD_DIR"
cmake --build "$build" -j "$(nproc)" --target fsdp-train fsdp-inspect bench_mlp test_cuda fsdp_spm_shim

torch_dir=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
site=$(dirname "$torch_dir")
mkdir -p "$dest/bin" "$dest/lib" "$dest/bench"
cp "$build/apps/fsdp-train" "$build/apps/fsdp-inspect" "$build/bench/gpu/bench_mlp" "$build/tests/cuda/test_cuda" \
  "$dest/bin/"
cp "$build/src/data/libfsdp_spm_shim.so" "$dest/lib/"
cp bench/gpu/run.sh bench/gpu/hf_fsdp.py bench/gpu/matmul_peak.py bench/gpu/report.py "$dest/bench/"
cp scripts/gpu-pack-run.sh "$dest/run.sh"
chmod +x "$dest/run.sh" "$dest/bench/run.sh"

# The libraries to carry: what the staged files need (ldd resolves it here, the
# binaries' RUNPATH still pointing into the environment), except what the
# torch installation provides (torch/lib, the nvidia-* packages beside it: the
# GPU machine's torch brings its own) and the C library itself (glibc's own
# files cannot be carried: the loader and libc go together).
is_c_library() { [[ $1 =~ ^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec|ld-linux.*)\.so ]]; }
# The highest GLIBC symbol version the given files need.
glibc_of() { for f in "$@"; do objdump -T "$f"; done | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1; }
newer() { [[ $1 != "$2" && $(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n 1) == "$1" ]]; }
declare -A carried=()  # soname -> the staged file that needs it
for f in "$dest"/bin/* "$dest"/lib/libfsdp_spm_shim.so; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $path == "not" ]] && die "$(basename "$f") needs $soname, which ldd cannot find here"
    is_c_library "$soname" && continue
    [[ $(realpath "$path") == "$(realpath "$site")"/* ]] && continue
    [[ -n ${carried[$soname]:-} ]] && continue
    carried[$soname]=$(basename "$f")
    cp -L "$path" "$dest/lib/$soname"
  done < <(ldd "$f")
done

# A carried library that needs a newer C library than the binaries themselves
# would raise what the GPU machine must have: it becomes a fallback, used
# only where that machine lacks its own (run.sh's probe decides).
base_glibc=$(glibc_of "$dest"/bin/* "$dest"/lib/libfsdp_spm_shim.so)
mkdir -p "$dest/lib/fallback"
declare -A fallback=()
for soname in "${!carried[@]}"; do
  need=$(glibc_of "$dest/lib/$soname")
  if [[ -n $need ]] && newer "$need" "$base_glibc"; then
    mv "$dest/lib/$soname" "$dest/lib/fallback/$soname"
    fallback[$soname]=$need
  fi
done

# Strip, then set the search paths (patchelf after strip: the other order can
# break the file): binaries find lib/ beside them; a library its neighbours
# in its own folder. A library without it finds a carried neighbour only
# where the machine has its own copy (libfsdp_spm_shim.so's libsentencepiece
# did so at 9fc8542: found on a full machine, missing on the GPU machine).
command -v patchelf > /dev/null || die "patchelf is not installed (scripts/deps.sh installs it)"
libs=("$dest"/lib/*.so* "$dest"/lib/fallback/*)
chmod u+w "${libs[@]}"
strip --strip-unneeded "$dest"/bin/* "${libs[@]}"
for f in "$dest"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "${libs[@]}"; do patchelf --set-rpath '$ORIGIN' "$f"; done
for f in "$dest"/bin/* "${libs[@]}"; do
  want='$ORIGIN'
  [[ $f == "$dest"/bin/* ]] && want='$ORIGIN/../lib'
  runpath=$(readelf -d "$f" | sed -n -E 's/.*\((RPATH|RUNPATH)\).*\[(.*)\]/\2/p')
  [[ $runpath == "$want" ]] || die "$f has RUNPATH '$runpath', not '$want'"
done
# Every carried library resolves to the pack's copy, with only the torch
# libraries on the search path (as run.sh's probe sets it there).
torch_libs=$torch_dir/lib$(printf ':%s' "$site"/nvidia/*/lib)
for f in "$dest"/bin/* "$dest"/lib/*.so*; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" && -e $dest/lib/$soname ]] || continue
    [[ $path != not && $(realpath "$path") == "$(realpath "$dest/lib/$soname")" ]] ||
      die "$(basename "$f") finds $soname at $path, not the pack's lib/$soname"
  done < <(LD_LIBRARY_PATH=$torch_libs ldd "$f")
done

# The highest GLIBC symbol version needed without the fallbacks: the probe
# compares it with the GPU machine's C library.
glibc=$(glibc_of "$dest"/bin/* "$dest"/lib/*.so*)
commit=$(git rev-parse HEAD 2> /dev/null || echo unknown)
[[ -z $(git status --porcelain --untracked-files=no 2> /dev/null) ]] || commit="$commit (with uncommitted changes)"
{
  echo "# fsdp-cpp GPU pack: what run.sh's probe checks the GPU machine against."
  "$PYTHON" - <<'PY'
import torch
print(f"torch_version={torch.__version__}")
print(f"torch_git={torch.version.git_version}")
print(f"torch_cuda={torch.version.cuda}")
v = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
print("nccl_built=" + (".".join(map(str, v)) if isinstance(v, tuple) else str(v)))
PY
  echo "project_commit=$commit"
  echo "built_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "glibc_needed=$glibc"
  for soname in $(printf '%s\n' "${!carried[@]}" | sort); do
    if [[ -n ${fallback[$soname]:-} ]]; then
      echo "carried=lib/fallback/$soname (needed by ${carried[$soname]}; a fallback: it needs GLIBC ${fallback[$soname]})"
    else
      echo "carried=lib/$soname (needed by ${carried[$soname]})"
    fi
  done
} > "$dest/PACK"

bytes=$(du -sb "$dest" | cut -f1)
((bytes <= kMaxBytes)) || die "the pack is $bytes bytes, over the 32 MB limit (du -ab $dest)"
echo "scripts/gpu-pack.sh: $dest: $((bytes / 1024)) KiB; carried: $(printf "%s\n" "${!carried[@]}" | sort | tr "\n" " ")"

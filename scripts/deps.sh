#!/usr/bin/env bash
# Installs every dependency of the build, the demo and the whole test suite:
#  - Debian 12 packages (compilers, header-only libraries, the deployment test beds), with
#    apt only for those missing (nothing is touched when all are present);
#  - the project's Python environment (scripts/venv.sh): PyTorch 2.x, whose LibTorch we build
#    on, and the reference systems the tests compare against.
# Prints nothing when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  python3 python3-venv
  nlohmann-json3-dev libcli11-dev libgtest-dev
  zlib1g-dev # gzip-compressed data files (c4's .json.gz), read by the data layer
  # RE2: the regular expressions users give (--freeze, --lr-scale) match in linear time; the
  # programs load libre2 at run time. toml++ (header-only here) reads --config files.
  libre2-dev libtomlplusplus-dev
  # Gloo's headers, which LibTorch's ProcessGroupGloo.hpp includes and the PyTorch wheel does not ship:
  # --backend gloo (c10d's ProcessGroupGloo). Declarations only (Note [Gloo headers] in src/comm/gloo_backend.cpp).
  libgloo-dev
  # SentencePiece: the demo's tokenizer is trained with spm_train at setup; the C++ tokenizer
  # loads libsentencepiece at run time.
  libsentencepiece-dev sentencepiece
  fortunes # the embedded corpus (scripts/prepare_data.sh)
  # The GPU pack (scripts/gpu-pack.sh): patchelf gives its libraries RUNPATH $ORIGIN; debootstrap
  # builds the minimal Debian root its dry run runs in (scripts/minroot.sh).
  patchelf debootstrap
  # fsdp-train --metrics-port: Boost.Beast (header-only) serves the Prometheus endpoint. The tests read it with the
  # Prometheus project's own parser (python3-prometheus-client) and check the Grafana dashboard
  # against its schema with python3-jsonschema (Debian's Python, /usr/bin/python3).
  libboost-dev python3-prometheus-client python3-jsonschema
  doxygen # the API reference from the public headers (target docs; test Docs.Doxygen)
  # The fuzz targets (tests/fuzz, built into build-fuzz by scripts/test.sh): clang with libFuzzer and
  # the sanitizer runtimes; llvm for llvm-symbolizer (readable sanitizer reports).
  clang libclang-rt-14-dev llvm
  # Deployment test beds, run for real by tests/deploy: etcd for torchrun's etcd rendezvous
  # (the PyTorchJob's), and a private one-node Slurm with munge for the sbatch script.
  etcd-server slurm-wlm munge
  # The emulated cluster (tests/cluster): network namespaces, veth pairs and a bridge (ip), rate
  # limits (tc). tests/docs lists the repository's files with git.
  iproute2 git
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} > 0)); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo > /dev/null || { echo "deps.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 2; }
    SUDO="sudo"
  fi
  echo "deps.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

scripts/venv.sh > /dev/null

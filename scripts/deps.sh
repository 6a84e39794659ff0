#!/usr/bin/env bash
# Installs fsdp-cpp's build and test dependencies from Debian 12's archive.
# Idempotent: packages already present are not touched and apt is not called.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev
  libopenblas0-pthread
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libsentencepiece-dev sentencepiece
  libgtest-dev
  python3 python3-yaml
  fortunes
  # torchrun (PyTorch's elastic launcher) for the torchrun test and for users who
  # launch fsdp-train with it: ~34 MB download, ~200 MB installed, well under a
  # minute to install on a fresh machine.
  python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "deps.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 2; }
  SUDO="sudo"
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# Creates the project's Python environment if it does not exist yet, and prints its path.
#
# Every package is pinned in scripts/python-requirements.txt (PyTorch 2.x with its LibTorch,
# transformers, tokenizers, ...). The environment lives outside the checkout, in
#   ${FSDP_VENV:-${XDG_CACHE_HOME:-~/.cache}/fsdp-cpp/venv-<python>-<hash of that file>}
# so that every clone on this machine with the same pins shares one environment (about 5 GB
# installed, 3.5 GB downloaded from PyPI) instead of downloading it again; a change of pins makes
# a new one beside it. An environment is used only once it is complete (a marker written last),
# so an interrupted install is redone, never half-used; concurrent callers wait on a lock.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUIREMENTS=scripts/python-requirements.txt

die() { echo "venv.sh: $*" >&2; exit 2; }

# Debian's interpreter where there is one (deps.sh installs python3-venv for it): a pyenv or
# conda python3 first on PATH would give the environment a different base on every machine.
BASE_PYTHON=${FSDP_BASE_PYTHON:-}
if [[ -z "$BASE_PYTHON" ]]; then
  if [[ -x /usr/bin/python3 ]]; then BASE_PYTHON=/usr/bin/python3; else BASE_PYTHON=$(command -v python3 || true); fi
fi
[[ -n "$BASE_PYTHON" ]] || die "no python3 found: install Debian's python3 and python3-venv (scripts/deps.sh does)"
pyver=$("$BASE_PYTHON" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
key=$(sha256sum "$REQUIREMENTS" | cut -c1-12)
VENV=${FSDP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-cpp/venv-$pyver-$key}
MARKER="$VENV/.fsdp-complete"

if [[ -f "$MARKER" ]] && cmp -s "$MARKER" "$REQUIREMENTS"; then
  echo "$VENV"
  exit 0
fi
# FSDP_VENV_PROBE=1: only say whether the environment exists (exit 1 if not); create nothing.
[[ -z "${FSDP_VENV_PROBE:-}" ]] || exit 1

mkdir -p "$(dirname "$VENV")"
exec 9> "$VENV.lock"
flock 9
if [[ -f "$MARKER" ]] && cmp -s "$MARKER" "$REQUIREMENTS"; then  # made while we waited
  echo "$VENV"
  exit 0
fi

SECONDS=0
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "venv.sh: creating $VENV with $BASE_PYTHON" >&2
  "$BASE_PYTHON" -m venv "$VENV" >&2 ||
    die "'$BASE_PYTHON -m venv' failed: on Debian install python3-venv (scripts/deps.sh does)"
fi
echo "venv.sh: installing the pinned packages of $REQUIREMENTS (about 3.5 GB from PyPI; minutes)" >&2
# --no-cache-dir: the environment is the cache; keeping the wheels too would double the disk used.
"$VENV/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
  -r "$REQUIREMENTS" >&2 || die "pip could not install $REQUIREMENTS into $VENV (see above)"
"$VENV/bin/python" -c 'import torch, transformers, tokenizers' >&2 ||
  die "the environment $VENV was installed but cannot import torch/transformers (see above)"
cp "$REQUIREMENTS" "$MARKER"
echo "venv.sh: $VENV ready in ${SECONDS}s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV"

#!/usr/bin/env bash
# Prints the Python interpreter to use with PyTorch: $PYTHON if set; else the
# project's environment when it exists (scripts/venv.sh, never created here:
# a GPU machine brings its own PyTorch); else python3.
if [[ -n "${PYTHON:-}" ]]; then
  echo "$PYTHON"
  exit 0
fi
cd "$(dirname "$0")/.."
venv=$(FSDP_VENV_PROBE=1 scripts/venv.sh 2> /dev/null) && [[ -x "$venv/bin/python" ]] && { echo "$venv/bin/python"; exit 0; }
echo python3

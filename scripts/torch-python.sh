#!/usr/bin/env bash
# Prints the Python interpreter to use with PyTorch: $PYTHON, else python3,
# else Debian's /usr/bin/python3 when only that one imports torch (a pyenv or
# virtualenv python3 first on PATH may lack it). Prints python3 when none
# does; the caller reports the failed import.
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch' 2> /dev/null && /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  PYTHON=/usr/bin/python3
fi
echo "$PYTHON"

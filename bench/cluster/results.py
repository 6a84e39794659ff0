"""Appends a section to bench/RESULTS.md: '## <title> — <UTC date>' and its body."""

import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


def append(title, body):
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(RESULTS, "a") as f:
        f.write(f"\n## {title} — {stamp}\n\n{body}")

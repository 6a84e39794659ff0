"""What the cluster benchmarks share: waiting for a run's processes, and appending a section to
bench/RESULTS.md ('## <title> — <UTC date>' and its body)."""

import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "RESULTS.md"


def append(title, body):
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(RESULTS, "a") as f:
        f.write(f"\n## {title} — {stamp}\n\n{body}")


def wait_all(procs, logs, timeout_s, name, tail=2500):
    """Waits up to timeout_s (in all) for every process. When one failed or is still running: kills
    those left (a hung peer never outlives the benchmark), prints the tail of every log and raises."""
    end = time.time() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            pass
    codes = [p.poll() for p in procs]
    if any(code != 0 for code in codes):
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            print(f"----- {log}\n{log.read_text(errors='replace')[-tail:]}", file=sys.stderr)
        raise RuntimeError(f"{name}: exit codes {codes} (None: still running after {timeout_s:.0f} s, killed)")

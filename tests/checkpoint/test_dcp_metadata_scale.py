#!/usr/bin/env python3
"""A large run's DCP .metadata loads (issue 50, finding 6).

PyTorch's pickler memoizes about a dozen objects per chunk, so the .metadata of llama3.1-70b with
AdamW at 64 ranks holds ~2M memo entries; earlier versions refused anything past 1,000,000 and
called a valid checkpoint damaged. Built here by PyTorch itself (large_dcp_metadata.py), written,
read by fsdp-cpp's parser (dcp_metadata_probe) and by PyTorch: the counts must agree. Time is
printed, not judged (bench/checkpoint/dcp_metadata.py measures the ratio).

  test_dcp_metadata_scale.py --probe dcp_metadata_probe --work DIR
"""

import argparse
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import large_dcp_metadata as large  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--work", required=True, type=Path)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    md = large.build(world=64)
    data = large.dumps(md)
    path = a.work / ".metadata"
    path.write_bytes(data)
    memo = large.memo_entries(data)
    t0 = time.perf_counter()
    back = pickle.loads(data)
    torch_s = time.perf_counter() - t0
    want = large.counts(back)
    p = subprocess.run([a.probe, str(path)], capture_output=True, text=True, timeout=240)
    print(f"llama3.1-70b, AdamW, 64 ranks: {len(data) / 1e6:.1f} MB, {memo} memo entries; PyTorch read it in "
          f"{torch_s:.2f} s")
    if p.returncode != 0:
        print(f"FAIL: fsdp-cpp's parser refused it (exit {p.returncode}): {p.stderr.strip()}")
        return 1
    got = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"fsdp-cpp read it in {got['seconds']:.2f} s: {got}")
    bad = [k for k in want if got.get(k) != want[k]]
    if memo <= 1_000_000:
        print(f"FAIL: only {memo} memo entries: not past the old limit, the test shows nothing")
        return 1
    if bad:
        print(f"FAIL: counts differ from PyTorch's {want}: {bad}")
        return 1
    print(f"ok: the same {want['tensors']} tensors, {want['chunks']} chunks and {want['storage']} items as PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())

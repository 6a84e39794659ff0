#!/usr/bin/env python3
"""Reading a large run's DCP .metadata: fsdp-cpp's parser against PyTorch's, in the same run (issue 50).

The .metadata of llama3.1-70b with AdamW at --world ranks (tests/checkpoint/large_dcp_metadata.py:
built and pickled by PyTorch itself) is read --rounds times by each side, alternating: PyTorch as
dcp.load reads it (FileSystemReader.read_metadata: the file, then pickle.load of every dataclass),
inside one Python process; fsdp-cpp as its loaders do (read the file, dcp::parse_metadata: the
restricted pickle machine and the checks), inside dcp_metadata_probe, its process start left out.
Best time of each side; the ratio is fsdp-cpp's time over PyTorch's (issue 50: within 2x).

  bench/checkpoint/dcp_metadata.py [--build build-cuda] [--world 64] [--rounds 5] [--record]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "checkpoint"))
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
import large_dcp_metadata as large  # noqa: E402
import peerlib  # noqa: E402

from torch.distributed.checkpoint import FileSystemReader  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build-cuda")
    p.add_argument("--world", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    a = p.parse_args()
    probe = os.path.join(ROOT, a.build, "tests", "checkpoint", "dcp_metadata_probe")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        data = large.dumps(large.build(world=a.world))
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(data)
        memo = large.memo_entries(data)
        torch_s, ours_s, counts = [], [], None
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            md = FileSystemReader(d).read_metadata()
            torch_s.append(time.perf_counter() - t0)
            counts = large.counts(md)
            del md
            out = subprocess.run([probe, os.path.join(d, ".metadata")], capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            ours_s.append(got["seconds"])
            if any(got[k] != counts[k] for k in counts):
                print(f"the counts differ: PyTorch {counts}, fsdp-cpp {got}", file=sys.stderr)
                return 1
    t, o = min(torch_s), min(ours_s)
    table = "\n".join([
        "| reader | best of rounds, s | x PyTorch |",
        "|---|---|---|",
        f"| PyTorch (FileSystemReader.read_metadata) | {t:.3f} | 1.00 |",
        f"| fsdp-cpp (dcp::parse_metadata) | {o:.3f} | **{o / t:.2f}** |"])
    what = (f"llama3.1-70b + AdamW at {a.world} ranks: {len(data) / 1e6:.1f} MB, {memo} memo entries, "
            f"{counts['tensors']} tensors, {counts['chunks']} chunks; {a.rounds} alternating rounds")
    print(what)
    print(table)
    if a.record:
        cmd = "bench/checkpoint/dcp_metadata.py " + " ".join(sys.argv[1:])
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## A large run's DCP .metadata read: fsdp-cpp vs PyTorch — {stamp}\n\n"
                    f"Command: `{cmd}`\n"
                    f"Machine: {os.cpu_count()} cores, {peerlib.processor()}, load average "
                    f"{' '.join(f'{x:.2f}' for x in load_before)} before the run\n\n{what}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

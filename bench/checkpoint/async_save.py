#!/usr/bin/env python3
"""Step-time stall per checkpoint save and peak host memory: synchronous vs --async-checkpoint.

fsdp-train trains --model (the 25.7M `small` Llama by default; bench/cpu/llama-100m.json for a 99.9M
one) at --nproc ranks, FULL_SHARD fp32, --steps steps, three times in the same run:
  none   no checkpoints (the reference for the step time)
  sync   --checkpoint-dir, a save every --every steps, written before the step goes on
  async  the same with --async-checkpoint: a staged copy written by a background thread
Each rank is a direct child of this script (plain-environment rendezvous), so its peak resident set is
the kernel's high-water mark ru_maxrss from wait4() on its pid. Rank 0's output comes through a pipe
and each line is timestamped on arrival: the stall per save is measured from outside as
  (time from the first to the last step line) - (the same in `none`), divided by the saves in between
(the final save, after the last step line, is left out of both), and from the inside as fsdp-train's
checkpoint_stall_s metric (--metrics-file) summed over those saves. Rounds alternate the three runs
(--rounds, medians), as the machine may be shared; compare the ratios of one run.

  bench/checkpoint/async_save.py [--build build] [--model small] [--nproc 2] [--steps 14] [--every 3]
                                 [--rounds 2] [--format sharded|dcp] [--record]
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
sys.path.insert(0, os.path.join(ROOT, "bench", "cpu"))
import peerlib  # noqa: E402  (the repository's process helpers)
from lora_memory import rank_env  # noqa: E402  (the plain-environment rendezvous of one rank)

STEP = re.compile(r"\] Batch (\d+) Loss")


def run(a, tag, extra, work):
    """One training run: {"lines": [(t, line)] of rank 0, "rss": [KiB per rank], "metrics": [records]}."""
    metrics = os.path.join(work, f"{tag}.metrics.jsonl")
    argv = [os.path.join(a.build, "apps", "fsdp-train"), "--model", a.model, "--seq-len", str(a.seq_len),
            "--batch-size", str(a.batch_size), "--max-steps", str(a.steps), "--sharding", "full", "--log-every", "1",
            "--seed", "1337", "--metrics-file", metrics] + extra
    port = peerlib.free_port()
    lines = []
    with peerlib.ProcessSet() as ps:
        for r in range(1, a.nproc):
            ps.start(f"{tag} rank {r}", argv, rank_env(a.nproc, r, port, a.threads), os.path.join(work, f"{tag}.{r}.log"))
        log0 = os.path.join(work, f"{tag}.0.log")
        p0 = subprocess.Popen(argv, env=rank_env(a.nproc, 0, port, a.threads), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        ps.procs.append((f"{tag} rank 0", p0, log0))  # killed with the others on the way out

        def read():
            with open(log0, "w") as log:
                for raw in p0.stdout:
                    line = raw.decode(errors="replace")
                    lines.append((time.monotonic(), line))
                    log.write(line)
                    log.flush()

        reader = threading.Thread(target=read)
        reader.start()
        done = ps.wait(a.timeout_s)
        reader.join()
    return {"lines": lines, "rss": [done[f"{tag} rank {r}"][1].ru_maxrss for r in range(a.nproc)],
            "metrics": [json.loads(l) for l in open(metrics) if l.strip()]}


def measure(r, every, steps):
    """(seconds from the first to the last step line, saves in between, their summed stall metric)."""
    times = [t for t, line in r["lines"] if STEP.search(line)]
    assert len(times) == steps, f"{len(times)} step lines, expected {steps}"
    # The save after c completed steps comes between the lines of steps c-1 and c; an asynchronous one
    # commits after the line of step c at the earliest. Saves with c <= steps - 2 lie wholly between the
    # first and the last line, and their stall metric lands in the records of those lines.
    saves = (steps - 2) // every
    stall = sum(m.get("checkpoint_stall_s", 0.0) for m in r["metrics"] if "loss" in m)
    return times[-1] - times[0], saves, stall


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--model", default="small")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--format", default="sharded", choices=["sharded", "dcp"])
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    a = p.parse_args()
    if (a.steps - 1) % a.every == 0 or a.steps < a.every + 2:
        p.error("--steps - 1 must not be a multiple of --every (a save right before the last step line would be "
                "half inside the measured span), and --steps >= --every + 2")
    load_before = os.getloadavg()
    results = {"none": [], "sync": [], "async": []}
    with tempfile.TemporaryDirectory(prefix="async-save-") as work:
        for k in range(a.rounds):
            for tag in ("none", "sync", "async"):
                extra = []
                if tag != "none":
                    ck = os.path.join(work, f"ckpt-{tag}-{k}")
                    extra = ["--checkpoint-dir", ck, "--checkpoint-every", str(a.every), "--keep-last", "1",
                             "--checkpoint-format", a.format]
                    if tag == "async":
                        extra.append("--async-checkpoint")
                r = run(a, f"{tag}-{k}", extra, work)
                results[tag].append(r)
                span, saves, stall = measure(r, a.every, a.steps)
                print(f"round {k} {tag:5s}: {span:.2f} s first..last step, {saves} saves, metric stall {stall:.3f} s, "
                      f"peak RSS {[round(x / 1024) for x in r['rss']]} MiB", flush=True)
        saved = [line for _, line in results["async"][-1]["lines"] if "Saved checkpoint" in line or "staged" in line]
    load_after = os.getloadavg()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    base = med([measure(r, a.every, a.steps)[0] for r in results["none"]])
    rows, stalls, rss = [], {}, {}
    for tag in ("none", "sync", "async"):
        spans = [measure(r, a.every, a.steps) for r in results[tag]]
        span = med([s[0] for s in spans])
        saves = spans[0][1]
        ext = (span - base) / saves if tag != "none" else 0.0
        internal = med([s[2] for s in spans]) / saves if tag != "none" else 0.0
        peak = [max(r["rss"][i] for r in results[tag]) / 1024 for i in range(a.nproc)]
        stalls[tag], rss[tag] = (ext, internal), max(peak)
        rows.append((tag, span, saves, ext, internal, peak))
    lines = ["| run | first..last step, s | saves | stall/save, s (outside) | stall/save, s (metric) | "
             "peak RSS/rank, MiB | RSS x none |", "|---|---|---|---|---|---|---|"]
    for tag, span, saves, ext, internal, peak in rows:
        lines.append(f"| {tag} | {span:.2f} | {saves if tag != 'none' else '-'} | "
                     f"{ext:.3f} | {internal:.3f} | {' / '.join(f'{x:.0f}' for x in peak)} | "
                     f"{max(peak) / rss['none']:.2f} |")
    ratio_ext = stalls["async"][0] / stalls["sync"][0] if stalls["sync"][0] > 0 else float("nan")
    ratio_int = stalls["async"][1] / stalls["sync"][1] if stalls["sync"][1] > 0 else float("nan")
    lines.append(f"| async / sync | | | **{ratio_ext:.2f}** | **{ratio_int:.2f}** | | "
                 f"{rss['async'] / rss['sync']:.2f} |")
    table = "\n".join(lines)
    print("".join(saved[-4:]))
    print(table)
    if a.record:
        cmd = "bench/checkpoint/async_save.py " + " ".join(sys.argv[1:])
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## Checkpoint save: stall per save and peak RSS, sync vs async — {stamp}\n\n"
                    f"Command: `{cmd}`\n"
                    f"Machine: {os.cpu_count()} cores, {platform.machine()}, load average "
                    f"{' '.join(f'{x:.2f}' for x in load_before)} before the run, "
                    f"{' '.join(f'{x:.2f}' for x in load_after)} after\n\n"
                    f"fsdp-train --model {a.model}, {a.nproc} ranks, FULL_SHARD fp32, seq {a.seq_len} x batch "
                    f"{a.batch_size} per rank, {a.threads} thread(s) per rank, {a.steps} steps, a "
                    f"`--checkpoint-format {a.format}` save every {a.every} steps (--keep-last 1); medians of "
                    f"{a.rounds} alternating rounds. Stall per save from outside: the time from the first to the "
                    f"last step line less the run without checkpoints, over the saves in between; from inside: "
                    f"fsdp-train's checkpoint_stall_s. Peak RSS: each rank's ru_maxrss (wait4).\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The step-time model against measured multi-node runs on the emulated cluster.

    bench/cluster/run.sh [--configs NAME,...] [--steps 10] [--no-record]

For each configuration (nodes x processes per node, strategy, precision,
checkpointing, link rate), on a fresh emulated cluster (tests/cluster/netcluster.py:
network namespaces on a bridge, tc tbf on every node's link):
  1. calibrate: `fsdp-inspect --calibrate` for exactly that run, one copy per
     process of the run, all at once (the run's processes share this machine's
     cores, so the calibration must too); each unit's time is the mean over the
     copies. `fsdp-inspect --calibrate-link` on every node measures the link
     and the CPU a process spends per byte it moves.
  2. predict: `fsdp-inspect --estimate --cluster <that file> --json` with the
     run's fsdp-train flags.
  3. measure: fsdp-train on the nodes (its own launcher, --nnodes), the median
     step_time_s of rank 0's metrics over the steps after the first two.
Steps 1-3 repeat --rounds times (default 3); the table has the median
prediction against the median measurement.
Prints one table row per configuration: predicted and measured step time, the
ratio, and the predicted exposed communication; with --record, appends the
table to bench/RESULTS.md with the command, date and machine load.

Every process runs with OMP_NUM_THREADS=1. Needs root (network namespaces).

    bench/cluster/estimate_vs_measured.py --inspect NEW --estimate-only [--compare-inspect OLD] [--record]

predicts the same configurations without a cluster: each is calibrated once on this
machine (`--calibrate`, one process), given its link's nominal rate (and 300 us, 0.9 ns
of CPU per byte, 20 Gbit/s between a node's processes) and estimated; with
--compare-inspect, by two fsdp-inspect binaries from the same cluster file, so that a
change of the model (its schedule) is compared on identical inputs.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import netcluster  # noqa: E402

import results  # noqa: E402  (bench/cluster/results.py)

MODEL = ["--model", "tiny", "--seq-len", "128", "--batch-size", "8"]
FAST, SLOW = 1000, 150  # Mbit/s

# name: (nodes, procs per node, extra fsdp-train flags, link Mbit/s)
CONFIGS = {
    "1x1-full-fp32": (1, 1, ["--sharding", "full"], FAST),
    "2x1-full-fp32-fast": (2, 1, ["--sharding", "full"], FAST),
    "2x1-full-fp32-slow": (2, 1, ["--sharding", "full"], SLOW),
    "2x1-gradop-bf16-slow": (2, 1, ["--sharding", "grad-op", "--mixed-precision", "bf16"], SLOW),
    "2x1-full-bf16-ckpt-fast": (2, 1, ["--sharding", "full", "--mixed-precision", "bf16",
                                       "--activation-checkpointing"], FAST),
    "2x2-hybrid-fp32-slow": (2, 2, ["--sharding", "hybrid"], SLOW),
    "2x2-full-fp32-slow": (2, 2, ["--sharding", "full"], SLOW),
    "4x1-full-fp32-slow": (4, 1, ["--sharding", "full"], SLOW),
    "4x1-full-bf16-ckpt-fast": (4, 1, ["--sharding", "full", "--mixed-precision", "bf16",
                                       "--activation-checkpointing"], FAST),
    "4x1-gradop-fp32-fast": (4, 1, ["--sharding", "grad-op"], FAST),
    # Compressed collectives (docs/compression.md): the model counts their bytes per element.
    "2x1-full-agint8-rsbf16-slow": (2, 1, ["--sharding", "full", "--all-gather-wire", "int8",
                                           "--reduce-scatter-wire", "bf16"], SLOW),
    "4x1-full-agint8-rsbf16-slow": (4, 1, ["--sharding", "full", "--all-gather-wire", "int8",
                                           "--reduce-scatter-wire", "bf16"], SLOW),
    "2x1-full-agbf16-rsint8-fast": (2, 1, ["--sharding", "full", "--all-gather-wire", "bf16",
                                           "--reduce-scatter-wire", "int8"], FAST),
}


def env():
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["GLOO_SOCKET_IFNAME"] = "eth0"
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        e.pop(k, None)
    return e


def run_all(c, argvs, tmp, name, timeout, envs=None):
    procs, logs = [], []
    for i, (node, argv) in enumerate(argvs):
        log = tmp / f"{name}.{i}.log"
        logs.append(log)
        procs.append(c.popen(node, argv, env=(envs[i] if envs else env()), log=log))
    results.wait_all(procs, logs, timeout, name, tail=2000)
    return logs


def calibrate(a, c, tmp, name, nodes, nproc, flags, rate):
    """The cluster file for this run: unit times (mean over concurrent copies) and the link."""
    world = nodes * nproc
    files = [tmp / f"{name}.cal{r}.json" for r in range(world)]
    argvs = [(r // nproc, [a.inspect, *MODEL, *flags, "--calibrate", str(files[r]), "--calibrate-steps", "3"])
             for r in range(world)]
    run_all(c, argvs, tmp, f"{name}-cal", 600)
    cals = [json.loads(f.read_text()) for f in files]
    merged = cals[0]
    units = merged["calibration"]["units"]
    for unit, u in units.items():
        for key in u:
            u[key] = statistics.mean(x["calibration"]["units"][unit][key] for x in cals)
    merged["optimizer_ns_per_element"] = statistics.mean(x["optimizer_ns_per_element"] for x in cals)
    merged["name"] = f"emulated {nodes}x{nproc}, tbf {rate} Mbit/s (calibrated)"
    merged["procs_per_node"] = nproc
    # Inside a node: loopback between its processes, measured like the link.
    merged["intra"] = {"gbit_per_s": 20.0, "latency_us": 50.0}
    cluster = tmp / f"{name}.cluster.json"
    cluster.write_text(json.dumps(merged, indent=2))
    if nodes > 1:
        envs = []
        for r in range(nodes):
            e = env()
            e.update({"RANK": str(r), "WORLD_SIZE": str(nodes), "MASTER_ADDR": c.addr(0), "MASTER_PORT": "29501"})
            envs.append(e)
        argvs = [(r, [a.inspect, "--calibrate-link", str(cluster), "--calibrate-link-seconds", "3"])
                 for r in range(nodes)]
        run_all(c, argvs, tmp, f"{name}-link", 120, envs)
    return cluster


def predict(a, cluster, nodes, nproc, flags):
    out = subprocess.run([a.inspect, "--estimate", "--cluster", str(cluster), *MODEL, *flags,
                          "--nnodes", str(nodes), "--nproc-per-node", str(nproc), "--json"],
                         capture_output=True, text=True, env=env(), timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"fsdp-inspect --estimate failed: {out.stderr}")
    return json.loads(out.stdout)


def measure(a, c, tmp, name, nodes, nproc, flags):
    metrics = tmp / f"{name}.metrics.jsonl"
    data = str(ROOT / "data" / "fallback_corpus.jsonl")
    argvs = []
    for n in range(nodes):
        argv = [a.train, *MODEL, *flags, "--data", data, "--max-steps", str(a.steps), "--log-every", "1",
                "--metrics-file", str(metrics), "--nproc-per-node", str(nproc)]
        if nodes > 1:
            argv += ["--nnodes", str(nodes), "--node-rank", str(n), "--master-addr", c.addr(0)]
        argvs.append((n, argv))
    run_all(c, argvs, tmp, f"{name}-train", 900)
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    times = [r["step_time_s"] for r in steps if r["step"] >= 2]
    return statistics.median(times), times


def estimate_only(a, names):
    """Predictions without a cluster, by one or two fsdp-inspect binaries from the same calibration."""
    load = os.getloadavg()
    binaries = [("new", a.inspect)] + ([("old", a.compare_inspect)] if a.compare_inspect else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-estimate-only.") as d:
        tmp = Path(d)
        for name in names:
            nodes, nproc, flags, rate = CONFIGS[name]
            cal = tmp / f"{name}.cal.json"
            subprocess.run([a.inspect, *MODEL, *flags, "--calibrate", str(cal), "--calibrate-steps", "3"],
                           check=True, capture_output=True, env=env(), timeout=600)
            c = json.loads(cal.read_text())
            c["procs_per_node"] = nproc
            c["intra"] = {"gbit_per_s": 20.0, "latency_us": 50.0}
            c["inter"] = {"gbit_per_s": rate / 1000.0, "latency_us": 300.0}
            c["host_cpu_ns_per_byte"] = 0.9
            cluster = tmp / f"{name}.cluster.json"
            cluster.write_text(json.dumps(c, indent=2))
            got = {tag: predict(argparse.Namespace(inspect=b), cluster, nodes, nproc, flags) for tag, b in binaries}
            rows.append((name, rate if nodes > 1 else None, got))
            print(f"{name:26s} " + "  ".join(f"{t} {e['step_time_s']:.4f} s (exposed {e['exposed_comm_s']:.4f})"
                                             for t, e in got.items()), flush=True)
    head = "| configuration | link (nominal) | " + " | ".join(
        f"{t}: step, exposed" for t, _ in binaries) + (" | new / old |" if a.compare_inspect else " |")
    lines = [head, "|" + "---|" * (2 + len(binaries) + (1 if a.compare_inspect else 0))]
    for name, rate, got in rows:
        cells = [f"{got[t]['step_time_s']:.4f} s, {got[t]['exposed_comm_s']:.4f} s" for t, _ in binaries]
        ratio = f" {got['new']['step_time_s'] / got['old']['step_time_s']:.4f} |" if a.compare_inspect else ""
        lines.append(f"| {name} | {f'{rate} Mbit/s' if rate else 'one node'} | " + " | ".join(cells) + " |" + ratio)
    table = "\n".join(lines)
    print(table)
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.record:
        results.append("Step-time model, estimate only (no cluster)", (
            f"Command: `{a.command or 'bench/cluster/estimate_vs_measured.py --estimate-only'}`\n"
            f"Machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before the "
            f"run\n\nThe configurations of the emulated-cluster table, each calibrated once here (one process) and "
            f"given its link's nominal rate, 300 us, 0.9 ns of CPU per byte and 20 Gbit/s inside a node; "
            f"{'both binaries read the same cluster file' if a.compare_inspect else 'one binary'}.\n\n{table}\n"))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="", help="fsdp-train (required unless --estimate-only)")
    ap.add_argument("--inspect", required=True)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="calibrate-then-measure rounds per configuration (medians)")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--command", default="")
    ap.add_argument("--estimate-only", action="store_true", help="predict without a cluster (see above)")
    ap.add_argument("--compare-inspect", default="", help="with --estimate-only: a second fsdp-inspect to compare")
    a = ap.parse_args()
    names = [n for n in a.configs.split(",") if n]
    for n in names:
        if n not in CONFIGS:
            print(f"estimate_vs_measured: unknown config '{n}' (known: {', '.join(CONFIGS)})", file=sys.stderr)
            return 2
    if a.estimate_only:
        return estimate_only(a, names)
    if not a.train:
        print("estimate_vs_measured: --train is required (or --estimate-only)", file=sys.stderr)
        return 2
    missing = netcluster.check_capabilities()
    if missing:
        print(f"estimate_vs_measured: cannot build the emulated cluster: {missing}", file=sys.stderr)
        return 1
    load = os.getloadavg()
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-estimate-bench.") as d:
        tmp = Path(d)
        for name in names:
            nodes, nproc, flags, rate = CONFIGS[name]
            # Calibration and measurement alternate, --rounds times, and each side takes
            # its median: on a machine whose load drifts, a calibration minutes away from
            # its measurement would compare two different machines.
            ests, measured_rounds, links = [], [], []
            with netcluster.Cluster(nodes, rate_mbit=rate if nodes > 1 else None, tag="bench") as c:
                for r in range(a.rounds):
                    cluster = calibrate(a, c, tmp, f"{name}.r{r}", nodes, nproc, flags, rate)
                    ests.append(predict(a, cluster, nodes, nproc, flags))
                    measured_rounds.append(measure(a, c, tmp, f"{name}.r{r}", nodes, nproc, flags)[0])
                    if nodes > 1:
                        links.append(json.loads(cluster.read_text())["inter"]["gbit_per_s"] * 1000)
            predicted = statistics.median(e["step_time_s"] for e in ests)
            measured = statistics.median(measured_rounds)
            est = min(ests, key=lambda e: abs(e["step_time_s"] - predicted))
            link = statistics.median(links) if links else None
            row = {"name": name, "predicted": predicted, "measured": measured,
                   "ratio": predicted / measured, "exposed": est["exposed_comm_s"],
                   "compute": est["compute_s"], "link_mbit": link,
                   "rounds": [(e["step_time_s"], m) for e, m in zip(ests, measured_rounds)]}
            rows.append(row)
            print(f"{name:26s} predicted {row['predicted']:.3f} s  measured {measured:.3f} s  "
                  f"ratio {row['ratio']:.3f}  (exposed {row['exposed']:.3f} s, link "
                  f"{'%.0f Mbit/s' % link if link else '-'}; rounds "
                  f"{', '.join('%.3f/%.3f' % pm for pm in row['rounds'])})", flush=True)
    took = time.time() - t0
    within = sum(1 for r in rows if abs(r["ratio"] - 1) <= 0.15)
    lines = ["| configuration | link (measured) | predicted step | measured step (median) | predicted / measured "
             "| predicted exposed comm |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {'%.0f Mbit/s' % r['link_mbit'] if r['link_mbit'] else 'one node'} | "
                     f"{r['predicted']:.3f} s | {r['measured']:.3f} s | {r['ratio']:.3f} | {r['exposed']:.3f} s |")
    table = "\n".join(lines)
    print(table)
    print(f"{within} of {len(rows)} within 15%; {took:.0f} s; load average before: "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.record:
        results.append("Step-time model vs the emulated cluster", (
                f"Command: `{a.command or 'bench/cluster/run.sh'}` ({took:.0f} s)\n"
                f"Machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before "
                f"the run\n\n"
                f"`tiny` preset, seq 128 x batch 8 per process, {a.steps} steps per run (median step_time_s of steps "
                f">= 2); one thread per process; links shaped with tc tbf ({FAST} and {SLOW} Mbit/s); per "
                f"configuration {a.rounds} rounds of calibrating (unit times with its processes running at once, "
                f"the link and CPU per byte) then measuring, medians of each side.\n\n"
                f"{table}\n\n{within} of {len(rows)} configurations within 15%.\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

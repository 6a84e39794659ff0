#!/usr/bin/env python3
"""Head-to-head on the emulated cluster: fsdp-train against PyTorch FSDP2 (gloo) across
network namespaces joined by links shaped with tc tbf (tests/cluster/netcluster.py).

    bench/cluster/run_headtohead.sh [--rows NAME,...] [--steps 4] [--warmup 2] [--busy 0,2,4] [--no-record]

Same model, weights, batches and options on both sides: a 7.1M-parameter Llama (vocab 8192,
hidden 256, 4 layers, bench/cluster/llama-7m.json), seq 256 x batch 4 per rank, AdamW, --threads
threads per process (1); fsdp-train --init-from and the FSDP2 peer (tests/peers/fsdp2_peer.py)
--hf-dir read the same safetensors, and the peer reads the batches fsdp-train's sampler
writes (peer_batches); the first step's loss of both is printed as a check that they
train the same thing. Both are started the same way: one process per rank in its node's
namespace, with the plain-environment rendezvous (MASTER_ADDR = node 0's address, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and GLOO_SOCKET_IFNAME=eth0 (gloo needs it
there; fsdp-train would find the address itself).

Per row (nodes x processes per node, strategy, precision, link, and for ours the wire
format of docs/compression.md): tokens/s of both (global tokens per step over the median
step_time_s of the measured steps, which both sides take over the same span: zero_grad to
the loss all-reduce), the ratio, and the exposed communication of both, by the same
method on both sides: the step time minus the compute-only step time of that side, which
is the median step of `world size` single-process copies of it run at once on node 0 (the
same per-rank batch, the same cores shared by as many processes, no network). Rows whose
name ends in a wire option are fsdp-train with that option against FSDP2's uncompressed
row (FSDP2 has no compression); "+gloo" is fsdp-train over c10d's ProcessGroupGloo
(--backend gloo), the transport FSDP2 uses: FSDP2 + Gloo, fsdp-train + Gloo and fsdp-train
+ ours on the same links in one run, the engine's share apart from the transport's. A row name may also carry "+hpz" after its base: both sides
then keep, after each layer's forward, a shard over the processes of one node
(fsdp-train --reshard-after-forward N, FSDP2's reshard_after_forward=N on the decoder
layers: ZeRO++'s hpZ), so backward's all-gathers stay inside the node.

--busy N: N busy processes (a shell loop each) run beside both sides for the whole row:
the oversubscribed machine of the issue's item 5; rows are repeated per value.

Needs root (network namespaces). Appends the table to bench/RESULTS.md with --record.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "peers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import netcluster  # noqa: E402
import peerlib  # noqa: E402
import results  # noqa: E402

# bench/cpu/headtohead.py (batches and both sides' command lines), loaded by path: this file has its name.
_spec = importlib.util.spec_from_file_location("cpu_headtohead", ROOT / "bench" / "cpu" / "headtohead.py")
cpu_h2h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_h2h)

FAST, SLOW = 1000, 150  # Mbit/s
WIRE = {
    "ag-int8+rs-bf16": ["--all-gather-wire", "int8", "--reduce-scatter-wire", "bf16"],
    "ag-bf16+rs-bf16": ["--all-gather-wire", "bf16", "--reduce-scatter-wire", "bf16"],
    "ag-int8+rs-int8": ["--all-gather-wire", "int8", "--reduce-scatter-wire", "int8"],
    # Not a wire format: fsdp-train over c10d's ProcessGroupGloo, the transport FSDP2 uses, so that a row
    # and its +gloo twin tell the engine's share from the transport's (docs/benchmarks.md).
    "gloo": ["--backend", "gloo"],
}
# name: (nodes, processes per node, sharding, precision, Mbit/s). A name may go on with
# "+hpz" (both sides; full sharding over nodes of several processes), then "+<wire>" (a key
# of WIRE): fsdp-train with that wire against the row without it.
BASE_ROWS = {
    "2x1-full-fp32-150": (2, 1, "full", "fp32", SLOW),
    "4x1-full-fp32-150": (4, 1, "full", "fp32", SLOW),
    "2x1-full-fp32-1000": (2, 1, "full", "fp32", FAST),
    "4x1-full-fp32-1000": (4, 1, "full", "fp32", FAST),
    "2x1-full-bf16-150": (2, 1, "full", "bf16", SLOW),
    "2x2-full-fp32-150": (2, 2, "full", "fp32", SLOW),
    "2x2-hybrid-fp32-150": (2, 2, "hybrid", "fp32", SLOW),
    "2x2-hybrid-bf16-1000": (2, 2, "hybrid", "bf16", FAST),
    # One node: ours through shared memory, gloo through the node's own address (not shaped).
    "1x2-full-fp32": (1, 2, "full", "fp32", None),
}
DEFAULT_ROWS = [n for n in BASE_ROWS if not n.startswith("1x")] + ["2x1-full-fp32-150+ag-int8+rs-bf16", "4x1-full-fp32-150+ag-int8+rs-bf16",
                                  "2x1-full-fp32-150+ag-bf16+rs-bf16", "2x1-full-fp32-1000+ag-int8+rs-bf16",
                                  "2x1-full-fp32-150+gloo", "4x1-full-fp32-150+gloo"]


def split_row(name):
    """(base, hpz, wire) of a row name: BASE[+hpz][+WIRE]."""
    base, _, rest = name.partition("+")
    hpz = rest == "hpz" or rest.startswith("hpz+")
    wire = rest[len("hpz+"):] if rest.startswith("hpz+") else "" if hpz else rest
    if base not in BASE_ROWS or (wire and wire not in WIRE):
        raise ValueError(f"unknown row '{name}' (rows: {', '.join(BASE_ROWS)}, optionally +hpz, then optionally "
                         f"+{'|+'.join(WIRE)})")
    if hpz and (BASE_ROWS[base][0] < 2 or BASE_ROWS[base][1] < 2 or BASE_ROWS[base][2] != "full"):
        raise ValueError(f"row '{name}': +hpz keeps a shard over each node's processes after forward, which "
                         f"needs FULL_SHARD over more than one node of several processes; '{base}' is not that")
    return base, hpz, wire


class Bench:
    def __init__(self, a, work):
        self.a, self.work = a, work
        self.hf_dir, self.cfg = self.prepare(a.model)
        self.a.token_dtype = peerlib.token_dtype(self.cfg["vocab_size"])
        self.tokens = str(work / "tokens.bin")
        steps = a.warmup + a.steps
        peerlib.write_token_file(self.tokens, (steps * a.batch_size * 4 + 1) * a.seq_len + 1, self.cfg["vocab_size"],
                                 1234)
        self.compute_only = {}

    def prepare(self, config_path):
        """A seeded random transformers model of `config_path` (a config.json), saved with save_pretrained."""
        with open(config_path) as f:
            cfg = json.load(f)
        keep = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
        hf_dir = self.work / "model.hf"
        code = ("import json, sys; sys.path.insert(0, sys.argv[3]); import peerlib; "
                "peerlib.save_hf_model(sys.argv[1], json.loads(sys.argv[2]), 0)")
        subprocess.run([peerlib.venv_python(), "-c", code, str(hf_dir), json.dumps(keep), str(ROOT / "tests" / "peers")],
                       check=True, timeout=600, stdout=subprocess.DEVNULL)
        with open(hf_dir / "config.json") as f:
            return str(hf_dir), json.load(f)

    def batches(self, world):
        prefix = str(self.work / f"batches.w{world}")
        if not os.path.exists(prefix + ".global.npy"):
            cpu_h2h.write_batches(self.a, self.tokens, world, self.a.warmup + self.a.steps, prefix)
        return prefix

    def argv(self, side, world, sharding, precision, wire, metrics, shard_size, hpz=False):
        steps = self.a.warmup + self.a.steps
        argv = cpu_h2h.side_argv(self.a, side, self.hf_dir, self.tokens, self.batches(world), metrics, steps, world,
                                 self.a.threads)
        i = argv.index("--sharding")
        argv[i + 1] = sharding
        if side == "ours":
            argv += ["--mixed-precision", precision, *WIRE.get(wire, [])]
            if sharding == "hybrid":
                argv += ["--hybrid-shard-size", str(shard_size)]
        else:
            argv += ["--mixed-precision", precision]
            if sharding == "hybrid":
                argv += ["--hybrid-shard-size", str(shard_size)]
            argv[argv.index("--timeout-s") + 1] = "1200"
        if hpz:  # the post-forward shard over one node's processes, on both sides
            argv += ["--reshard-after-forward", str(shard_size)]
        return argv

    def env(self, world, rank, nproc, master, port):
        t = str(self.a.threads)
        env = dict(os.environ, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t,
                   PYTHONDONTWRITEBYTECODE="1", GLOO_SOCKET_IFNAME="eth0")
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID"):
            env.pop(k, None)
        if world > 1:
            env.update(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(rank % nproc), LOCAL_WORLD_SIZE=str(nproc))
        return env

    def run(self, c, tag, side, nodes, nproc, sharding, precision, wire, hpz=False):
        """One side on the cluster; returns (median step s, step times, rank 0's metrics rows)."""
        world = nodes * nproc
        metrics = self.work / f"{tag}.{side}.jsonl"
        if metrics.exists():
            metrics.unlink()
        argv = self.argv(side, world, sharding, precision, wire, str(metrics), nproc, hpz)
        procs, logs = [], []
        for r in range(world):
            log = self.work / f"{tag}.{side}.rank{r}.log"
            logs.append(log)
            procs.append(c.popen(r // nproc, argv, env=self.env(world, r, nproc, c.addr(0), 29500), log=log))
        return self.collect(tag, side, procs, logs, metrics)

    def steps(self, tag, side, metrics):
        rows = peerlib.read_metrics(str(metrics))
        times = [r["step_time_s"] for r in rows if r["step"] >= self.a.warmup]
        if len(times) != self.a.steps:
            raise RuntimeError(f"{tag} {side}: {len(times)} measured steps in {metrics}, expected {self.a.steps}")
        return statistics.median(times), times, rows

    def collect(self, tag, side, procs, logs, metrics):
        results.wait_all(procs, logs, self.a.timeout_s, f"{tag} {side}")
        return self.steps(tag, side, metrics)

    def compute_only_step(self, c, side, world, precision, busy):
        """Median step of `world` single-process copies of `side` run at once on node 0: the cost of the
        step's compute (and the engine's own work) with the cores shared as in the distributed run."""
        key = (side, world, precision, busy)
        if key not in self.compute_only:
            tag = f"compute-{side}-{world}-{precision}-b{busy}"
            procs, logs, files = [], [], []
            for r in range(world):
                metrics = self.work / f"{tag}.{r}.jsonl"
                if metrics.exists():
                    metrics.unlink()
                log = self.work / f"{tag}.{r}.log"
                argv = self.argv(side, 1, "full", precision, "", str(metrics), 1)
                procs.append(c.popen(0, argv, env=self.env(1, 0, 1, "", 0), log=log))
                logs.append(log)
                files.append(metrics)
            results.wait_all(procs, logs, self.a.timeout_s, f"{tag} {side}")
            self.compute_only[key] = statistics.median(self.steps(tag, side, f)[0] for f in files)
        return self.compute_only[key]


class Busy:
    """N busy processes (shell loops) for the life of the block."""

    def __init__(self, n):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def fmt_row(r):
    return (f"| {r['row']} | {r['busy']} | {r['link']} | {r['tps_ours']:,.0f} | {r['tps_theirs']:,.0f} | "
            f"**{r['ratio']:.2f}** | {r['step_ours']:.3f} s | {r['step_theirs']:.3f} s | {r['exposed_ours']:.3f} s | "
            f"{r['exposed_theirs']:.3f} s | {r['compute_ours']:.3f} / {r['compute_theirs']:.3f} s | "
            f"{r['mb_ours']:.1f} MB | {r['loss0_rel']:.1e} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="build directory with apps/fsdp-train, tests/peers/peer_batches")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    ap.add_argument("--model", default=str(Path(__file__).resolve().parent / "llama-7m.json"),
                    help="a config.json (default: the issue's 7.1M Llama)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4, help="per rank")
    ap.add_argument("--steps", type=int, default=4, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per process (OMP_NUM_THREADS; the peer's "
                    "torch.set_num_threads)")
    ap.add_argument("--busy", default="0", help="comma-separated counts of busy processes beside the runs")
    ap.add_argument("--timeout-s", type=float, default=900, help="limit for each run")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--command", default="")
    ap.add_argument("--json-out", default="", help="also write the rows as JSON here")
    a = ap.parse_args()
    try:
        rows = [split_row(n) + (n,) for n in a.rows.split(",") if n]
    except ValueError as e:
        print(f"headtohead.py: {e}", file=sys.stderr)
        return 2
    busy_counts = [int(b) for b in a.busy.split(",") if b.strip()]
    missing = netcluster.check_capabilities()
    if missing:
        print(f"headtohead.py: cannot build the emulated cluster: {missing}", file=sys.stderr)
        return 1
    load = os.getloadavg()
    t0 = time.time()
    out = []
    with tempfile.TemporaryDirectory(prefix="fsdp-cluster-h2h.") as d:
        bench = Bench(a, Path(d))
        theirs_cache = {}
        for busy in busy_counts:
            for base, hpz, wire, name in rows:
                nodes, nproc, sharding, precision, rate = BASE_ROWS[base]
                world = nodes * nproc
                with Busy(busy), netcluster.Cluster(nodes, rate_mbit=rate, tag="h2h") as c:
                    comp_ours = bench.compute_only_step(c, "ours", world, precision, busy)
                    comp_theirs = bench.compute_only_step(c, "theirs", world, precision, busy)
                    step_o, _, rows_o = bench.run(c, f"{name}.b{busy}", "ours", nodes, nproc, sharding, precision, wire,
                                                  hpz)
                    theirs = base + ("+hpz" if hpz else "")
                    if (theirs, busy) not in theirs_cache:
                        theirs_cache[(theirs, busy)] = bench.run(c, f"{theirs}.b{busy}", "theirs", nodes, nproc,
                                                                 sharding, precision, "", hpz)
                    step_t, _, rows_t = theirs_cache[(theirs, busy)]
                tokens = world * a.batch_size * a.seq_len
                measured = [r for r in rows_o if r["step"] >= a.warmup]
                sent = statistics.median(r.get("allgather_bytes", 0) + r.get("reduce_scatter_bytes", 0) +
                                         r.get("allreduce_bytes", 0) for r in measured)
                l0, l1 = rows_o[0]["loss"], rows_t[0]["loss"]
                row = dict(row=name, wire=wire, busy=busy, link=f"{rate} Mbit/s" if rate else "one node", tps_ours=tokens / step_o,
                           tps_theirs=tokens / step_t, ratio=step_t / step_o, step_ours=step_o, step_theirs=step_t,
                           compute_ours=comp_ours, compute_theirs=comp_theirs,
                           exposed_ours=max(0.0, step_o - comp_ours), exposed_theirs=max(0.0, step_t - comp_theirs),
                           mb_ours=sent / 1e6, loss0_rel=abs(l0 - l1) / abs(l1))
                out.append(row)
                print(fmt_row(row), flush=True)
    took = time.time() - t0
    head = ("| row | busy processes | link | tokens/s ours | tokens/s FSDP2 | ours / FSDP2 | step ours | step FSDP2 | "
            "exposed comm ours | exposed comm FSDP2 | compute-only step ours / FSDP2 | collective buffers per step "
            "(ours, rank 0) | step-0 loss rel. diff |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = head + "\n" + "\n".join(fmt_row(r) for r in out)
    print(table)
    print(f"{took:.0f} s; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))
    bad = [r for r in out if r["loss0_rel"] > 1e-3 and r["wire"] in ("", "gloo")]
    if a.record:
        results.append("Head-to-head on the emulated cluster: fsdp-train vs FSDP2 (gloo)", (
            f"Command: `{a.command or 'bench/cluster/run_headtohead.sh'}` ({took / 60:.0f} min)\n"
            f"Machine: {peerlib.processor()}, {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before the run\n\n"
            f"{Path(a.model).name}, seq {a.seq_len} x batch {a.batch_size} per rank, {a.warmup} warm-up + {a.steps} "
            f"measured steps (median step_time_s), AdamW, {a.threads} thread(s) per process, nodes = network namespaces on a "
            f"bridge, links shaped with tc tbf; exposed comm = step - compute-only step (the median step of world-size "
            f"single-process copies at once, same side, same load).\n\n{table}\n"))
    if bad:
        print(f"headtohead.py: FAIL: the first step's loss differs by more than 1e-3 between the sides for "
              f"{', '.join(r['row'] for r in bad)}: they are not training the same thing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

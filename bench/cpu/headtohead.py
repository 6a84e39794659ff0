#!/usr/bin/env python3
"""CPU head-to-head: fsdp-train against PyTorch FSDP2 eager (fully_shard per decoder layer
and root, transformers' LlamaForCausalLM with SDPA attention) on the same model, the same
weights, the same batches and the same AdamW, at 1 and 2 processes. Run by bench/cpu/run.sh
(which builds what it needs and records the table); see that script for the options.

Both sides are started the same way, by this script, one process per rank with the
plain-environment rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; none at one
process) and the same OMP_NUM_THREADS — fsdp-train's own --nproc-per-node launcher is not
used, so that every rank is a direct child of this script and is measured from outside:
- peak RSS per rank: ru_maxrss from wait4() on each rank's pid (the kernel's high-water
  mark of its resident set over the whole life of the process: loading, sharding, training);
- tokens/s: global tokens of the measured steps (after --warmup steps) over the wall time
  between rank 0's log lines of the last warm-up step and of the last step, as this script sees
  them appear in its metrics file (fsdp-train --metrics-file, the peer's identical file; both
  flush a line per step), polled every 10 ms. Each side's own step times (from before
  zero_grad to after the optimizer step and the loss all-reduce) are printed beside it as a
  cross-check.
The batches: fsdp-train's sampler writes them (peer_batches) and the peer splits them by the
global-batch rule, so both sides see the same windows; the first step's loss (same weights,
same batch, before any update) is printed for both as a check that they train the same thing.

--profile: each side once more at one process with `perf record` attached for --profile-steps
steps after the warm-up (sampled CPU time by shared object and symbol), then on the FSDP2
side torch.profiler's operator table for as many further steps. fsdp-train has no profiler
of its own to switch on; perf sees both sides the same way.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
import peerlib  # noqa: E402

PEER = os.path.join(ROOT, "tests", "peers", "fsdp2_peer.py")
MODELS = {
    "small": "the `small` preset (fsdp-inspect --write-hf-config)",
    "100m": "bench/cpu/llama-100m.json",
    "128k": "bench/cpu/llama-128k.json: Llama 3's 128,256-token vocabulary on a small model (the logits dominate)",
}
# Rows measured at their own sequence length (else --seq-len).
MODEL_SEQ_LEN = {"128k": 512}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True, help="build directory with apps/fsdp-train, apps/fsdp-inspect, "
                                                  "tests/peers/peer_batches")
    p.add_argument("--models", default="small,100m,128k", help="comma-separated: small, 100m, 128k")
    p.add_argument("--nproc", default="1,2", help="comma-separated process counts")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--steps", type=int, default=10, help="measured steps")
    p.add_argument("--warmup", type=int, default=3, help="steps before the measured ones")
    p.add_argument("--threads", type=int, default=0, help="threads per process (0: cores / processes)")
    p.add_argument("--timeout-s", type=float, default=1800, help="limit for each run")
    p.add_argument("--ac", default="off", help="comma-separated activation checkpointing rows: off (neither side), "
                                              "full, tail, selective (fsdp-train --activation-checkpointing "
                                              "--ac-policy P against FSDP2 with every decoder layer checkpointed, "
                                              "non-reentrant)")
    p.add_argument("--rounds", type=int, default=1, help="run every row this many times, in turn; the table gives "
                                                          "medians, each ratio against FSDP2's run of its round")
    p.add_argument("--profile", action="store_true", help="also profile both sides (rank 0) at each process count")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--table-out", default="", help="also write the Markdown table here")
    p.add_argument("--keep", default="", help="keep work files (logs, metrics, profiles) in this directory")
    return p.parse_args()


def mib(kib):
    return f"{kib / 1024:.0f} MiB"


def prepare_model(a, name, work):
    """HF config.json of the model -> a seeded random transformers model saved with
    save_pretrained; both sides start from these weights."""
    cfg_path = os.path.join(work, f"{name}.config.json")
    if name == "small":
        subprocess.run([os.path.join(a.build, "apps", "fsdp-inspect"), "--model", "small", "--write-hf-config",
                        cfg_path], check=True, stdout=subprocess.DEVNULL, timeout=120)
    else:
        shutil.copyfile(os.path.join(HERE, f"llama-{name}.json"), cfg_path)
    with open(cfg_path) as f:
        cfg = json.load(f)
    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")}
    hf_dir = os.path.join(work, f"{name}.hf")
    code = ("import json, sys; sys.path.insert(0, sys.argv[3]); import peerlib; "
            "peerlib.save_hf_model(sys.argv[1], json.loads(sys.argv[2]), 0)")
    subprocess.run([peerlib.venv_python(), "-c", code, hf_dir, json.dumps(keep), os.path.join(ROOT, "tests", "peers")],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    return hf_dir, cfg


def write_batches(a, tokens, nproc, steps, prefix):
    """fsdp-train's batches for the peer (seed 1337 and shuffling: fsdp-train's defaults)."""
    subprocess.run([os.path.join(a.build, "tests", "peers", "peer_batches"), "--data", tokens, "--data-format", "bin",
                    "--token-dtype", a.token_dtype, "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
                    "--world-size", str(nproc), "--seed", "1337", "--steps", str(steps), "--out", prefix],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)


def count_params(cfg):
    d, f, l, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    h = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or h
    q = cfg.get("head_dim") or d // h
    per_layer = d * h * q + 2 * d * kv * q + h * q * d + 3 * d * f + 2 * d
    return l * per_layer + v * d * (1 if cfg.get("tie_word_embeddings") else 2) + d


def ranks_env(nproc, threads, rank, port):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), PYTHONDONTWRITEBYTECODE="1")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
              "TORCHELASTIC_MAX_RESTARTS", "SLURM_PROCID"):
        env.pop(k, None)
    if nproc > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    return env


def common_flags(steps):
    """fsdp-train's defaults, spelled out for both sides."""
    return dict(lr=3e-4, min_lr=3e-5, warmup_steps=0, max_steps=steps, weight_decay=0.01, beta1=0.9, beta2=0.999,
                clip_grad=1.0)


def side_argv(a, side, hf_dir, tokens, batches, metrics, steps, nproc, threads, ac="off"):
    h = common_flags(steps)
    if side == "ours":
        checkpointing = [] if ac == "off" else ["--activation-checkpointing", "--ac-policy", ac]
        return [os.path.join(a.build, "apps", "fsdp-train"), "--init-from", hf_dir, "--data", tokens,
                "--data-format", "bin", "--token-dtype", a.token_dtype, "--seq-len", str(a.seq_len),
                "--batch-size", str(a.batch_size), "--max-steps", str(steps), "--sharding", "full", "--wrap", "block",
                "--lr", str(h["lr"]), "--min-lr", str(h["min_lr"]), "--warmup-steps", str(h["warmup_steps"]),
                "--weight-decay", str(h["weight_decay"]), "--weight-decay-all",  # the peer: one parameter group
                "--beta1", str(h["beta1"]), "--beta2", str(h["beta2"]),
                "--clip-grad", str(h["clip_grad"]), "--seed", "1337", "--log-every", "1", "--metrics-file",
                metrics] + checkpointing
    argv = [peerlib.venv_python(), PEER, "--hf-dir", hf_dir, "--batches", batches, "--sharding", "full",
            "--batch-size", str(a.batch_size), "--steps", str(steps), "--lr", str(h["lr"]), "--min-lr", str(h["min_lr"]),
            "--warmup-steps", str(h["warmup_steps"]), "--max-steps", str(h["max_steps"]),
            "--weight-decay", str(h["weight_decay"]), "--beta1", str(h["beta1"]), "--beta2", str(h["beta2"]),
            "--clip-grad", str(h["clip_grad"]), "--threads", str(threads), "--metrics-file", metrics,
            "--timeout-s", "600"]
    if ac != "off":
        argv.append("--activation-checkpointing")
    return argv


def run_side(a, side, tag, hf_dir, tokens, batches, nproc, threads, work, ac="off"):
    """Runs one side with nproc ranks; returns (tokens/s, tokens/s from its step times, [peak RSS KiB per
    rank], rank 0's metrics, rank 0's tokens per CPU-second)."""
    steps = a.warmup + a.steps
    metrics = os.path.join(work, f"{tag}.{side}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    argv = side_argv(a, side, hf_dir, tokens, batches, metrics, steps, nproc, threads, ac)
    port = peerlib.free_port()
    seen = StepClock(metrics)
    with peerlib.ProcessSet() as ps:
        for r in range(nproc):
            proc = ps.start(f"{side} rank {r}", argv, ranks_env(nproc, threads, r, port),
                            os.path.join(work, f"{tag}.{side}.rank{r}.log"))
            if r == 0:
                seen.pid = proc.pid
        done = ps.wait(a.timeout_s, poll_s=0.01, on_poll=seen.poll)
    rss = [done[f"{side} rank {r}"][1].ru_maxrss for r in range(nproc)]
    rows = peerlib.read_metrics(metrics)
    measured = [r for r in rows if r["step"] >= a.warmup]
    if len(measured) != a.steps or len(seen.at) != steps:
        raise peerlib.PeerError(f"{side} {tag}: {len(measured)} measured steps in {metrics} ({len(seen.at)} seen "
                                f"appearing), expected {a.steps} after {a.warmup} warm-up steps")
    tokens = a.steps * a.batch_size * nproc * a.seq_len
    wall = seen.at[steps - 1] - seen.at[a.warmup - 1]
    inside = sum(r["step_time_s"] for r in measured)
    cpu = seen.cpu[steps - 1] - seen.cpu[a.warmup - 1]
    return tokens / wall, tokens / inside, rss, rows, (tokens / nproc) / cpu if cpu > 0 else float("nan")


class StepClock:
    """When each step's line appears in rank 0's metrics file, seen from this process (polled
    every 10 ms): the wall time between the last warm-up step's line and the last measured
    step's line covers exactly the measured steps, everything between them included. Also rank
    0's CPU time (user + system of all its threads, /proc/PID/stat) at the same moments: on a
    machine shared with other work, the CPU seconds a side spends on its steps move far less than
    its wall time, which counts the time the scheduler gave to others."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, path):
        self.path, self.at, self.cpu, self.size, self.pid = path, [], [], -1, None

    def cpu_seconds(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / self.TICK  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError, TypeError):
            return float("nan")

    def poll(self):
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if size == self.size:
            return
        now = time.monotonic()
        self.size = size
        with open(self.path) as f:
            n = sum(1 for line in f if line.endswith("\n") and '"loss"' in line)
        cpu = self.cpu_seconds()
        self.cpu.extend([cpu] * (n - len(self.cpu)))
        self.at.extend([now] * (n - len(self.at)))


def perf_line(line, width=150):
    """One `perf report --stdio` row without its column padding, long C++ names cut short."""
    words = line.split()
    while words and words[-1] == "-":
        words.pop()
    text = "  " + " ".join(words)
    return text if len(text) <= width else text[:width - 3] + "..."


def profile_side(a, side, tag, hf_dir, tokens, batches, threads, work, nproc=1):
    """`nproc` ranks; `perf record -p` attached to rank 0 from the end of the warm-up steps to the end of
    --profile-steps more (user-space CPU samples, by shared object and symbol: the steady state
    only, no start-up or loading). The FSDP2 side then runs --profile-steps more steps under
    torch.profiler (after perf has stopped, so neither profiler sees the other). Returns the
    report text, or why there is none."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed (Debian: linux-perf)\n"
    p = a.profile_steps
    steps = a.warmup + p + (p if side == "theirs" else 0) + 1  # +1: perf stops before the teardown
    metrics = os.path.join(work, f"{tag}.{side}.profile.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    data = os.path.join(work, f"{tag}.{side}.perf.data")
    torch_table = os.path.join(work, f"{tag}.{side}.torch-profile.txt") if side == "theirs" else ""
    argv = side_argv(a, side, hf_dir, tokens, batches, metrics, steps, nproc, threads)
    if torch_table:
        argv += ["--profile-steps", str(p), "--profile-start", str(a.warmup + p), "--profile-out", torch_table]
    state = {"perf": None, "stopped": False}

    def logged_steps():
        try:
            with open(metrics) as f:
                return sum(1 for line in f if '"loss"' in line)
        except OSError:
            return 0

    port = peerlib.free_port()
    with peerlib.ProcessSet() as ps, peerlib.ProcessSet() as perf_ps:
        proc = ps.start(f"{side} (profiled)", argv, ranks_env(nproc, threads, 0, port),
                        os.path.join(work, f"{tag}.{side}.profile.log"))
        for r in range(1, nproc):
            ps.start(f"{side} rank {r} (profiled run)", argv, ranks_env(nproc, threads, r, port),
                     os.path.join(work, f"{tag}.{side}.profile.rank{r}.log"))

        def on_poll():
            n = logged_steps()
            if state["perf"] is None and n >= a.warmup:
                state["perf"] = perf_ps.start("perf record", [perf, "record", "-e", "cpu-clock", "-F", "999",
                                                               "-p", str(proc.pid), "-o", data],
                                              dict(os.environ), os.path.join(work, f"{tag}.{side}.perf.log"))
            if state["perf"] is not None and not state["stopped"] and n >= a.warmup + p:
                state["perf"].send_signal(signal.SIGINT)
                state["stopped"] = True

        ps.wait(a.timeout_s, poll_s=0.02, on_poll=on_poll)
        if state["perf"] is None or not state["stopped"]:
            return f"perf was not started or stopped ({logged_steps()} steps logged)\n"
        perf_ps.wait(120, ok_codes=(0, -signal.SIGINT))  # perf re-raises the SIGINT that stops it
    out = []
    for sort, limit in (("dso", "0.5"), ("dso,symbol", "1")):
        r = subprocess.run([perf, "report", "-i", data, "--no-children", "--stdio", "--sort", sort,
                            "--percent-limit", limit], capture_output=True, text=True, timeout=600)
        out.append("\n".join(perf_line(l) for l in r.stdout.splitlines() if l.strip() and not l.startswith("#"))
                   or r.stderr.strip())
    text = (f"perf record -p (cpu-clock, 999 Hz), steps {a.warmup}..{a.warmup + p - 1} of rank 0 of {nproc}:\n"
            f"by shared object:\n{out[0]}\n\nby symbol (>= 1%):\n{out[1]}\n")
    if torch_table and os.path.exists(torch_table):
        with open(torch_table) as f:
            text += "\ntorch.profiler (the next steps), by self CPU time:\n" + f.read()
    return text


def startup_floor(a, work):
    """Peak RSS of a process that only loads each side's libraries and exits: what a rank
    holds before any model exists (fsdp-train --version: LibTorch; Python: torch and
    transformers' Llama)."""
    floors = {}
    cmds = {"ours": [os.path.join(a.build, "apps", "fsdp-train"), "--version"],
            "theirs": [peerlib.venv_python(), "-c", "import torch, torch.distributed.fsdp, "
                       "transformers.models.llama.modeling_llama"]}
    for side, argv in cmds.items():
        with peerlib.ProcessSet() as ps:
            ps.start(side, argv, ranks_env(1, 1, 0, 0), os.path.join(work, f"floor.{side}.log"))
            floors[side] = ps.wait(300)[side][1].ru_maxrss
    return floors


def main():
    a = parse_args()
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            print(f"headtohead.py: error: unknown model '{m}'; choose from {', '.join(MODELS)}", file=sys.stderr)
            return 2
    nprocs = [int(x) for x in a.nproc.split(",") if x.strip()]
    acs = [x.strip() for x in a.ac.split(",") if x.strip()]
    for ac in acs:
        if ac not in ("off", "full", "tail", "selective"):
            print(f"headtohead.py: error: --ac '{ac}' is not one of: off, full, tail, selective", file=sys.stderr)
            return 2
    if a.rounds < 1:
        print(f"headtohead.py: error: --rounds {a.rounds} must be >= 1", file=sys.stderr)
        return 2
    if a.warmup < 1 or a.steps < 1:
        print(f"headtohead.py: error: --warmup {a.warmup} and --steps {a.steps} must be >= 1 (the clock starts at the "
              "last warm-up step's log line)", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    for tool in ("apps/fsdp-train", "apps/fsdp-inspect", "tests/peers/peer_batches"):
        if not os.access(os.path.join(a.build, tool), os.X_OK):
            print(f"headtohead.py: error: {a.build}/{tool} is missing; build it (bench/cpu/run.sh does)",
                  file=sys.stderr)
            return 2
    work = a.keep or tempfile.mkdtemp(prefix="bench-cpu-")
    os.makedirs(work, exist_ok=True)
    steps = a.warmup + a.steps
    rows, profiles = [], []
    try:
        floor = startup_floor(a, work)
        base_seq = a.seq_len
        for m in models:
            a.seq_len = MODEL_SEQ_LEN.get(m, base_seq)
            hf_dir, cfg = prepare_model(a, m, work)
            a.token_dtype = peerlib.token_dtype(cfg["vocab_size"])  # 128k ids need u32
            n_params = count_params(cfg)
            tokens = os.path.join(work, f"{m}.tokens.bin")
            max_g = a.batch_size * max(nprocs)
            peerlib.write_token_file(tokens, (steps * max_g + 1) * a.seq_len + 1, cfg["vocab_size"], 1234)
            for nproc in nprocs:
                threads = a.threads or max(1, cores // nproc)
                tag = f"{m}.w{nproc}"
                batches = os.path.join(work, f"{tag}.batches")
                write_batches(a, tokens, nproc, steps, batches)
                # Each round runs every row once, FSDP2 (checkpointed or not) once for all of ours; a row's
                # ratio is taken against the FSDP2 run of its own round, and the rounds' medians are kept.
                runs = {ac: [] for ac in acs}
                for rnd in range(a.rounds):
                    theirs = {}
                    for ac in acs:
                        result = {}
                        for side in ("ours", "theirs"):
                            key = ac != "off"
                            if side == "theirs" and key in theirs:
                                result[side] = theirs[key]
                                continue
                            t0 = time.monotonic()
                            result[side] = run_side(a, side, f"{tag}.ac-{ac}.r{rnd}", hf_dir, tokens, batches, nproc,
                                                    threads, work, ac)
                            if side == "theirs":
                                theirs[key] = result[side]
                            print(f"  {m} x{nproc} round {rnd + 1}/{a.rounds} checkpointing {ac} "
                                  f"{'fsdp-train' if side == 'ours' else 'FSDP2'}: {result[side][0]:,.0f} tokens/s "
                                  f"(from its step times: {result[side][1]:,.0f}; rank 0 "
                                  f"{result[side][4]:,.0f} tokens per CPU-second), peak RSS/rank "
                                  f"{max(result[side][2]) / 1024:.0f} MiB ({time.monotonic() - t0:.0f} s)",
                                  file=sys.stderr, flush=True)
                        runs[ac].append((result["ours"], result["theirs"]))
                for ac in acs:
                    pairs = runs[ac]
                    (_, _, rss_ours, m_ours, _), (_, _, rss_theirs, m_theirs, _) = pairs[0]
                    l0, l1 = m_ours[0]["loss"], m_theirs[0]["loss"]
                    rows.append(dict(model=m, params=n_params, nproc=nproc, threads=threads, seq=a.seq_len, ac=ac,
                                     tps_ours=statistics.median(o[0] for o, _ in pairs),
                                     tps_theirs=statistics.median(t[0] for _, t in pairs),
                                     ratio=statistics.median(o[0] / t[0] for o, t in pairs),
                                     ratios=[o[0] / t[0] for o, t in pairs],
                                     cpu_ours=statistics.median(o[4] for o, _ in pairs),
                                     cpu_theirs=statistics.median(t[4] for _, t in pairs),
                                     cpu_ratio=statistics.median(o[4] / t[4] for o, t in pairs),
                                     rss_ours=max(max(o[2]) for o, _ in pairs),
                                     rss_theirs=max(max(t[2]) for _, t in pairs),
                                     loss0_rel=max(abs(o[3][0]["loss"] - t[3][0]["loss"]) / abs(t[3][0]["loss"])
                                                   for o, t in pairs),
                                     losses_ours=[r["loss"] for r in m_ours],
                                     losses_theirs=[r["loss"] for r in m_theirs]))
            if a.profile:
                for nproc in nprocs:
                    threads = a.threads or max(1, cores // nproc)
                    batches = os.path.join(work, f"{m}.w{nproc}.profile.batches")
                    write_batches(a, tokens, nproc, a.warmup + 2 * a.profile_steps + 1, batches)
                    for side in ("ours", "theirs"):
                        name = "fsdp-train" if side == "ours" else "FSDP2"
                        report = profile_side(a, side, f"{m}.w{nproc}", hf_dir, tokens, batches, threads, work, nproc)
                        profiles.append(f"### {m}, {nproc} process{'es' if nproc > 1 else ''} x {threads} threads, "
                                        f"rank 0: {name}\n\n```\n{report}```\n")
    except (peerlib.PeerError, subprocess.SubprocessError) as e:
        print(f"headtohead.py: FAIL: {e}", file=sys.stderr)
        print(f"work files: {work}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    seqs = ", ".join(f"{m} {MODEL_SEQ_LEN.get(m, base_seq)}" for m in models)
    lines = [f"fsdp-train (ours; --wrap block: decoder layers, embedding and head) vs PyTorch FSDP2 eager (theirs: one "
             f"unit per decoder layer + root), FULL_SHARD, "
             f"fp32, seq ({seqs}) x batch {a.batch_size} per rank, {a.warmup} warm-up + {a.steps} measured steps"
             f"{f', {a.rounds} rounds (medians)' if a.rounds > 1 else ''}, "
             f"AdamW lr 3e-4 wd 0.01, clip 1.0; PyTorch {torch_version()}, {cores} cores",
             "",
             "| model | params | seq | procs x threads | checkpointing | tokens/s ours | tokens/s FSDP2 | x | "
             "tokens/CPU-s ours | tokens/CPU-s FSDP2 | x | peak RSS/rank ours | peak RSS/rank FSDP2 | x | "
             "step-0 loss rel. diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ckpt = "off" if r["ac"] == "off" else f"ours {r['ac']}, FSDP2 non-reentrant"
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {r['seq']} | {r['nproc']} x {r['threads']} | {ckpt} | "
                     f"{r['tps_ours']:,.0f} | {r['tps_theirs']:,.0f} | {ratio_text(r)} | "
                     f"{r['cpu_ours']:,.0f} | {r['cpu_theirs']:,.0f} | {r['cpu_ratio']:.2f} | "
                     f"{mib(r['rss_ours'])} | {mib(r['rss_theirs'])} | {r['rss_ours'] / r['rss_theirs']:.2f} | "
                     f"{r['loss0_rel']:.1e} |")
    lines += ["", "x = ours / FSDP2 (tokens/s: higher is faster; RSS: lower is smaller; with rounds, the median of each "
              "round's ratio, every round's in brackets). tokens/CPU-s: rank 0's tokens of the measured steps over the CPU "
              "time (user + system, every thread) rank 0 spent on them, the measure that a machine shared with other "
              "work moves least. Peak RSS is the largest "
              "rank's ru_maxrss (wait4). tokens/s: global tokens of the measured steps over the wall time between rank "
              "0's log lines of the last warm-up step and the last step (seen appearing in its metrics file). "
              f"Start-up floor (peak RSS of a process that only loads the libraries): ours {mib(floor['ours'])} "
              f"(fsdp-train --version), FSDP2 {mib(floor['theirs'])} (python: import torch, transformers' Llama)."]
    table = "\n".join(lines) + "\n"
    print(table)
    if profiles:
        print("\n".join(profiles))
    if a.table_out:
        with open(a.table_out, "w") as f:
            f.write(table)
    bad = [r for r in rows if r["loss0_rel"] > 1e-4]
    if bad:
        which = ", ".join(f"{r['model']} x{r['nproc']} checkpointing {r['ac']}" for r in bad)
        print(f"headtohead.py: FAIL: the first step's loss differs by more than 1e-4 relative between the sides for "
              f"{which}: they are not training the same thing", file=sys.stderr)
        return 1
    return 0


def ratio_text(r):
    text = f"{r['ratio']:.2f}"
    return text if len(r["ratios"]) == 1 else f"{text} ({', '.join(f'{x:.2f}' for x in r['ratios'])})"


def torch_version():
    r = subprocess.run([peerlib.venv_python(), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                       text=True, timeout=120)
    return r.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch distributed checkpoints (DCP) across fsdp-train and PyTorch 2.11 FSDP2 on CPU/gloo,
both directions, at differing world sizes (issue 36; docs/checkpoints.md, "PyTorch distributed
checkpoints").

Both sides train the same tiny transformers Llama on the same global batch of 6 windows per step
(B x W: 6x1, 3x2, 2x3), with fsdp2_parity.py's optimizer, schedule and clipping, for 14 steps.

  dcp_roundtrip.py PART --fsdp-train PATH --peer-batches PATH [--keep DIR]

PART:
  from-fsdp2   FSDP2 at 2 ranks trains 4 steps and dcp.save's {"model", "optimizer"}
               (get_state_dict); fsdp-train --resume's it at 1, 2 and 3 ranks; the next 10 losses
               equal FSDP2's own continuation within 1e-5 (relative).
  to-fsdp2     fsdp-train at 2 ranks saves step 4 with --checkpoint-format dcp; FSDP2 dcp.load's
               it at 1 and 3 ranks (set_state_dict) and continues: the same 10 losses.
  safetensors  the "safetensors" chunk format both ways, weights only (HuggingFaceStorageWriter /
               Reader with save_distributed=True): fsdp-train --init-from PyTorch's files at 3
               ranks, FSDP2 from fsdp-train's --dcp-format safetensors files at 3 ranks, each against
               the other side starting from the same files; 10 steps from a fresh optimizer.
  convert      fsdp-train convert through every format: ours -> DCP (torch) -> Hugging Face and ours ->
               DCP (torchtitan) -> ours; the exports are identical to a direct one, and a run resumed at
               3 ranks from the converted checkpoint continues with the original run's losses.
  torchtitan   FSDP2 saves in torchtitan's layout (its Llama names, q/k rows in Meta's order,
               flatten_optimizer_state_dict, train_state.step; laid out as torchtitan's
               CheckpointManager does, from full tensors); fsdp-train --resume's it at 3 ranks
               (telling the layout from its keys): the same 10 losses.

Exits 1 when a loss differs by more than 1e-5 relative or a run fails, 2 on bad usage. Every
process is bounded in time and killed on the way out.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, SAVE_AT, G, SEQ = 14, 4, 6, 32
TOLERANCE = 1e-5
COMMON = dict(lr=3e-3, min_lr=3e-4, warmup_steps=4, weight_decay=0.1, beta1=0.9, beta2=0.95, clip_grad=1.1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["from-fsdp2", "to-fsdp2", "safetensors", "torchtitan", "convert"])
    p.add_argument("--fsdp-train", required=True)
    p.add_argument("--peer-batches", required=True)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout-s", type=float, default=120)
    p.add_argument("--keep", default="")
    return p.parse_args()


class Run:
    def __init__(self, a, work):
        self.a, self.work = a, work
        self.hf_dir = os.path.join(work, "hf")
        self.cfg = peerlib.tiny_llama_config_dict()
        peerlib.save_hf_model(self.hf_dir, self.cfg, a.seed)
        windows = STEPS * G
        self.tokens = peerlib.write_token_file(os.path.join(work, "tokens.bin"), windows * SEQ + 1,
                                               self.cfg["vocab_size"], a.seed)
        self.batches = {}
        self.n = 0

    def batches_for(self, world):
        if world not in self.batches:
            prefix = os.path.join(self.work, f"batches{world}")
            with peerlib.ProcessSet() as ps:
                ps.start("peer_batches",
                         [self.a.peer_batches, "--data", self.tokens, "--data-format", "bin", "--token-dtype", "u16",
                          "--seq-len", str(SEQ), "--batch-size", str(G // world), "--world-size", str(world),
                          "--grad-accum", "1", "--seed", str(self.a.seed), "--steps", str(STEPS), "--out", prefix],
                         dict(os.environ), os.path.join(self.work, f"peer_batches{world}.log"))
                ps.wait(60)
            self.batches[world] = prefix
        return self.batches[world]

    def name(self, what):
        self.n += 1
        return os.path.join(self.work, f"{self.n:02d}-{what}")

    def fsdp_train(self, world, what, args, max_steps=STEPS):
        """fsdp-train at `world` ranks; returns its per-step metrics."""
        base = self.name(what)
        metrics = base + ".jsonl"
        c = COMMON
        argv = [self.a.fsdp_train, "--model", self.hf_dir, "--data", self.tokens, "--data-format", "bin",
                "--token-dtype", "u16", "--seq-len", str(SEQ), "--batch-size", str(G // world),
                "--nproc-per-node", str(world), "--sharding", "full", "--wrap", "block", "--lr", str(c["lr"]),
                "--min-lr", str(c["min_lr"]), "--warmup-steps", str(c["warmup_steps"]), "--max-steps",
                str(max_steps), "--weight-decay", str(c["weight_decay"]), "--weight-decay-all", "--beta1",
                str(c["beta1"]), "--beta2", str(c["beta2"]), "--clip-grad", str(c["clip_grad"]), "--seed",
                str(self.a.seed), "--log-every", "1", "--metrics-file", metrics] + args
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        with peerlib.ProcessSet() as ps:
            ps.start("fsdp-train", argv, env, base + ".log")
            ps.wait(self.a.timeout_s)
        return peerlib.read_metrics(metrics)

    def fsdp2(self, world, what, args, steps=STEPS, max_steps=STEPS):
        """PyTorch FSDP2 at `world` ranks (fsdp2_peer.py); returns rank 0's per-step metrics."""
        base = self.name(what)
        metrics = base + ".jsonl"
        c = COMMON
        port = peerlib.free_port()
        argv = [peerlib.venv_python(), os.path.join(HERE, "fsdp2_peer.py"), "--hf-dir", self.hf_dir, "--batches",
                self.batches_for(world), "--sharding", "full", "--batch-size", str(G // world), "--steps", str(steps),
                "--lr", str(c["lr"]), "--min-lr", str(c["min_lr"]), "--warmup-steps", str(c["warmup_steps"]),
                "--max-steps", str(max_steps), "--weight-decay", str(c["weight_decay"]), "--beta1", str(c["beta1"]),
                "--beta2", str(c["beta2"]), "--clip-grad", str(c["clip_grad"]), "--threads", "1", "--metrics-file",
                metrics, "--timeout-s", str(self.a.timeout_s)] + args
        with peerlib.ProcessSet() as ps:
            for r in range(world):
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                           WORLD_SIZE=str(world), LOCAL_RANK=str(r), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                           PYTHONDONTWRITEBYTECODE="1")
                ps.start(f"FSDP2 rank {r} ({what})", argv, env, f"{base}.rank{r}.log")
            ps.wait(self.a.timeout_s)
        return peerlib.read_metrics(metrics)


def compare(label, ours, theirs, first, last):
    """Per-step losses of steps [first, last) within TOLERANCE (relative); returns failures."""
    o = {m["step"]: m for m in ours}
    t = {m["step"]: m for m in theirs}
    missing = [s for s in range(first, last) if s not in o or s not in t]
    if missing:
        return [f"{label}: steps {missing} missing (fsdp-train logged {sorted(o)}, FSDP2 {sorted(t)})"]
    worst, at = 0.0, -1
    print(f"{label}\n{'step':>4} {'fsdp-train':>14} {'reference':>14} {'rel diff':>10}")
    for s in range(first, last):
        rel = abs(o[s]["loss"] - t[s]["loss"]) / abs(t[s]["loss"])
        if rel > worst:
            worst, at = rel, s
        print(f"{s:>4} {o[s]['loss']:>14.9f} {t[s]['loss']:>14.9f} {rel:>10.2e}")
    print(f"worst relative loss difference: {worst:.3e} at step {at} (tolerance {TOLERANCE:g})")
    return [] if worst <= TOLERANCE else [f"{label}: loss differs by {worst:.3e} at step {at}"]


def from_fsdp2(r):
    ck = os.path.join(r.work, "fsdp2-dcp")
    ref = r.fsdp2(2, "fsdp2-w2", ["--save-dcp", ck, "--save-dcp-at", str(SAVE_AT)])
    failures = []
    for world in (1, 2, 3):
        mine = os.path.join(r.work, f"resume-w{world}")
        shutil.copytree(ck, mine)
        ours = r.fsdp_train(world, f"resume-w{world}", ["--resume", "--checkpoint-dir", mine])
        if ours and ours[0]["step"] != SAVE_AT:
            failures.append(f"fsdp-train at {world} resumed at step {ours[0]['step']}, not {SAVE_AT}")
        failures += compare(f"FSDP2 (2 ranks) -> dcp.save -> fsdp-train --resume at {world} ranks", ours, ref,
                            SAVE_AT, STEPS)
    return failures


def to_fsdp2(r):
    ck = os.path.join(r.work, "ours")
    ours = r.fsdp_train(2, "ours-w2", ["--checkpoint-dir", ck, "--checkpoint-every", str(SAVE_AT),
                                       "--checkpoint-format", "dcp"])
    step_dir = os.path.join(ck, f"step_{SAVE_AT:08d}")
    failures = []
    for world in (1, 3):
        theirs = r.fsdp2(world, f"fsdp2-load-w{world}", ["--load-dcp", step_dir, "--start-step", str(SAVE_AT)])
        failures += compare(f"fsdp-train (2 ranks) --checkpoint-format dcp -> dcp.load in FSDP2 at {world} ranks",
                            ours, theirs, SAVE_AT, STEPS)
    return failures


def safetensors(r):
    n = 10
    failures = []
    # PyTorch's files -> fsdp-train.
    theirs_dir = os.path.join(r.work, "fsdp2-st")
    r.fsdp2(2, "fsdp2-st-save", ["--save-dcp", theirs_dir, "--save-dcp-at", str(SAVE_AT), "--dcp-format",
                                 "safetensors"], steps=SAVE_AT)
    ours = r.fsdp_train(3, "init-from-st", ["--init-from", theirs_dir], max_steps=n)
    theirs = r.fsdp2(2, "fsdp2-st-load", ["--load-dcp", theirs_dir, "--dcp-format", "safetensors"], steps=n,
                     max_steps=n)
    failures += compare("FSDP2 HuggingFaceStorageWriter -> fsdp-train --init-from at 3 ranks", ours, theirs, 0, n)
    # fsdp-train's files -> PyTorch.
    ck = os.path.join(r.work, "ours-st")
    r.fsdp_train(2, "ours-st-save", ["--checkpoint-dir", ck, "--checkpoint-format", "dcp", "--dcp-format",
                                     "safetensors"], max_steps=SAVE_AT)
    step_dir = os.path.join(ck, f"step_{SAVE_AT:08d}")
    ours = r.fsdp_train(1, "ours-st-init", ["--init-from", step_dir], max_steps=n)
    theirs = r.fsdp2(3, "fsdp2-st-from-ours", ["--load-dcp", step_dir, "--dcp-format", "safetensors"], steps=n,
                     max_steps=n)
    failures += compare("fsdp-train --dcp-format safetensors -> FSDP2 HuggingFaceStorageReader at 3 ranks", ours,
                        theirs, 0, n)
    return failures


def torchtitan(r):
    ck = os.path.join(r.work, "titan")
    ref = r.fsdp2(2, "fsdp2-titan", ["--save-dcp", ck, "--save-dcp-at", str(SAVE_AT), "--dcp-layout", "torchtitan"])
    ours = r.fsdp_train(3, "resume-titan", ["--resume", "--checkpoint-dir", ck])  # the layout is detected
    return compare("FSDP2 in torchtitan's layout -> fsdp-train --dcp-layout torchtitan at 3 ranks", ours, ref,
                   SAVE_AT, STEPS)


def convert(r):
    ck = os.path.join(r.work, "ck")
    ours = r.fsdp_train(2, "ours", ["--checkpoint-dir", ck, "--checkpoint-every", str(SAVE_AT)], max_steps=8)
    # Keep only step 4, as the source of every conversion.
    for name in os.listdir(ck):
        if name.startswith("step_") and name != f"step_{SAVE_AT:08d}":
            shutil.rmtree(os.path.join(ck, name))

    def conv(what, args):
        base = r.name(what)
        with peerlib.ProcessSet() as ps:
            ps.start(what, [r.a.fsdp_train, "convert", "--nproc-per-node", "2"] + args, dict(os.environ), base + ".log")
            ps.wait(r.a.timeout_s)

    w = lambda n: os.path.join(r.work, n)  # noqa: E731
    conv("direct-hf", ["--checkpoint-dir", ck, "--export-hf", w("hf-direct")])
    conv("to-dcp", ["--checkpoint-dir", ck, "--export-dcp", w("dcp")])
    conv("dcp-to-hf", ["--checkpoint-dir", w("dcp"), "--export-hf", w("hf-via-dcp")])
    conv("to-titan", ["--checkpoint-dir", ck, "--export-dcp", w("titan"), "--dcp-layout", "torchtitan"])
    conv("titan-to-ours", ["--checkpoint-dir", w("titan"), "--export-checkpoint", w("back")])
    failures = []
    with open(os.path.join(w("hf-direct"), "model.safetensors"), "rb") as a, \
            open(os.path.join(w("hf-via-dcp"), "model.safetensors"), "rb") as b:
        if a.read() != b.read():
            failures.append("the Hugging Face export through DCP differs from the direct one")
    resumed = r.fsdp_train(3, "resume-converted", ["--resume", "--checkpoint-dir", w("back")], max_steps=8)
    failures += compare("ours -> DCP (torchtitan) -> ours, resumed at 3 ranks", resumed, ours, SAVE_AT, 8)
    return failures


def main():
    a = parse_args()
    for path, what in ((a.fsdp_train, "--fsdp-train"), (a.peer_batches, "--peer-batches")):
        if not os.access(path, os.X_OK):
            print(f"dcp_roundtrip.py: error: {what} {path} is not an executable; build it first", file=sys.stderr)
            return 2
    started = time.monotonic()
    work = a.keep or tempfile.mkdtemp(prefix="dcp-roundtrip-")
    os.makedirs(work, exist_ok=True)
    try:
        r = Run(a, work)
        failures = {"from-fsdp2": from_fsdp2, "to-fsdp2": to_fsdp2, "safetensors": safetensors,
                    "torchtitan": torchtitan, "convert": convert}[a.part](r)
    except peerlib.PeerError as e:
        print(f"dcp_roundtrip.py: {a.part}: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{a.part}: {time.monotonic() - started:.1f} s")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

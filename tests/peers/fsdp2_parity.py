#!/usr/bin/env python3
"""Per-step loss parity of fsdp-train against PyTorch FSDP2 (fully_shard) on CPU/gloo.

Both sides start from the same Hugging Face weights (a tiny random transformers
LlamaForCausalLM written by save_pretrained with a fixed seed), train on the same batches
(written from our sampler by peer_batches, split among the peer's ranks by the global-batch
rule and checked against fsdp-train's own per-rank batches), with the same AdamW (betas,
eps, decoupled weight decay on every parameter: fsdp-train runs with --weight-decay-all, as
the peer's torch.optim.AdamW has one parameter group), the same warmup + cosine schedule and the
same global-norm clipping. The peer is tests/peers/fsdp2_peer.py.

  fsdp2_parity.py --fsdp-train PATH --peer-batches PATH --sharding full --world-size 2
                  [--hybrid-shard-size 2] [--mixed-precision bf16] [--batch-size 2] [--grad-accum 2]
                  [--tolerance 1e-5] [--norm-tolerance 1e-5] [--step0-tolerance 1e-6]
                  [--steps 20] [--seed 1234] [--keep DIR]

Prints both sides' per-step losses and gradient norms (before clipping), their relative
differences and the worst ones. Exits 1 when
- a per-step loss differs by more than --tolerance (relative), or a gradient norm by more
  than --norm-tolerance;
- step 0 differs by more than --step0-tolerance in the loss or 10x that in the gradient norm:
  same weights and batch, no optimizer step yet, so this isolates the forward/backward
  numerics (it is what tells a bf16 run from an fp32 one, see tests/peers/README.md);
- the run does not test what it should: the loss does not fall, or clipping acts on every
  step or on none;
2 on bad usage. Every process is bounded in time and killed on the way out; the work files
go to a temporary directory that is removed (--keep DIR keeps them).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsdp-train", required=True)
    p.add_argument("--peer-batches", required=True, help="the peer_batches program (tests/peers)")
    p.add_argument("--sharding", choices=["full", "grad-op", "hybrid"], required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--hybrid-shard-size", type=int, default=0)
    p.add_argument("--mixed-precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--clip-grad", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=1234, help="model initialization, tokens and data order")
    p.add_argument("--tolerance", type=float, default=1e-5, help="worst relative per-step loss difference")
    p.add_argument("--norm-tolerance", type=float, default=1e-5,
                   help="worst relative difference of the per-step gradient norms (before clipping)")
    p.add_argument("--step0-tolerance", type=float, default=1e-6,
                   help="relative loss difference at step 0 (same weights, same batch: forward numerics only); the "
                        "gradient norm of step 0 must agree within 10x this")
    p.add_argument("--timeout-s", type=float, default=150, help="limit for each side's run")
    p.add_argument("--keep", default="", help="keep the work files in this directory (default: a temporary one)")
    return p.parse_args()


def run_fsdp_train(a, work, hf_dir, tokens):
    metrics = os.path.join(work, "ours.jsonl")
    argv = [a.fsdp_train, "--init-from", hf_dir, "--data", tokens, "--data-format", "bin", "--token-dtype", "u16",
            "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--grad-accum", str(a.grad_accum),
            "--nproc-per-node", str(a.world_size), "--sharding", a.sharding, "--wrap", "block",
            "--mixed-precision", a.mixed_precision, "--lr", str(a.lr), "--min-lr", str(a.min_lr),
            "--warmup-steps", str(a.warmup_steps), "--max-steps", str(a.steps),
            "--weight-decay", str(a.weight_decay), "--weight-decay-all",
            "--beta1", str(a.beta1), "--beta2", str(a.beta2), "--clip-grad", str(a.clip_grad), "--seed", str(a.seed), "--log-every", "1", "--metrics-file", metrics]
    if a.sharding == "hybrid":
        argv += ["--hybrid-shard-size", str(a.hybrid_shard_size)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with peerlib.ProcessSet() as ps:
        ps.start("fsdp-train", argv, env, os.path.join(work, "ours.log"))
        ps.wait(a.timeout_s)
    return peerlib.read_metrics(metrics)


def run_fsdp2(a, work, hf_dir, batches):
    metrics = os.path.join(work, "fsdp2.jsonl")
    port = peerlib.free_port()
    argv = [peerlib.venv_python(), os.path.join(HERE, "fsdp2_peer.py"), "--hf-dir", hf_dir, "--batches", batches,
            "--sharding", a.sharding, "--mixed-precision", a.mixed_precision, "--batch-size", str(a.batch_size),
            "--grad-accum", str(a.grad_accum), "--steps", str(a.steps), "--lr", str(a.lr), "--min-lr", str(a.min_lr),
            "--warmup-steps", str(a.warmup_steps), "--max-steps", str(a.steps),
            "--weight-decay", str(a.weight_decay), "--beta1", str(a.beta1), "--beta2", str(a.beta2),
            "--clip-grad", str(a.clip_grad), "--threads", "1", "--metrics-file", metrics,
            "--timeout-s", str(a.timeout_s)]
    if a.sharding == "hybrid":
        argv += ["--hybrid-shard-size", str(a.hybrid_shard_size)]
    with peerlib.ProcessSet() as ps:
        for r in range(a.world_size):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(a.world_size), LOCAL_RANK=str(r), OMP_NUM_THREADS="1",
                       OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
            ps.start(f"FSDP2 rank {r}", argv, env, os.path.join(work, f"fsdp2.rank{r}.log"))
        try:
            ps.wait(a.timeout_s)
        except peerlib.PeerError as e:
            logged = sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0
            raise peerlib.PeerError(f"{e}\n(rank 0 had logged {logged} of {a.steps} steps)") from None
    return peerlib.read_metrics(metrics)


def compare(a, ours, theirs):
    if len(ours) != a.steps or len(theirs) != a.steps:
        raise peerlib.PeerError(f"expected {a.steps} logged steps from each side, got fsdp-train {len(ours)}, "
                                f"FSDP2 {len(theirs)}")
    print(f"{'step':>4} {'lr':>10} {'fsdp-train loss':>16} {'FSDP2 loss':>16} {'rel diff':>10} "
          f"{'our grad norm':>14} {'FSDP2 norm':>12} {'rel diff':>10}")
    worst, worst_step = 0.0, -1
    worst_norm, worst_norm_step = 0.0, -1
    for o, t in zip(ours, theirs):
        if o["step"] != t["step"] or abs(o["lr"] - t["lr"]) > 1e-12 * max(1.0, abs(t["lr"])):
            raise peerlib.PeerError(f"step {o['step']}: fsdp-train used lr {o['lr']!r}, the peer {t['lr']!r} (step "
                                    f"{t['step']}): peerlib.lr_at no longer matches src/optim/lr_schedule.cpp")
        rel = abs(o["loss"] - t["loss"]) / abs(t["loss"])
        rel_norm = abs(o["grad_norm"] - t["grad_norm"]) / abs(t["grad_norm"])
        if rel > worst:
            worst, worst_step = rel, o["step"]
        if rel_norm > worst_norm:
            worst_norm, worst_norm_step = rel_norm, o["step"]
        print(f"{o['step']:>4} {o['lr']:>10.3e} {o['loss']:>16.9f} {t['loss']:>16.9f} {rel:>10.2e} "
              f"{o['grad_norm']:>14.7f} {t['grad_norm']:>12.7f} {rel_norm:>10.2e}")
    label = f"{a.sharding} W={a.world_size}" + (f" (shard groups of {a.hybrid_shard_size})"
                                                if a.sharding == "hybrid" else "")
    label += f" A={a.grad_accum} {a.mixed_precision}"
    print(f"worst relative loss difference: {worst:.3e} at step {worst_step} ({label}; tolerance {a.tolerance:g})")
    print(f"worst relative gradient-norm difference: {worst_norm:.3e} at step {worst_norm_step} "
          f"(tolerance {a.norm_tolerance:g})")
    loss0 = abs(ours[0]["loss"] - theirs[0]["loss"]) / abs(theirs[0]["loss"])
    norm0 = abs(ours[0]["grad_norm"] - theirs[0]["grad_norm"]) / abs(theirs[0]["grad_norm"])

    # The run must exercise what it claims to: training moves the loss, and clipping
    # acts on some steps and not on others (both branches of the clip compared).
    failures = []
    if not ours[-1]["loss"] < ours[0]["loss"] * 0.97:
        failures.append(f"the loss barely moved ({ours[0]['loss']:.5f} -> {ours[-1]['loss']:.5f}); raise --lr")
    clipped = sum(1 for t in theirs if t["grad_norm"] > a.clip_grad)
    if a.clip_grad > 0 and not 0 < clipped < len(theirs):
        failures.append(f"clipping at {a.clip_grad} acted on {clipped} of {len(theirs)} steps; choose --clip-grad "
                        "between the smallest and the largest gradient norm above so both branches are compared")
    if worst > a.tolerance:
        failures.append(f"worst relative loss difference {worst:.3e} (step {worst_step}) exceeds {a.tolerance:g}")
    if worst_norm > a.norm_tolerance:
        failures.append(f"worst relative gradient-norm difference {worst_norm:.3e} (step {worst_norm_step}) exceeds "
                        f"{a.norm_tolerance:g}")
    if loss0 > a.step0_tolerance or norm0 > 10 * a.step0_tolerance:
        failures.append(f"step 0 (same weights, same batch) differs: loss by {loss0:.2e}, gradient norm by {norm0:.2e} "
                        f"(limits {a.step0_tolerance:g}, {10 * a.step0_tolerance:g}): the forward/backward numerics "
                        "differ (precision policy, model semantics), before any optimizer step")
    return worst, failures


def main():
    a = parse_args()
    for path, what in ((a.fsdp_train, "--fsdp-train"), (a.peer_batches, "--peer-batches")):
        if not os.access(path, os.X_OK):
            print(f"fsdp2_parity.py: error: {what} {path} is not an executable; build it first "
                  f"(ninja fsdp-train peer_batches)", file=sys.stderr)
            return 2
    if a.sharding == "hybrid" and (a.hybrid_shard_size < 1 or a.world_size % a.hybrid_shard_size != 0):
        print(f"fsdp2_parity.py: error: --sharding hybrid needs --hybrid-shard-size dividing --world-size "
              f"{a.world_size}, got {a.hybrid_shard_size}", file=sys.stderr)
        return 2
    started = time.monotonic()
    work = a.keep or tempfile.mkdtemp(prefix="fsdp2-parity-")
    os.makedirs(work, exist_ok=True)
    try:
        hf_dir = os.path.join(work, "hf")
        cfg = peerlib.tiny_llama_config_dict()
        peerlib.save_hf_model(hf_dir, cfg, a.seed)
        # About 1.5 epochs of windows over the run: the epoch boundary (a new permutation) is crossed.
        G = a.batch_size * a.world_size * a.grad_accum
        windows = max(1, (a.steps * G * 2) // 3)
        tokens = peerlib.write_token_file(os.path.join(work, "tokens.bin"), windows * a.seq_len + 1,
                                          cfg["vocab_size"], a.seed)
        batches = os.path.join(work, "batches")
        with peerlib.ProcessSet() as ps:
            ps.start("peer_batches",
                     [a.peer_batches, "--data", tokens, "--data-format", "bin", "--token-dtype", "u16",
                      "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
                      "--world-size", str(a.world_size), "--grad-accum", str(a.grad_accum),
                      "--seed", str(a.seed), "--steps", str(a.steps), "--out", batches],
                     dict(os.environ), os.path.join(work, "peer_batches.log"))
            ps.wait(60)
        print(f"model: {json.dumps(cfg)}")
        print(f"data: {windows} windows of {a.seq_len} tokens, global batch {G} (B {a.batch_size} x W "
              f"{a.world_size} x A {a.grad_accum}), {a.steps} steps; AdamW betas ({a.beta1}, {a.beta2}) eps 1e-8 "
              f"wd {a.weight_decay}; lr {a.lr} warmup {a.warmup_steps} cosine to {a.min_lr}; clip {a.clip_grad}")
        ours = run_fsdp_train(a, work, hf_dir, tokens)
        theirs = run_fsdp2(a, work, hf_dir, batches)
        worst, failures = compare(a, ours, theirs)
        print(f"({time.monotonic() - started:.1f} s)")
        if failures:
            for f in failures:
                print(f"FAIL: {f}", file=sys.stderr)
            print(f"work files: {work}" if a.keep else "(run with --keep DIR to keep the logs)", file=sys.stderr)
            return 1
        print("PASS")
        return 0
    except peerlib.PeerError as e:
        print(f"fsdp2_parity.py: FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

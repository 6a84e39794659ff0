#!/usr/bin/env python3
"""Per-rank peak memory of LoRA fine-tuning against full fine-tuning, measured from outside.

The 99.9M Llama of bench/cpu/llama-100m.json is trained by fsdp-train at --nproc ranks (4 by
default), FULL_SHARD, fp32 or --mixed-precision bf16, on the embedded corpus, twice in the same run:
- full fine-tuning: every parameter trainable (gradient shards and AdamW state for all of them);
- LoRA: adapters of --lora-rank (8) on q_proj,k_proj,v_proj,o_proj, every base weight frozen
  (gathered for compute, no gradient buffers, no reductions, no optimizer state).
Each rank is a direct child of this script, started with the plain-environment rendezvous
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so its peak resident set is the kernel's
high-water mark ru_maxrss from wait4() on its pid: loading, sharding and training included.
Prints both per rank, the ratio LoRA / full (the issue asks for <= 0.5), and with --record
appends the table and the command to bench/RESULTS.md. Exit status 0 when both runs finished.

With --mixed-precision bf16 the frozen base's shards hold bf16 (no fp32 master: they are never
updated), while full fine-tuning keeps fp32 masters, gradients and AdamW state. bf16 matrix products
are several times slower than fp32 on CPUs without bf16 instructions: use --steps 2 there.

  bench/cpu/lora_memory.py [--build build] [--nproc 4] [--steps 3] [--lora-rank 8]
                           [--mixed-precision fp32|bf16] [--activation-checkpointing] [--record]
"""
import argparse
import datetime
import os
import platform
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
import peerlib  # noqa: E402  (the repository's process helpers)


def rank_env(nproc, rank, port, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        env.pop(k, None)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc),
               LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    return env


def run(a, tag, extra, work):
    """One training run; returns the peak RSS (KiB) of each rank and rank 0's log tail."""
    argv = [os.path.join(a.build, "apps", "fsdp-train"), "--model", os.path.join(HERE, "llama-100m.json"),
            "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--max-steps", str(a.steps),
            "--sharding", "full", "--log-every", "1", "--seed", "1337", "--mixed-precision", a.mixed_precision] + extra
    if a.activation_checkpointing:
        argv.append("--activation-checkpointing")
    port = peerlib.free_port()
    logs = [os.path.join(work, f"{tag}.rank{r}.log") for r in range(a.nproc)]
    with peerlib.ProcessSet() as ps:
        for r in range(a.nproc):
            ps.start(f"{tag} rank {r}", argv, rank_env(a.nproc, r, port, a.threads), logs[r])
        done = ps.wait(a.timeout_s)
    return [done[f"{tag} rank {r}"][1].ru_maxrss for r in range(a.nproc)], peerlib.tail(logs[0], 4), argv


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--activation-checkpointing", action="store_true", help="in both runs")
    p.add_argument("--mixed-precision", default="fp32", choices=["fp32", "bf16"], help="in both runs")
    p.add_argument("--timeout-s", type=float, default=1200)
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="lora-memory-") as work:
        full, full_tail, _ = run(a, "full", [], work)
        lora, lora_tail, argv = run(a, "lora", ["--lora-rank", str(a.lora_rank)], work)
    mib = lambda kib: kib / 1024.0  # noqa: E731
    rows = [f"| rank {r} | {mib(f):.0f} MiB | {mib(l):.0f} MiB | {l / f:.3f} |" for r, (f, l) in
            enumerate(zip(full, lora))]
    worst = max(l / f for f, l in zip(full, lora))
    table = "\n".join(["| | full fine-tuning | LoRA r=%d | LoRA / full |" % a.lora_rank, "|---|---|---|---|"] + rows +
                      [f"| largest ratio | | | **{worst:.3f}** |"])
    print("full fine-tuning, rank 0's last lines:\n" + full_tail)
    print("LoRA, rank 0's last lines:\n" + lora_tail)
    print(table)
    if a.record:
        cmd = "bench/cpu/lora_memory.py " + " ".join(sys.argv[1:])
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## LoRA vs full fine-tuning: peak RSS per rank ({datetime.date.today()}, "
                    f"{platform.machine()}, {os.cpu_count()} cores)\n\n"
                    f"`{cmd}`: the 99.9M Llama of bench/cpu/llama-100m.json, {a.nproc} ranks, FULL_SHARD {a.mixed_precision}, "
                    f"seq {a.seq_len}, batch {a.batch_size} per rank, {a.steps} steps"
                    f"{', activation checkpointing in both' if a.activation_checkpointing else ''}; LoRA on "
                    f"q_proj,k_proj,v_proj,o_proj with every base weight frozen. Peak RSS is each rank's ru_maxrss "
                    f"(wait4 on its pid), measured from outside the process.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

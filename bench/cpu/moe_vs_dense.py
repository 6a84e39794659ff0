#!/usr/bin/env python3
"""Step time of a small Mixtral against a dense Llama with the same active
parameters per token, on CPU, measured in one run.

Both models: D=256, L=4, H=8, Hkv=4, V=512 (the byte tokenizer fits). The
Mixtral has E=8 experts of F=512, K=2 per token; the dense Llama has F = K x 512
= 1024, so every token passes through the same number of weights (the Mixtral
adds its (E, D) router). Same data, sequence length, batch and steps: real
`fsdp-train` runs (one process, FULL_SHARD with a unit per decoder layer, fp32,
AdamW), interleaved (Mixtral, dense, Mixtral, dense, ...) so that a change of
machine load hits both alike. Step time: the median of `step_time_s` in
fsdp-train's --metrics-file over the steps after the warm-up, over all repeats.

  python3 bench/cpu/moe_vs_dense.py --train build/apps/fsdp-train [--steps 12] [--warmup 3]
         [--repeats 2] [--seq-len 256] [--batch-size 4] [--record bench/RESULTS.md]

--record appends the table, with the command, the date and the machine, to the file.
Exit status: 0 when every run finished; 1 otherwise.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, vocab_size=512,
             max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
EXPERTS, TOP_K, EXPERT_F = 8, 2, 512


def configs():
    mixtral = dict(SHAPE, model_type="mixtral", intermediate_size=EXPERT_F, num_local_experts=EXPERTS,
                   num_experts_per_tok=TOP_K, router_aux_loss_coef=0.02, sliding_window=None)
    dense = dict(SHAPE, model_type="llama", intermediate_size=TOP_K * EXPERT_F)
    return {"mixtral": mixtral, "dense": dense}


def active_parameters(c):
    D, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    Dh = D // c["num_attention_heads"]
    attn = 2 * D * c["num_attention_heads"] * Dh + 2 * D * c["num_key_value_heads"] * Dh
    if c["model_type"] == "mixtral":
        mlp = c["num_experts_per_tok"] * 3 * D * c["intermediate_size"] + c["num_local_experts"] * D
    else:
        mlp = 3 * D * c["intermediate_size"]
    return 2 * V * D + L * (attn + mlp + 2 * D) + D


def run_once(args, config_path, metrics_path):
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    cmd = [args.train, "--model", config_path, "--seq-len", str(args.seq_len), "--batch-size",
           str(args.batch_size), "--max-steps", str(args.steps), "--log-every", "1", "--lr", "1e-3",
           "--metrics-file", metrics_path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print("FAIL: %s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]), file=sys.stderr)
        return None, None
    rows = [json.loads(line) for line in open(metrics_path) if line.strip()]
    times = [r["step_time_s"] for r in rows if r["step"] > args.warmup]
    return times, rows[-1]["loss"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="the fsdp-train binary")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="leading steps left out of the median")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--record", help="append the results to this markdown file")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    work = tempfile.mkdtemp(prefix="moe-bench-")
    paths = {}
    for name, c in configs().items():
        paths[name] = os.path.join(work, name + ".json")
        with open(paths[name], "w") as f:
            json.dump(c, f)
    times = {name: [] for name in paths}
    last_loss = {}
    ok = True
    for _ in range(args.repeats):
        for name in ["mixtral", "dense"]:
            t, loss = run_once(args, paths[name], os.path.join(work, name + ".metrics.jsonl"))
            if t is None:
                ok = False
                continue
            times[name].extend(t)
            last_loss[name] = loss
    if not ok or not all(times.values()):
        return 1
    tokens = args.seq_len * args.batch_size
    med = {n: statistics.median(t) for n, t in times.items()}
    lines = ["| model | active params/token | total params | median step (s) | tokens/s | final loss |",
             "|---|---|---|---|---|---|"]
    for name, c in configs().items():
        total = active_parameters(c)
        if c["model_type"] == "mixtral":
            total += c["num_hidden_layers"] * (EXPERTS - TOP_K) * 3 * c["hidden_size"] * EXPERT_F
        lines.append("| %s | %.2fM | %.2fM | %.4f | %.0f | %.3f |" % (
            name, active_parameters(c) / 1e6, total / 1e6, med[name], tokens / med[name], last_loss[name]))
    ratio = med["mixtral"] / med["dense"]
    summary = ("Mixtral / dense step time: %.2f (%d measured steps each; %d tokens per step)"
               % (ratio, len(times["mixtral"]), tokens))
    print("\n".join(lines))
    print(summary)
    if args.record:
        with open(args.record, "a") as f:
            f.write("\n## CPU: Mixtral (E=%d, K=%d) vs dense Llama with the same active parameters — %s\n\n" % (
                EXPERTS, TOP_K, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")))
            f.write("Command: `python3 bench/cpu/moe_vs_dense.py %s`\n" % " ".join(
                a if not a.startswith("/") else os.path.relpath(a) for a in sys.argv[1:]))
            f.write("Machine: %d cores, %s, load average %s before the run (shared with builds: noisy)\n\n" % (
                os.cpu_count(), platform.machine(), load))
            f.write("D=256, L=4, H=8, Hkv=4, V=512; Mixtral F=%d per expert, dense F=%d; seq %d, batch %d; "
                    "fsdp-train, 1 process, fp32, runs interleaved.\n\n" % (
                        EXPERT_F, TOP_K * EXPERT_F, args.seq_len, args.batch_size))
            f.write("\n".join(lines) + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

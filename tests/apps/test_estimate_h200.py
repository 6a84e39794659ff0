#!/usr/bin/env python3
"""fsdp-inspect --estimate against the first GPU run (bench/RESULTS.md, "First
GPU run: the GPU pack on one NVIDIA H200", 2026-11-28): fsdp-train training
Llama 3.2 1B at world size 1, seq 2048, bf16 parameters and reductions,
measured 43,599 tokens/s at batch 4 without activation checkpointing and
38,379 tokens/s at batch 8 with it (the whole layer recomputed: --ac-policy
full, the only policy then). The estimate for the same flags on the h200
preset (Note [Device roofline] in src/plan/cluster.cpp) must land within 20%
of each, and its compute by operation class must add up to its compute. (The
roofline predicts both rows 16% fast, docs/estimate.md "How close it comes";
FLOPs at 0.6 of the peak, before it, predicted them 53% and 44% fast.)
Usage: test_estimate_h200.py FSDP_INSPECT"""
import json
import subprocess
import sys

INSPECT = sys.argv[1]
TOLERANCE = 0.20
# (what, fsdp-train's flags of the row, measured tokens/s)
ROWS = [
    ("batch 4, no checkpointing", ["--batch-size", "4"], 43599),
    ("batch 8, checkpointing (full)", ["--batch-size", "8", "--activation-checkpointing", "--ac-policy", "full"],
     38379),
]
COMMON = ["--estimate", "--json", "--cluster", "h200", "--model", "llama3.2-1b", "--nproc-per-node", "1",
          "--seq-len", "2048", "--mixed-precision", "bf16", "--reduce-dtype", "bf16"]
failures = []


def check(cond, what):
    print(f"  {'ok' if cond else 'FAIL'}: {what}")
    if not cond:
        failures.append(what)


for what, flags, measured in ROWS:
    r = subprocess.run([INSPECT, *COMMON, *flags], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{what}: fsdp-inspect --estimate runs ({r.stderr.strip()[-300:]})")
    if r.returncode != 0:
        continue
    e = json.loads(r.stdout)
    predicted = e["tokens_per_s"]
    k = e["compute_classes"]
    print(f"{what}: predicted {predicted:.0f} tokens/s, measured {measured} ({predicted / measured:.3f}x); step "
          f"{e['step_time_s']:.4f} s: products {k['products_s']:.4f} s, attention {k['attention_s']:.4f} s, "
          f"memory-bound {k['memory_s']:.4f} s, optimizer {e['optimizer_s']:.4f} s")
    check(abs(predicted / measured - 1) <= TOLERANCE,
          f"{what}: within {TOLERANCE:.0%} of the measured {measured} tokens/s")
    check(min(k["products_s"], k["attention_s"], k["memory_s"]) > 0 and k["fp8_products_s"] == 0 and
          abs(sum(k.values()) - e["compute_s"]) <= 1e-9 * e["compute_s"],
          f"{what}: the classes add up to the compute ({sum(k.values()):.6f} s vs {e['compute_s']:.6f} s)")

sys.exit(1 if failures else 0)

#!/usr/bin/env python3
"""Turns the JSON lines bench/gpu/run.sh collected into its table: tokens/s,
MFU and peak memory of fsdp-train (a) against PyTorch FSDP (b), FSDP2 (c) and
FSDP2 with torch.compile per decoder layer (d) per activation-checkpointing
setting, and the tutorial MLP with and without CPU offload. Under the table,
per setting, the ratios the head-to-head is for: (a) against the first FSDP2
eager row, (a) against compiled FSDP2 (ahead, or by how much behind; where
(d) could not compile, its reason and torchtitan's published gain of compile
over eager FSDP2 instead), and the drift between the FSDP2 eager rows
measured first and again last.

MFU is given twice, the data sheet's first: tokens/s x flops per token over
the card's data-sheet peak for the compute dtype (the convention published
numbers and fsdp-train's own log use; the peak is fsdp-train's, read back from
the MFU its metrics record, so there is one table of cards), and over the
matmul rate measured in the same run. Beside each row of (a) that run.sh estimated
(estimates.jsonl), fsdp-inspect --estimate's prediction from the card's
measured rates and predicted / measured, summed up under the table.
Flops per token = 6 N + 12 L H Q T (PaLM, appendix B): N counts the weights of
every matrix product a token goes through — attention and MLP projections of
each layer and the output head (counted even when it shares the embedding's
weight; the embedding lookup itself and the norms are not products) — L
layers, H heads, Q head dimension, T the sequence length."""
import argparse
import json
import sys

# torchtitan's published gain of torch.compile over eager FSDP2, cited where (d)
# could not compile: the torchtitan repository's benchmarks folder,
# llama3_h100_202412_torchtitan, Table 1 (Llama 3.1 8B, 8 x H100, local batch
# 2, selective activation checkpointing): 5,762
# tokens/s per GPU eager, 6,667 compiled, 8,532 compiled with Float8 linears.
kTitanCompileGain = 6667 / 5762  # 1.157
kTitanCompileFloat8Gain = 8532 / 5762  # 1.481
kTitanSource = ("torchtitan's published gain (its benchmarks folder, llama3_h100_202412_torchtitan, "
                f"Llama 3.1 8B, 8 x H100): torch.compile alone +{100 * (kTitanCompileGain - 1):.1f}% tokens/s over eager "
                f"FSDP2, {kTitanCompileFloat8Gain:.2f}x with Float8 as well")


def flops_per_token(cfg, seq_len):
    d = cfg["hidden_size"]
    h = cfg["num_attention_heads"]
    q = cfg.get("head_dim") or d // h
    kv = cfg.get("num_key_value_heads") or h
    f = cfg["intermediate_size"]
    layers = cfg["num_hidden_layers"]
    per_layer = d * h * q + 2 * d * kv * q + h * q * d + 3 * d * f
    n = layers * per_layer + d * cfg["vocab_size"]
    return 6 * n + 12 * layers * h * q * seq_len, n


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def result_line(a):
    """The run's result: the last line of its output that is a JSON object.

    Libraries print to standard output too (NCCL's "NCCL version ..." banner
    on the GPU machine), so the output is not the result line alone."""
    found = None
    with open(a.output) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                found = line
    if found is None:
        print(f"report.py: {a.output} holds no JSON result line", file=sys.stderr)
        return 1
    print(found)
    return 0


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def train_row(a):
    """One result line from fsdp-train's --metrics-file (log every step)."""
    steps = [r for r in load(a.metrics) if "loss" in r and "step" in r]
    measured = [r for r in steps if r["step"] >= a.warmup]
    if not measured:
        raise SystemExit(f"report.py: {a.metrics} has no step at or after the warm-up ({a.warmup} steps)")
    seconds = sum(r["step_time_s"] for r in measured)
    tokens = len(measured) * a.batch_size * a.seq_len * measured[0]["world_size"]
    row = {"row": a.row, "kind": "llama", "ckpt": a.ckpt, "batch_size": a.batch_size,
           "tokens_per_s": tokens / seconds, "step_time_s": seconds / len(measured),
           "peak_mem_bytes": max(r["peak_mem_bytes"] for r in steps), "losses": [r["loss"] for r in steps]}
    # fsdp-train's MFU is its tokens/s over what the ranks' data-sheet peak would give: that
    # rate is the same at every step (the record's tokens/s and MFU are of one interval).
    spec = [r["tokens_per_s"] / r["mfu"] for r in measured if r.get("mfu") and r.get("tokens_per_s")]
    if spec:
        row["spec_tokens_per_s"] = sorted(spec)[len(spec) // 2]
    print(json.dumps(row))
    return 0


def failed_row(a):
    """A row that produced no result: its reason, the last line of the run's error output."""
    with open(a.stderr, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    print(json.dumps({"row": a.row, "kind": a.kind, "ckpt": a.ckpt, "error": (lines[-1] if lines else "no output")[:200]}))
    return 0


def signed_pct(ratio):
    return f"{100 * (ratio - 1):+.1f}%"


def ratios(ckpt, group, ours, fsdp2, compiled):
    """One line per activation-checkpointing setting: what the head-to-head is for."""
    words = [f"act. ckpt {'on' if ckpt else 'off'}:"]
    if ours and fsdp2:
        words.append(f"(a) / FSDP2 eager {ours['tokens_per_s'] / fsdp2['tokens_per_s']:.2f}x tokens/s, "
                     f"{ours['peak_mem_bytes'] / fsdp2['peak_mem_bytes']:.2f}x memory;")
    else:
        words.append("(a) / FSDP2 eager not measured;")
    skipped = next((r for r in group if r["row"].startswith("(d)") and "skipped" in r), None)
    if ours and compiled:
        x = ours["tokens_per_s"] / compiled["tokens_per_s"]
        words.append(f"(a) / FSDP2 compiled {x:.2f}x tokens/s "
                     f"({'ahead' if x >= 1 else f'behind by {100 * (1 - x):.1f}%'});")
    elif skipped:
        expect = ""
        if ours and fsdp2:
            expect = (f"; at that gain (a) / FSDP2 compiled would be about "
                      f"{ours['tokens_per_s'] / fsdp2['tokens_per_s'] / kTitanCompileGain:.2f}x")
        words.append(f"FSDP2 compiled did not run ({skipped['skipped']}): {kTitanSource}{expect};")
    else:
        words.append("(a) / FSDP2 compiled not measured;")
    eager = [r for r in group if r["row"].startswith("(c)") and "tokens_per_s" in r]
    if len(eager) >= 2:
        words.append(f"FSDP2 eager drift, last against first: {signed_pct(eager[-1]['tokens_per_s'] / eager[0]['tokens_per_s'])} tokens/s")
    else:
        words.append("FSDP2 eager drift not measured (fewer than two eager rows)")
    return " ".join(words)


def estimate_row(a):
    """One line of estimates.jsonl: fsdp-inspect --estimate --json's prediction for a row of (a)."""
    with open(a.estimate) as f:
        e = json.load(f)
    print(json.dumps({"row": a.row, "ckpt": a.ckpt, "cluster": a.cluster, "tokens_per_s": e["tokens_per_s"],
                      "step_time_s": e["step_time_s"], "compute_classes": e["compute_classes"],
                      "optimizer_s": e["optimizer_s"]}))
    return 0


# The issue's target for the estimate: each row predicted within this of the measured tokens/s.
ESTIMATE_TOLERANCE = 0.15


def table(a):
    with open(a.config) as f:
        cfg = json.load(f)
    with open(a.peak) as f:
        peak = json.loads(f.read())
    fpt, n = flops_per_token(cfg, a.seq_len)
    rows = load(a.results)
    # fsdp-inspect's predictions by (row, checkpointing), where run.sh made them (estimates.jsonl).
    estimates = {}
    if a.estimates:
        try:
            estimates = {(e["row"], e["ckpt"]): e for e in load(a.estimates)}
        except FileNotFoundError:
            pass
    predicted = []  # (row, ckpt, predicted / measured)
    if "tflops" in peak:
        rate = peak["tflops"] * 1e12
        print(f"matmul rate: {peak['tflops']:.4g} TFLOP/s ({peak['dtype']}, {peak['device']}); "
              f"{fpt / 1e9:.2f} GFLOP per token (N = {n / 1e6:.1f}M in matrix products, T = {a.seq_len})")
    else:  # the rate was not measured: every other column still is
        rate = None
        print(f"matmul rate: not measured ({peak.get('error', 'no result')}), so no MFU; "
              f"{fpt / 1e9:.2f} GFLOP per token (N = {n / 1e6:.1f}M in matrix products, T = {a.seq_len})")
    if "fp8_tflops" in peak:
        print(f"FP8 product rate (--fp8-linear rowwise): {peak['fp8_tflops']:.4g} TFLOP/s "
              f"({peak.get('fp8_how', 'torch._scaled_mm')})")
    elif "fp8_error" in peak:
        print(f"FP8 product rate: not measured ({peak['fp8_error']})")

    def mfu(tps):
        return tps * fpt / rate if rate else None

    # The data sheet's rate, as tokens/s at 100% (fsdp-train's; every row runs on the same card and world).
    spec_tps = next((r["spec_tokens_per_s"] for r in rows if "spec_tokens_per_s" in r), None)
    if spec_tps:
        print(f"data-sheet peak: {spec_tps * fpt / 1e12:.4g} TFLOP/s for the run's ranks together "
              f"(fsdp-train's, for the card and the compute dtype)")
    else:
        print("data-sheet peak: not known for this device (fsdp-train recorded no MFU), so no MFU against it")

    def mfu_spec(tps):
        return tps / spec_tps if spec_tps else None

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"
    print()
    print("| run | act. ckpt | batch | tokens/s | MFU (data sheet) | MFU (matmul) | peak memory "
          "| (a) / this: tokens/s | MFU | memory | ours / FSDP2 compiled | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    missing = 0
    summary = []
    for ckpt in (False, True):
        group = [r for r in rows if r.get("kind") == "llama" and r["ckpt"] == ckpt]
        ours = next((r for r in group if r["row"].startswith("(a)") and "tokens_per_s" in r), None)
        fsdp2 = next((r for r in group if r["row"].startswith("(c)") and "tokens_per_s" in r), None)
        compiled = next((r for r in group if r["row"].startswith("(d)") and "tokens_per_s" in r), None)
        for r in group:
            if "error" in r:
                missing += 1
                print(f"| {r['row']} | {'on' if ckpt else 'off'} | - | not run: {r['error']} | | | | | | | | |")
                continue
            if "skipped" in r:  # (d) where this machine cannot compile: a reason, not a failure
                print(f"| {r['row']} | {'on' if ckpt else 'off'} | - | skipped: {r['skipped']} | | | | | | | | "
                      f"instead: {kTitanSource} |")
                continue
            tps = r["tokens_per_s"]
            rel_t = rel_f = rel_m = "-"
            if ours is not None and not r["row"].startswith("(a)"):
                rel_t = f"{ours['tokens_per_s'] / tps:.2f}x"
                rel_f = rel_t if rate or spec_tps else "-"  # the same flops per token on both sides
                rel_m = f"{ours['peak_mem_bytes'] / r['peak_mem_bytes']:.2f}x"
            note = r.get("note", "")
            vs_compiled = "-"
            if r["row"].startswith("(a)") and compiled is not None:
                vs_compiled = f"{tps / compiled['tokens_per_s']:.2f}x"
            if r["row"].startswith("(c)") and r is not fsdp2:
                note = (note + "; " if note else "") + f"drift: {signed_pct(tps / fsdp2['tokens_per_s'])} tokens/s against the first (c)"
            if r["row"].startswith("(d)") and "compile_s" in r:
                note = (note + "; " if note else "") + (
                    f"compiling took {r['compile_s']:.0f} s of the warm-up, {r.get('graphs', '?')} graph(s)")
            est = estimates.get((r["row"], ckpt))
            if est is not None:
                x = est["tokens_per_s"] / tps
                predicted.append((r["row"], ckpt, x))
                note = (note + "; " if note else "") + (
                    f"estimate {est['tokens_per_s']:,.0f} tokens/s (predicted / measured {x:.2f}x, "
                    f"from {est['cluster']})")
            if r["row"].startswith("(a)") and r is not ours and fsdp2 is not None:
                # Each further row of ours (another --ac-policy) against FSDP2 in the same group.
                note = (note + "; " if note else "") + (
                    f"x (c): {tps / fsdp2['tokens_per_s']:.2f} tokens/s, "
                    f"{r['peak_mem_bytes'] / fsdp2['peak_mem_bytes']:.2f} memory")
            print(f"| {r['row']} | {'on' if ckpt else 'off'} | {r['batch_size']} | {tps:,.0f} | {pct(mfu_spec(tps))} | {pct(mfu(tps))} | "
                  f"{gib(r['peak_mem_bytes'])} | {rel_t} | {rel_f} | {rel_m} | {vs_compiled} | {note} |")
        if group:
            summary.append(ratios(ckpt, group, ours, fsdp2, compiled))
    if predicted:
        within = sum(1 for _, _, x in predicted if abs(x - 1) <= ESTIMATE_TOLERANCE)
        summary.append(
            f"estimate (fsdp-inspect --estimate from this card's measured rates): {len(predicted)} row(s), predicted / "
            f"measured {min(x for _, _, x in predicted):.2f}x to {max(x for _, _, x in predicted):.2f}x, "
            f"{within} within {ESTIMATE_TOLERANCE:.0%}")
    if summary:
        print()
        for line in summary:
            print(f"- {line}")
    mlp = [r for r in rows if r.get("kind") == "mlp"]
    if mlp:
        print()
        print("| tutorial MLP | step time | peak memory | x on-device, time | x on-device, memory |")
        print("|---|---|---|---|---|")
        base = next((r for r in mlp if r.get("config") == "on-device" and "error" not in r), None)
        for r in mlp:
            if "error" in r:
                missing += 1
                print(f"| {r['row']} | not run: {r['error']} | | | |")
                continue
            rt = f"{r['step_time_s'] / base['step_time_s']:.2f}" if base else "-"
            rm = f"{r['peak_mem_bytes'] / base['peak_mem_bytes']:.2f}" if base else "-"
            print(f"| {r['config']} ({r['layers']} x {r['width']}, batch {r['batch_size']}, {r['precision']}) | "
                  f"{r['step_time_s']:.3f} s | {gib(r['peak_mem_bytes'])} | {rt} | {rm} |")
    if missing:
        print()
        print(f"{missing} run(s) did not produce a result")
    return 1 if missing else 0


# The optimizer's bytes per fp32 shard element (Note [Device roofline] in src/plan/cluster.cpp): fused AdamW
# reads parameter, gradient and moments and writes three (28), the gradient norm reads the gradient (4),
# clipping reads and writes it (8).
OPTIMIZER_BYTES_PER_ELEMENT = 40


def cluster_file(a):
    """A cluster file for fsdp-inspect --estimate --cluster FILE with this run's own rates (docs/estimate.md)."""
    with open(a.peak) as f:
        peak = json.loads(f.read())
    missing = [k for k in ("tflops", "memory_gbyte_per_s") if k not in peak]
    if missing:
        print(f"report.py cluster-file: {a.peak} has no {', '.join(missing)} "
              f"({peak.get('error', 'not measured')}): no cluster file", file=sys.stderr)
        return 1
    c = {"name": f"measured: {peak['device']}", "nodes": 1, "procs_per_node": 1, "algorithm": "ring",
         "execution": "device", "matmul_tflops": peak["tflops"], "memory_gbyte_per_s": peak["memory_gbyte_per_s"],
         "optimizer_ns_per_element": OPTIMIZER_BYTES_PER_ELEMENT / peak["memory_gbyte_per_s"],
         "notes": f"measured by bench/gpu/matmul_peak.py on {peak['device']}: {peak['dtype']} products of "
                  f"{peak['n']} x {peak['n']}, an elementwise sum's bandwidth"}
    if "fp8_tflops" in peak:
        c["fp8_matmul_tflops"] = peak["fp8_tflops"]
        c["notes"] += f", FP8 products ({peak.get('fp8_how', 'torch._scaled_mm')})"
    else:
        c["notes"] += f", no FP8 product rate ({peak.get('fp8_error', 'not measured')})"
    if "attention_tflops" in peak:
        c["attention_tflops"] = peak["attention_tflops"]
        c["notes"] += f", causal attention at {peak['attention_shape']} (B, H, Hkv, T, Dh)"
    with open(a.out, "w") as f:
        f.write(json.dumps(c, indent=2) + "\n")
    # The same card with cuDNN's attention tried first (fsdp-train --attention-backend cudnn), where measured.
    if a.cudnn_out and "attention_cudnn_tflops" in peak:
        c["attention_tflops"] = peak["attention_cudnn_tflops"]
        c["notes"] += "; attention with cuDNN's kernel tried first, flash behind it"
        with open(a.cudnn_out, "w") as f:
            f.write(json.dumps(c, indent=2) + "\n")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("train-row", help="summarize an fsdp-train --metrics-file into one result line")
    r.add_argument("--metrics", required=True)
    r.add_argument("--row", required=True)
    r.add_argument("--ckpt", action="store_true")
    r.add_argument("--batch-size", type=int, required=True)
    r.add_argument("--seq-len", type=int, required=True)
    r.add_argument("--warmup", type=int, required=True)
    e = sub.add_parser("failed-row", help="one result line for a run that produced none")
    e.add_argument("--row", required=True)
    e.add_argument("--kind", required=True)
    e.add_argument("--ckpt", action="store_true")
    e.add_argument("--stderr", required=True, help="the run's error output")
    o = sub.add_parser("result-line", help="print the last JSON object line of a run's output")
    o.add_argument("--output", required=True, help="the run's standard output")
    t = sub.add_parser("table", help="print the result table")
    t.add_argument("--results", required=True, help="JSON lines: one per run")
    t.add_argument("--config", required=True, help="the model's Hugging Face config.json")
    t.add_argument("--seq-len", type=int, required=True)
    t.add_argument("--peak", required=True, help="matmul_peak.py's JSON line")
    t.add_argument("--estimates", help="estimate-row's JSON lines: the prediction beside each row (may be missing)")
    r = sub.add_parser("estimate-row", help="one line of estimates.jsonl from fsdp-inspect --estimate --json")
    r.add_argument("--estimate", required=True, help="fsdp-inspect --estimate --json's output")
    r.add_argument("--row", required=True)
    r.add_argument("--ckpt", action="store_true")
    r.add_argument("--cluster", required=True, help="the cluster file's name, for the note")
    c = sub.add_parser("cluster-file", help="write a cluster file with the rates matmul_peak.py measured")
    c.add_argument("--peak", required=True, help="matmul_peak.py's JSON line")
    c.add_argument("--out", required=True, help="the cluster file to write")
    c.add_argument("--cudnn-out", help="also this file, with cuDNN's attention rate, where it was measured")
    a = p.parse_args()
    return {"train-row": train_row, "failed-row": failed_row, "result-line": result_line, "table": table,
            "cluster-file": cluster_file, "estimate-row": estimate_row}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())

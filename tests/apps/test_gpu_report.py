#!/usr/bin/env python3
"""bench/gpu/report.py's table gives MFU both ways, the data sheet's first
(issue 48): against the card's data-sheet peak, read back from the MFU that
fsdp-train's metrics record, and against the matmul rate measured in the same
run. A run of fsdp-train is made up here (its metrics lines as the trainer
writes them), so the expected percentages are known; the CPU's dry run has no
data-sheet peak and must say so.
Usage: test_gpu_report.py REPORT_PY WORK_DIR"""
import json
import pathlib
import subprocess
import sys

REPORT, WORK = sys.argv[1], pathlib.Path(sys.argv[2])
WORK.mkdir(parents=True, exist_ok=True)
failures = []


def check(cond, what):
    print(f"  {'ok' if cond else 'FAIL'}: {what}")
    if not cond:
        failures.append(what)


def report(*args):
    r = subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=60)
    check(r.returncode in (0, 1), f"report.py {args[0]} runs ({r.stderr.strip()[-300:]})")
    return r.stdout


cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
       "num_hidden_layers": 2, "vocab_size": 256}
(WORK / "config.json").write_text(json.dumps(cfg))
seq, batch = 32, 2
# flops_per_token as report.py counts them (PaLM): 6 N + 12 L H Q T.
d, h, q, kv, f, layers = 64, 4, 16, 2, 128, 2
n = layers * (d * h * q + 2 * d * kv * q + h * q * d + 3 * d * f) + d * 256
fpt = 6 * n + 12 * layers * h * q * seq

for spec_known in (True, False):
    # fsdp-train at world size 1: 0.5 s a step -> 128 tokens/s; its MFU against a data sheet of 1 GFLOP/s.
    spec_flops = 1e9
    lines = []
    for step in range(1, 6):
        rec = {"step": step, "loss": 5.0, "world_size": 1, "step_time_s": 0.5, "peak_mem_bytes": 2**30,
               "tokens_per_s": 128.0}
        if spec_known:
            rec["mfu"] = 128.0 * fpt / spec_flops
        lines.append(json.dumps(rec))
    (WORK / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    ours = report("train-row", "--metrics", str(WORK / "metrics.jsonl"), "--row", "(a) fsdp-train",
                  "--batch-size", str(batch), "--seq-len", str(seq), "--warmup", "2").strip()
    peer = json.dumps({"row": "(c) PyTorch FSDP2", "kind": "llama", "ckpt": False, "batch_size": batch,
                       "tokens_per_s": 64.0, "step_time_s": 1.0, "peak_mem_bytes": 2**31})
    (WORK / "results.jsonl").write_text(ours + "\n" + peer + "\n")
    # A measured matmul rate of 2 GFLOP/s: half the data sheet's MFU.
    (WORK / "peak.json").write_text(json.dumps({"device": "card", "dtype": "bfloat16", "n": 512, "tflops": 2e-3}))
    table = report("table", "--results", str(WORK / "results.jsonl"), "--config", str(WORK / "config.json"),
                   "--seq-len", str(seq), "--peak", str(WORK / "peak.json"))
    print(table)
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]] for l in table.splitlines()
            if l.startswith("| (")}
    header = next((l for l in table.splitlines() if l.startswith("| run |")), "")
    check(header.index("MFU (data sheet)") < header.index("MFU (matmul)") if "MFU (matmul)" in header else False,
          "the data sheet's MFU comes first")
    mfu_ours, mfu_peer = 128.0 * fpt / spec_flops, 64.0 * fpt / spec_flops
    want = (f"{100 * mfu_ours:.1f}%", f"{100 * mfu_ours / 2:.1f}%") if spec_known else ("-", f"{100 * mfu_ours / 2:.1f}%")
    got = tuple(rows.get("(a) fsdp-train", ["", "", "", "", ""])[3:5])
    check(got == want, f"(a) MFU data sheet, matmul: {got} (want {want}; spec known: {spec_known})")
    want_peer = (f"{100 * mfu_peer:.1f}%" if spec_known else "-", f"{100 * mfu_peer / 2:.1f}%")
    got_peer = tuple(rows.get("(c) PyTorch FSDP2", ["", "", "", "", ""])[3:5])
    check(got_peer == want_peer, f"(c) MFU against the same peaks: {got_peer} (want {want_peer})")
    check(("data-sheet peak: not known" in table) != spec_known, "the table says whether the data sheet is known")

# The cluster file of the run's own rates (docs/estimate.md, "The GPU roofline").
(WORK / "peak.json").write_text(json.dumps({"device": "card", "dtype": "bfloat16", "n": 512, "tflops": 700.0,
                                            "memory_gbyte_per_s": 4000.0, "attention_tflops": 300.0,
                                            "attention_shape": "4,32,8,2048,64"}))
report("cluster-file", "--peak", str(WORK / "peak.json"), "--out", str(WORK / "cluster.json"))
c = json.loads((WORK / "cluster.json").read_text())
check((c["matmul_tflops"], c["memory_gbyte_per_s"], c["attention_tflops"], c["execution"]) ==
      (700.0, 4000.0, 300.0, "device"), f"the cluster file carries the measured rates ({c})")
check(abs(c["optimizer_ns_per_element"] - 40 / 4000.0) < 1e-12, "the optimizer streams 40 bytes at that bandwidth")
(WORK / "peak.json").write_text(json.dumps({"error": "no card"}))
r = subprocess.run([sys.executable, REPORT, "cluster-file", "--peak", str(WORK / "peak.json"), "--out",
                    str(WORK / "none.json")], capture_output=True, text=True, timeout=60)
check(r.returncode == 1 and "no cluster file" in r.stderr and not (WORK / "none.json").exists(),
      "without measured rates no cluster file is written")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("every check passed")

#!/usr/bin/env python3
"""fsdp-inspect --estimate, --calibrate and --json from the command line.

    test_inspect_estimate.py FSDP_INSPECT WORK_DIR [FSDP_TRAIN DATA]

Checks (each prints one line; exit 1 if any fails):
  preset     --estimate --cluster p5.48xlarge --json for torchtitan's Llama 3.1 8B run: every
             promised field (step_time_s, tokens_per_s, exposed_comm_s, mfu, scaling_efficiency)
             is a number, mfu in (0, 1), one unit per decoder layer plus the root, and
             tokens_per_s = 8 x tokens_per_s_per_process; 16 nodes of the same: more tokens/s,
             and a scaling curve at 1, 2, 4, 8 and 16 nodes.
  calibrate  --calibrate FILE on the tiny model measures every unit on this machine and the
             estimate read back from FILE has mfu null (no known peak) and a positive step time;
             the same FILE with another --seq-len is refused (exit 2, naming --seq-len).
  two procs  --calibrate FILE --nproc-per-node 2 starts both processes, measures the path between them
             (intra rate, latency, CPU per byte) and the units at once; --estimate --cluster FILE
             --nproc-per-node 2 right after predicts a step with communication; with FSDP_TRAIN, the
             same run measured (6 steps, the median of steps >= 2) and the ratio printed (no
             timing assertion: this machine's load decides it).
  levers     fsdp-train's model levers read by the estimate on the h200 preset (Llama 3.2 1B, batch
             4): --kernels fused moves fewer bytes (memory-bound time down, products unchanged) and
             drops the optimizer's clipping pass; --fp8-linear rowwise moves the decoder's products to
             FP8 (fp8_products_s > 0, bf16 products down to the head's and the weight gradients) and
             adds their quantization's bytes; --ac-policy full / tail / selective recompute less in
             that order; none of them is named as ignored; on the a100 preset (no FP8 rate) the
             assumptions say that FP8 products are timed at the bf16 rate.
  usage      --estimate without --cluster, an unknown preset, --compute-efficiency 2: exit 2
             with one error line naming the flag.
"""

import json
import subprocess
import sys
from pathlib import Path

INSPECT, WORK = sys.argv[1], Path(sys.argv[2])
TRAIN, DATA = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, None)
WORK.mkdir(parents=True, exist_ok=True)
failures = []


def check(cond, what):
    print(f"  {'ok' if cond else 'FAIL'}: {what}")
    if not cond:
        failures.append(what)


def run(*args):
    return subprocess.run([INSPECT, *args], capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


titan = ["--estimate", "--cluster", "p5.48xlarge", "--model", "llama3.1-8b", "--seq-len", "8192", "--batch-size", "2",
         "--mixed-precision", "bf16", "--json"]
r = run(*titan)
check(r.returncode == 0, f"preset estimate exits 0 ({r.stderr.strip()[-200:]})")
if r.returncode == 0:
    e = json.loads(r.stdout)
    for k in ("step_time_s", "tokens_per_s", "exposed_comm_s", "mfu", "scaling_efficiency"):
        check(isinstance(e.get(k), (int, float)), f"'{k}' is a number: {e.get(k)!r}")
    check(0 < e["mfu"] < 1, f"mfu {e['mfu']} in (0, 1)")
    check(len(e["units"]) == 35, f"35 units (root, embedding, 32 layers, head): {len(e['units'])}")
    check(abs(e["tokens_per_s"] - 8 * e["tokens_per_s_per_process"]) < 1e-6 * e["tokens_per_s"],
          "tokens_per_s is 8 processes' worth")
    r16 = run(*titan, "--nnodes", "16")
    e16 = json.loads(r16.stdout) if r16.returncode == 0 else {}
    check(e16.get("tokens_per_s", 0) > e["tokens_per_s"], "16 nodes estimate more tokens/s than one")
    check(e16.get("world_size") == 128, f"16 nodes x 8: world size 128 ({e16.get('world_size')})")
    curve = e16.get("scaling", [])
    check([x["nodes"] for x in curve] == [1, 2, 4, 8, 16], f"scaling curve at 1, 2, 4, 8, 16 nodes: {curve}")
    check(curve and curve[0]["scaling_efficiency"] == 1 and curve[-1]["tokens_per_s"] == e16["tokens_per_s"],
          "the curve starts at efficiency 1 and ends with the estimate itself")

# The plan's loss chunk is the run's: CUDA's (2048 rows at V = 128,256) on a GPU cluster, the CPU's (128)
# without one, --loss-chunk-rows where given (issue 48: the estimate planned the CPU's chunk for an H200).
one_b = ["--model", "llama3.2-1b", "--seq-len", "2048", "--batch-size", "4", "--mixed-precision", "bf16"]
for args, rows, why in (
        (["--estimate", "--cluster", "h200", "--nproc-per-node", "1"], "2048", " (CUDA's chunk)"),
        ([], "128", ""),
        (["--device", "cuda"], "2048", " (CUDA's chunk)"),
        (["--estimate", "--cluster", "h200", "--nproc-per-node", "1", "--loss-chunk-rows", "512"], "512",
         " (--loss-chunk-rows)")):
    r = run(*one_b, *args)
    line = next((l.strip() for l in r.stdout.splitlines() if l.strip().startswith("loss:")), r.stderr.strip()[-200:])
    check(r.returncode == 0 and line.startswith(f"loss: {rows} tokens per chunk of logits{why}:"),
          f"{' '.join(args) or 'no cluster'}: the plan's loss chunk is {rows} rows: {line}")

cal = WORK / "tiny.cluster.json"
tiny = ["--model", "tiny", "--seq-len", "64", "--batch-size", "2"]
r = run(*tiny, "--calibrate", str(cal), "--calibrate-steps", "1")
check(r.returncode == 0 and cal.exists(), f"--calibrate writes the cluster file ({r.stderr.strip()[-200:]})")
if cal.exists():
    units = json.loads(cal.read_text())["calibration"]["units"]
    check(sorted(units) == ["", "lm_head", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                            "model.layers.3"],
          f"every unit measured: {sorted(units)}")
    check(all(u["forward_s"] > 0 and u["backward_s"] > 0 for u in units.values()), "positive unit times")
    r = run(*tiny, "--estimate", "--cluster", str(cal), "--json")
    e = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and e.get("mfu", 0) is None, f"calibrated estimate: mfu null ({e.get('mfu', '?')!r})")
    check(e.get("step_time_s", 0) > 0, "calibrated estimate: positive step time")
    r = run("--model", "tiny", "--seq-len", "128", "--batch-size", "2", "--estimate", "--cluster", str(cal))
    check(r.returncode == 2 and "--seq-len" in r.stderr, f"another --seq-len refused with exit 2: {r.stderr.strip()}")

# Calibrate, then estimate, in two commands, for a run of 2 processes on this machine: --calibrate
# starts both (they measure their units at once) and the path between them, so the intra-node rate
# the estimate needs is in the file.
cal2 = WORK / "tiny.2procs.json"
r = run(*tiny, "--calibrate", str(cal2), "--calibrate-steps", "1", "--nproc-per-node", "2",
        "--calibrate-link-seconds", "0.5")
check(r.returncode == 0 and cal2.exists(), f"--calibrate --nproc-per-node 2 writes the file ({r.stderr.strip()[-300:]})")
if cal2.exists():
    c = json.loads(cal2.read_text())
    check(c["procs_per_node"] == 2 and c["intra"]["gbit_per_s"] > 0 and c["intra"]["latency_us"] > 0,
          f"the path between the 2 processes measured: {c['intra']}, procs_per_node {c['procs_per_node']}")
    check(c["host_cpu_ns_per_byte"] > 0, f"CPU per byte measured: {c['host_cpu_ns_per_byte']}")
    r = run(*tiny, "--estimate", "--cluster", str(cal2), "--nproc-per-node", "2", "--json")
    e = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0, f"--estimate --cluster FILE --nproc-per-node 2 right after exits 0 ({r.stderr.strip()[-300:]})")
    check(e.get("world_size") == 2 and e.get("comm_s", 0) > 0 and e.get("step_time_s", 0) > 0,
          f"2 processes, communication on the path between them: world {e.get('world_size')}, comm "
          f"{e.get('comm_s')} s, step {e.get('step_time_s')} s")
    if TRAIN and e:
        metrics = WORK / "tiny.2procs.metrics.jsonl"
        metrics.unlink(missing_ok=True)
        t = subprocess.run([TRAIN, *tiny, "--nproc-per-node", "2", "--data", DATA, "--max-steps", "6",
                            "--log-every", "1", "--metrics-file", str(metrics)], capture_output=True, text=True,
                           timeout=150, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        check(t.returncode == 0, f"the run itself trains ({t.stderr.strip()[-300:]})")
        if t.returncode == 0:
            steps = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
            times = sorted(x["step_time_s"] for x in steps if x["step"] >= 2)
            measured = times[len(times) // 2]
            print(f"  measured step {measured:.4f} s, predicted {e['step_time_s']:.4f} s: predicted / measured "
                  f"{e['step_time_s'] / measured:.2f}")

# The model's levers (docs/estimate.md, "The GPU roofline").
levers = ["--estimate", "--json", "--cluster", "h200", "--nproc-per-node", "1", *one_b]


def lever(*args, cluster=None):
    r = run(*levers, *args, *(["--cluster", cluster] if cluster else []))
    check(r.returncode == 0 and "ignored" not in r.stderr,
          f"{' '.join(args) or 'reference'}: accepted and not ignored ({r.stderr.strip()[-200:]})")
    return json.loads(r.stdout) if r.returncode == 0 else None


ref, fused, fp8 = lever(), lever("--kernels", "fused"), lever("--fp8-linear", "rowwise")
if ref and fused and fp8:
    k0, k1, k2 = ref["compute_classes"], fused["compute_classes"], fp8["compute_classes"]
    check(k1["memory_s"] < k0["memory_s"] and k1["products_s"] == k0["products_s"],
          f"--kernels fused: memory-bound {k1['memory_s']:.4f} s < {k0['memory_s']:.4f} s, products the same")
    check(abs(fused["optimizer_s"] / ref["optimizer_s"] - 32 / 40) < 1e-9,
          f"--kernels fused: the optimizer moves 32 of 40 bytes per element ({fused['optimizer_s']:.5f} s "
          f"against {ref['optimizer_s']:.5f} s)")
    check(k0["fp8_products_s"] == 0 and k2["fp8_products_s"] > 0 and k2["products_s"] < k0["products_s"] and
          k2["memory_s"] > k0["memory_s"],
          f"--fp8-linear rowwise: FP8 products {k2['fp8_products_s']:.4f} s, bf16 products {k2['products_s']:.4f} "
          f"< {k0['products_s']:.4f} s, memory-bound {k2['memory_s']:.4f} > {k0['memory_s']:.4f} s")
    check(abs(sum(k2.values()) - fp8["compute_s"]) <= 1e-9 * fp8["compute_s"], "FP8: the classes add up")
ckpt = {p: lever("--activation-checkpointing", "--ac-policy", p) for p in ("full", "tail", "selective")}
if all(ckpt.values()):
    rec = {p: sum(u["recompute_s"] for u in e["units"]) for p, e in ckpt.items()}
    check(rec["full"] > rec["tail"] > rec["selective"] > 0,
          f"--ac-policy: recomputation full {rec['full']:.4f} s > tail {rec['tail']:.4f} s > selective "
          f"{rec['selective']:.4f} s")
a100 = lever("--fp8-linear", "rowwise", cluster="a100")
if a100:
    check("no FP8 product rate" in a100["cluster"]["notes"] and a100["compute_classes"]["fp8_products_s"] > 0,
          f"a100: FP8 products timed at the bf16 rate, said in the assumptions")

for args, names in ((["--estimate"], "--cluster"), (["--estimate", "--cluster", "dgx-9"], "dgx-9"),
                    (["--estimate", "--cluster", "h100", "--compute-efficiency", "2"], "--compute-efficiency")):
    r = run("--model", "tiny", *args)
    lines = [l for l in r.stderr.splitlines() if "error" in l]
    check(r.returncode == 2 and len(lines) == 1 and names in lines[0],
          f"{' '.join(args)}: exit 2, one error line naming {names} ({r.stderr.strip()})")

print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)

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

for args, names in ((["--estimate"], "--cluster"), (["--estimate", "--cluster", "dgx-9"], "dgx-9"),
                    (["--estimate", "--cluster", "h100", "--compute-efficiency", "2"], "--compute-efficiency")):
    r = run("--model", "tiny", *args)
    lines = [l for l in r.stderr.splitlines() if "error" in l]
    check(r.returncode == 2 and len(lines) == 1 and names in lines[0],
          f"{' '.join(args)}: exit 2, one error line naming {names} ({r.stderr.strip()})")

print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)

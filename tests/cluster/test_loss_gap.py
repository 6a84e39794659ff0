#!/usr/bin/env python3
"""bench/cluster/loss_gap.py against a stand-in fsdp-train: its table, --keep and its refusals.

    test_loss_gap.py SOURCE_DIR WORK_DIR

The real rows train the 100m model for 300 steps (about 15 minutes each), so this
drives the script with a stand-in for fsdp-train that writes the metrics a run
would, with losses chosen so that every gap is known: fp32's held-out loss is
2 + seed / 100, a compressed row's is that times (1 + g / 100) with g = 1, 3, 8 %
for seeds 1, 2, 3, and its exported masters evaluate to half that gap. Each
invocation appends a line to a log, so the test counts what was rerun.

Checks (each prints one line; exit 1 if any fails):
  table    two seeds: the paired gaps, their mean and its 95% Student-t interval
           (t = 12.706 at one degree of freedom), the masters read back through
           `fsdp-train eval` of the export, the training-loss tail.
  keep     the same command again runs nothing and prints the same table; a third
           seed runs only that seed's rows; a kept row whose key differs (another
           --steps) and every row after the binary changed are rerun.
  failure  a row whose fsdp-train exits non-zero: loss_gap.py exits 1 with one line naming
           the row, the seed, the exit status and where the finished rows are kept (no
           traceback), and keeps no result for the failed row.
  usage    --seeds that are not integers, repeated seeds, an unknown option: exit 2,
           one line naming the value and what is accepted.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE, WORK = Path(sys.argv[1]), Path(sys.argv[2])
SCRIPT = SOURCE / "bench" / "cluster" / "loss_gap.py"
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)
failures = []


def check(cond, what):
    print(f"  {'ok' if cond else 'FAIL'}: {what}")
    if not cond:
        failures.append(what)


# The stand-in: argv as loss_gap.py passes it to fsdp-train (training, or `eval` of an export).
STAND_IN = r'''#!PYTHON
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
def flag(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
with open(os.environ["STAND_IN_LOG"], "a") as log:
    print(" ".join(argv), file=log)
GAP = {1: 1.0, 2: 3.0, 3: 8.0}
metrics = Path(flag("--metrics-file"))
if argv[0] == "eval":
    masters = json.loads((Path(flag("--init-from")) / "masters.json").read_text())
    metrics.write_text(json.dumps({"eval_loss": masters}) + "\n")
    sys.exit(0)
seed, steps = int(flag("--seed")), int(flag("--max-steps"))
compressed = "--all-gather-wire" in argv or "--reduce-scatter-wire" in argv
if compressed and os.environ.get("STAND_IN_FAIL"):
    print("stand-in: failing as asked", file=sys.stderr)
    sys.exit(3)
g = GAP[seed] if compressed else 0.0
base = 2 + seed / 100
with open(metrics, "w") as m:
    for step in range(1, steps + 1):
        print(json.dumps({"step": step, "loss": (6 - step / 100) * (1 + g / 100)}), file=m)
    if flag("--val-data"):
        print(json.dumps({"step": steps, "eval_loss": base * (1 + g / 100)}), file=m)
if flag("--export-hf"):
    out = Path(flag("--export-hf"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "masters.json").write_text(json.dumps(base * (1 + g / 200)))
'''
train = WORK / "fsdp-train"
train.write_text(STAND_IN.replace("PYTHON", sys.executable, 1))
train.chmod(0o755)
log = WORK / "invocations.log"
keep = WORK / "keep"


def loss_gap(*args, fail=False):
    """(exit status, stdout, stderr, invocations of the stand-in) of one loss_gap.py run."""
    log.write_text("")
    env = dict(os.environ, STAND_IN_LOG=str(log), **({"STAND_IN_FAIL": "1"} if fail else {}))
    r = subprocess.run([sys.executable, str(SCRIPT), "--train", str(train), "--steps", "30", *args],
                       capture_output=True, text=True, env=env, timeout=300)
    return r.returncode, r.stdout, r.stderr, [line for line in log.read_text().splitlines() if line]


def row(out, label, name):
    """The table row of `name` under the header naming `label`."""
    table = out.split(f"| wire ({label})", 1)[1].split("\n\n", 1)[0]
    return next((line for line in table.splitlines() if line.startswith(f"| {name} |")), "")


# table: seeds 1 and 2, gaps +1% and +3% (masters +0.5% and +1.5%).
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "1,2", "--keep", str(keep))
check(rc == 0, f"two seeds exit 0 ({err.strip()[-300:]})")
check(len(calls) == 6, f"fp32, the row and its masters' eval per seed: 6 invocations ({len(calls)})")
held = row(out, "held-out loss after the last step", "ag-int8+rs-bf16")
check("2.0301 (+1.00%)" in held and "2.0806 (+3.00%)" in held, f"held-out losses and paired gaps: {held}")
check("+2.00% ± 12.71% (-10.71% .. +14.71%)" in held,
      f"mean +2.00%, half-width 12.706 x stdev 1.414 / sqrt 2: {held}")
masters = row(out, "held-out loss of the exported masters, native forward", "ag-int8+rs-bf16")
check("(+0.50%)" in masters and "(+1.50%)" in masters, f"masters read back from the export: {masters}")
check(sum(c.startswith("eval ") for c in calls) == 2, "the exported masters are evaluated once per seed")
fp32 = row(out, "held-out loss after the last step", "fp32")
check("2.0100 | 2.0200" in fp32 and "fp32 across seeds: 0.50% of its mean" in fp32, f"fp32's row: {fp32}")
tail = row(out, "mean training loss of the last 20 steps", "ag-int8+rs-bf16")
check("(+1.00%)" in tail and "(+3.00%)" in tail, f"training-loss tail: {tail}")
kept = sorted(p.name for p in keep.iterdir())
check(kept == ["ag-int8+rs-bf16.seed1.json", "ag-int8+rs-bf16.seed2.json", "fp32.seed1.json", "fp32.seed2.json"],
      f"one kept file per row and seed, no partial file: {kept}")
first_table = out[out.index("| wire"):]

# keep: nothing reruns; a new seed runs only its own rows.
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "1,2", "--keep", str(keep))
check(rc == 0 and not calls, f"the same command again runs nothing ({len(calls)} invocations, exit {rc})")
check(out.count("(kept)") == 4 and out[out.index("| wire"):] == first_table, "and prints the same table")
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "1,2,3", "--keep", str(keep))
check(rc == 0 and len(calls) == 3 and all("--seed 3" in c for c in calls if not c.startswith("eval")),
      f"a third seed runs only its rows: {len(calls)} invocations")
held = row(out, "held-out loss after the last step", "ag-int8+rs-bf16")
check("+4.00% ± 8.96%" in held, f"gaps 1, 3, 8: mean 4.00%, half-width 4.303 x 3.606 / sqrt 3 = 8.96: {held}")

# keep: a kept row with another key is not reused, nor any after the binary changed.
stale = keep / "fp32.seed1.json"
saved = json.loads(stale.read_text())
saved["key"]["steps"] = 300
stale.write_text(json.dumps(saved))
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "1", "--keep", str(keep))
check(rc == 0 and len(calls) == 1 and "--seed 1" in calls[0] and "--all-gather-wire" not in calls[0],
      f"a kept row of another --steps is rerun, alone: {calls}")
train.write_text(train.read_text() + "# another build\n")
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "1", "--keep", str(keep))
check(rc == 0 and len(calls) == 3, f"another fsdp-train binary reruns every row: {len(calls)} invocations")

# failure: named, non-zero, nothing kept for the failed row.
fresh = WORK / "keep-fail"
rc, out, err, calls = loss_gap("--options", "ag-int8+rs-bf16", "--seeds", "5", "--keep", str(fresh), fail=True)
check(rc == 1 and "loss_gap.py: ag-int8+rs-bf16, seed 5: fsdp-train exited 3" in err and "Traceback" not in err
      and f"the rows finished before it are kept in {fresh}" in err,
      f"a failed row: exit {rc}, named ({err.strip().splitlines()[-1] if err.strip() else ''})")
check(sorted(p.name for p in fresh.iterdir()) == ["fp32.seed5.json"], "only the finished fp32 row is kept")

# usage
for args, want in [(["--seeds", "1,x"], "--seeds '1,x' is not a comma-separated list of integers"),
                   (["--seeds", "4,4"], "--seeds '4,4' needs one or more distinct non-negative integers"),
                   (["--options", "int4"], "unknown option 'int4' (known: ag-bf16,")]:
    rc, out, err, calls = loss_gap(*args)
    check(rc == 2 and want in err and not calls, f"{' '.join(args)}: exit 2, '{want}' ({err.strip()})")

shutil.rmtree(WORK, ignore_errors=True)
print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
sys.exit(1 if failures else 0)

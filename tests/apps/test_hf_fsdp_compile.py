#!/usr/bin/env python3
"""bench/gpu/hf_fsdp.py --impl fsdp2-compile, the head-to-head's strongest peer
(issue 48), on the CPU with the `tiny` preset:
  - with this machine's C++ compiler it compiles: inductor's C++ backend builds
    the decoder layer once and every layer runs that one graph (a fallback to
    eager would be an error), the warm-up's compile time is in the result, and
    the losses are eager FSDP2's;
  - without a C++ compiler (CXX names none, as in CI's minimal root) its result
    line says so and the run exits 0, so the head-to-head's row gives the reason;
  - with a "compiler" that answers --version and builds nothing (true), the
    compile fails inside the first step, and the result line says that instead.
Usage: test_hf_fsdp_compile.py HF_FSDP_PY FSDP_INSPECT WORK_DIR"""
import array
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys

from checklist import check, finish

HF_FSDP, INSPECT, WORK = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

subprocess.run([INSPECT, "--model", "tiny", "--write-hf-config", str(WORK / "config.json")], check=True,
               stdout=subprocess.DEVNULL, timeout=60)
layers = json.loads((WORK / "config.json").read_text())["num_hidden_layers"]
rng = random.Random(7)
(WORK / "tokens.bin").write_bytes(array.array("I", (rng.randrange(512) for _ in range(4 * 2 * 64))).tobytes())


def run(impl, **env):
    """hf_fsdp.py's one result line (a dict), or None."""
    r = subprocess.run([sys.executable, HF_FSDP, "--impl", impl, "--config", str(WORK / "config.json"),
                        "--tokens", str(WORK / "tokens.bin"), "--seq-len", "64", "--batch-size", "2",
                        "--steps", "1", "--warmup", "1", "--device", "cpu"],
                       capture_output=True, text=True, timeout=240,
                       env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", **env})  # one core: PROCESSORS 1
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    check(r.returncode == 0 and len(lines) == 1,
          f"{impl} {env or ''}: exit {r.returncode}, {len(lines)} result line(s) ({r.stderr.strip()[-400:]})")
    return json.loads(lines[-1]) if lines else None


eager = run("fsdp2")
compiled = run("fsdp2-compile")
if eager and compiled:
    print(f"  compiled: {json.dumps({k: compiled.get(k) for k in ('compile_s', 'graphs', 'losses', 'skipped')})}")
    check("skipped" not in compiled, f"it compiled here: {compiled.get('skipped')}")
    check(compiled.get("graphs") == 1, f"one graph for all {layers} layers: {compiled.get('graphs')}")
    check(isinstance(compiled.get("compile_s"), float), f"the compile time is reported: {compiled.get('compile_s')}")
    worst = max((abs(x - y) / abs(y) for x, y in zip(compiled.get("losses", []), eager["losses"])), default=1.0)
    check(len(compiled.get("losses", [])) == len(eager["losses"]) == 2 and worst < 1e-3,
          f"eager FSDP2's losses: {compiled.get('losses')} against {eager['losses']} (worst relative {worst:.1e})")

none = run("fsdp2-compile", CXX=str(WORK / "no-such-compiler"))
check(bool(none) and none.get("skipped", "").startswith("no C++ compiler for inductor's CPU backend"),
      f"without a compiler the row says why: {none and none.get('skipped')}")
check(bool(none) and "tokens_per_s" not in none, "and measures nothing")

# A fresh cache, so the kernels are built by the broken compiler, not read back.
broken = run("fsdp2-compile", CXX=shutil.which("true") or "/bin/true",
             TORCHINDUCTOR_CACHE_DIR=str(WORK / "inductor-cache"), TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
check(bool(broken) and broken.get("skipped", "").startswith("torch.compile failed in step 0: "),
      f"a compiler that builds nothing: the row says the compile failed: {broken and broken.get('skipped')}")

finish()

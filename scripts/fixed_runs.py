#!/usr/bin/env python3
"""Fixed fsdp-train runs whose results must not change under a refactoring.

  scripts/fixed_runs.py record --train build/apps/fsdp-train --out before.json
  scripts/fixed_runs.py record --train build/apps/fsdp-train --out after.json
  scripts/fixed_runs.py compare before.json after.json

`record` runs a fixed list of short trainings of the tiny models on the
repository's fallback corpus (2 processes each: every sharding strategy, bf16
and pure bf16, gradient accumulation, activation checkpointing, a checkpoint
and a resume from it, evaluation, a Hugging Face export and the conversion of
a checkpoint to one, LoRA with its adapter and merged exports, Mixtral) and
writes one JSON file: per run, every logged step's loss and gradient norm and
every evaluation loss as the metrics file holds them (their exact decimal
text), and the SHA-256 of every file in its checkpoint and export
directories. Timing fields (speeds, step times, memory peaks) are left out:
they differ from run to run.

`compare` prints every difference between two such files and exits 1 when
there is one, 0 when the runs are identical: the same losses, gradient norms,
evaluation losses and file bytes.

The runs take place in one fixed scratch directory (--work, emptied first), so
that paths recorded inside checkpoints are the same for both binaries.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent
CORPUS = SOURCE / "data" / "fallback_corpus.jsonl"
VAL_CORPUS = SOURCE / "data" / "fallback_corpus.val.jsonl"

# Metrics whose values must be identical; the rest of a record is timing.
EXACT_KEYS = ("step", "loss", "grad_norm", "lr", "eval_loss", "eval_tokens", "loss_scale", "skipped",
              "allgather_bytes", "reduce_scatter_bytes", "allreduce_bytes", "world_size", "unsharded_bound_bytes")

BASE = ["--model", "tiny", "--data", str(CORPUS), "--seq-len", "32", "--batch-size", "2", "--log-every", "1",
        "--lr", "1e-3", "--warmup-steps", "1", "--nproc-per-node", "2"]


def runs():
    """(name, [(extra flags, uses checkpoint dir, uses export dir)], ...) in order."""
    steps = ["--max-steps", "4"]
    ck = ["--checkpoint-dir", "{ck}", "--checkpoint-every", "2"]
    ex = ["--export-hf", "{ex}"]
    ev = ["--val-data", str(VAL_CORPUS), "--eval-every", "2", "--eval-windows", "8"]
    return [
        ("full", [steps + ck + ex + ev]),
        ("grad-op", [steps + ["--sharding", "grad-op"] + ck]),
        ("none", [steps + ["--sharding", "none"] + ck]),
        ("hybrid", [steps + ["--sharding", "hybrid", "--hybrid-shard-size", "1"] + ck]),
        ("bf16", [steps + ["--mixed-precision", "bf16"] + ck + ex]),
        ("bf16-pure", [steps + ["--mixed-precision", "bf16-pure"] + ck]),
        ("grad-accum", [steps + ["--grad-accum", "2"] + ck]),
        ("checkpointing", [steps + ["--activation-checkpointing", "--wrap", "size:20000"] + ck]),
        ("prefetch", [steps + ["--forward-prefetch", "--backward-prefetch", "post", "--cpu-offload"]]),
        ("freeze", [steps + ["--freeze", "embed_tokens|layers\\.0\\.", "--lr-scale", "norm=2"] + ck]),
        # 2 steps, then a resume to 4 (from the checkpoint of step 2), with an export at the end.
        ("resume", [["--max-steps", "2"] + ck, ["--max-steps", "4", "--resume"] + ck + ex]),
        # --max-steps 0: the checkpoint of step 4 of a run converted to Hugging Face files.
        ("convert", [steps + ck, ["--max-steps", "0", "--resume", "--checkpoint-dir", "{ck}"] + ex]),
        ("eval-only", [steps + ck + ex,
                       ["--eval-only", "--init-from", "{ex}", "--val-data", str(VAL_CORPUS)]]),
        ("lora", [steps + ["--lora-rank", "4", "--lora-dropout", "0.1"] + ck + ex]),
        ("lora-merged", [steps + ["--lora-rank", "4", "--merge-lora"] + ex]),
        ("lora-convert", [steps + ["--lora-rank", "4"] + ck,
                          ["--max-steps", "0", "--resume", "--checkpoint-dir", "{ck}", "--lora-rank", "4"] + ex]),
        ("mixtral", [["--model", "tiny-mixtral"] + steps + ck + ex]),
    ]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_hashes(root):
    out = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = sha256(p)
    return out


def metrics(path):
    """Each record's exact fields as text (the JSON number's own digits)."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        raw = json.loads(line, parse_float=str, parse_int=str)
        out.append({k: raw[k] for k in EXACT_KEYS if k in raw})
    return out


def record(args):
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    result = {"binary": str(args.train), "runs": {}}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name, invocations in runs():
        if args.only and name not in args.only:
            continue
        d = work / name
        d.mkdir()
        ck, ex = d / "checkpoints", d / "export"
        entry = {"invocations": []}
        for i, extra in enumerate(invocations):
            m = d / f"metrics{i}.jsonl"
            flags = [a.format(ck=ck, ex=ex) for a in extra]
            # A later invocation's --model/--init-from replaces the base's (the flag given last wins).
            cmd = [str(args.train)] + BASE + ["--metrics-file", str(m)] + flags
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               timeout=600)
            if p.returncode != 0:
                print(f"{name}[{i}]: exit {p.returncode}\n  {' '.join(cmd)}\n{p.stdout[-3000:]}", file=sys.stderr)
                sys.exit(1)
            entry["invocations"].append({"exit": p.returncode, "metrics": metrics(m)})
        entry["checkpoints"] = tree_hashes(ck)
        entry["export"] = tree_hashes(ex)
        result["runs"][name] = entry
        steps = sum(len(x["metrics"]) for x in entry["invocations"])
        print(f"{name}: {len(invocations)} invocation(s), {steps} records, {len(entry['checkpoints'])} checkpoint "
              f"files, {len(entry['export'])} export files", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)


def compare(args):
    a = json.loads(Path(args.a).read_text())["runs"]
    b = json.loads(Path(args.b).read_text())["runs"]
    problems = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{name}: only in {'the first' if name in a else 'the second'}")
            continue
        ra, rb = a[name], b[name]
        for i, (ia, ib) in enumerate(zip(ra["invocations"], rb["invocations"])):
            if len(ia["metrics"]) != len(ib["metrics"]):
                problems.append(f"{name}[{i}]: {len(ia['metrics'])} vs {len(ib['metrics'])} metrics records")
            for ma, mb in zip(ia["metrics"], ib["metrics"]):
                for k in sorted(set(ma) | set(mb)):
                    if ma.get(k) != mb.get(k):
                        problems.append(f"{name}[{i}] step {ma.get('step', '-')}: {k} {ma.get(k)} vs {mb.get(k)}")
        for part in ("checkpoints", "export"):
            for f in sorted(set(ra[part]) | set(rb[part])):
                if ra[part].get(f) != rb[part].get(f):
                    problems.append(f"{name} {part}/{f}: {ra[part].get(f, 'absent')[:12]} vs "
                                    f"{rb[part].get(f, 'absent')[:12]}")
    files = sum(len(r["checkpoints"]) + len(r["export"]) for r in a.values())
    records = sum(len(i["metrics"]) for r in a.values() for i in r["invocations"])
    for p in problems:
        print(p)
    print(f"{len(a)} runs, {records} metrics records, {files} files: "
          f"{'identical' if not problems else f'{len(problems)} differences'}")
    sys.exit(1 if problems else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("--train", required=True, help="the fsdp-train binary")
    r.add_argument("--out", required=True, help="the JSON file to write")
    r.add_argument("--work", default="/tmp/fsdp-fixed-runs", help="scratch directory (emptied, then removed)")
    r.add_argument("--only", nargs="*", help="run only these")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    record(args) if args.command == "record" else compare(args)


if __name__ == "__main__":
    main()

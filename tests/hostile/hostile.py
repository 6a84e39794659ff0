#!/usr/bin/env python3
"""Hostile-input campaign: fsdp-train, fsdp-inspect and scripts/prepare_data.sh against several
hundred cases a hostile or clumsy user would try (issue 16).

Categories (cases.py): numeric flags (every one: negative, zero, fractional, huge, 2^62, 2^63,
2^64, 1e999, nan, +-inf, text, empty), choices, syntax and conflicting flags; Hugging Face
config.json files (malformed, wrong types, huge and zero sizes, heads that do not divide) for
both programs; training data (missing, empty, directories, garbage, damaged gzip, device files,
FIFOs, odd-length token files); tokenizers; safetensors for --init-from; damaged checkpoints;
output targets (/dev/full, a full disk through RLIMIT_FSIZE, paths that cannot be written); the
user's files where the program writes temporaries (sentinel files checked afterwards); faults
(a rank killed or stopped, a missing rank, SIGTERM, two runs on one checkpoint directory, a
token file shrinking under training); the data preparation script.

Each case declares its expected exit codes, a time bound and what it must name; harness.py
says how a run is judged (hang, crash, lost data, backtrace, wrong exit, unclear). Cases that
need `fsdp-train --timeout` run only when `fsdp-train --help` mentions it (else: n/a).

  hostile.py --train T --inspect I --work DIR [--jobs 2] [--category C ...] [--case GLOB ...]
             [--list] [--report FILE]

Prints a table by category with totals and every failing case, writes the same to --report
(default DIR/report.txt) and DIR/report.json, and exits 1 if any case failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases as catalogue  # noqa: E402
import fixtures  # noqa: E402
from harness import KINDS, Env, Result, Runner, first_error  # noqa: E402

REPO = HERE.parent.parent


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="fsdp-train binary")
    ap.add_argument("--inspect", required=True, help="fsdp-inspect binary")
    ap.add_argument("--prepare", default=str(REPO / "scripts/prepare_data.sh"), help="scripts/prepare_data.sh")
    ap.add_argument("--generate", default=str(REPO / "deploy/kubernetes/generate.py"), help="the PyTorchJob generator")
    ap.add_argument("--sbatch", default=str(REPO / "deploy/slurm/fsdp-train.sbatch"), help="the Slurm batch script")
    ap.add_argument("--corpus", default=str(REPO / "data/fallback_corpus.jsonl"))
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--category", action="append", default=[], help="run only this category (repeatable)")
    ap.add_argument("--case", action="append", default=[],
                    help="run only cases whose category/name matches this glob (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--budget", type=float, default=0,
                    help="start no case after this many seconds; those left count as failures (0: no limit)")
    ap.add_argument("--report", help="write the report here too (default WORK/report.txt)")
    ap.add_argument("--open-findings",
                    help="file of case ids that still fail (open defects, each with its reason after '#'): they are "
                         "reported but do not fail the run; a listed case that passes fails it (take it off the list)")
    return ap.parse_args()


def selected(all_cases: list, args) -> list:
    out = []
    for c in all_cases:
        if args.category and c.category not in args.category:
            continue
        if args.case and not any(fnmatch.fnmatchcase(c.id, g) or fnmatch.fnmatchcase(c.name, g) for g in args.case):
            continue
        out.append(c)
    return out


def has_timeout_flag(train: str) -> bool:
    p = subprocess.run([train, "--help"], capture_output=True, text=True, timeout=60)
    return "--timeout" in p.stdout


def table(rows: dict, na: Counter) -> str:
    cols = ["cases", "pass"] + list(KINDS) + ["n/a"]
    width = max([len("category"), len("TOTAL")] + [len(k) for k in rows]) + 2
    head = "category".ljust(width) + "".join(f"{c:>11}" for c in cols)
    lines = [head, "-" * len(head)]
    total = Counter()
    for cat in sorted(set(rows) | set(na)):
        r = rows.get(cat, Counter())
        r = Counter(r)
        r["n/a"] = na.get(cat, 0)
        total.update(r)
        lines.append(cat.ljust(width) + "".join(f"{r.get(c, 0):>11}" for c in cols))
    lines.append("-" * len(head))
    lines.append("TOTAL".ljust(width) + "".join(f"{total.get(c, 0):>11}" for c in cols))
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    work = Path(args.work).resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "cases").mkdir(parents=True)
    corpus = str(Path(args.corpus).resolve())
    val = corpus[: -len(".jsonl")] + ".val.jsonl" if corpus.endswith(".jsonl") else corpus
    env = Env(train=str(Path(args.train).resolve()), inspect=str(Path(args.inspect).resolve()),
              prepare=str(Path(args.prepare).resolve()), corpus=corpus, val=val, fx=work / "fixtures", work=work,
              timeout_flag=has_timeout_flag(args.train),
              generate=str(Path(args.generate).resolve()), sbatch=str(Path(args.sbatch).resolve()))

    cases = selected(catalogue.all_cases(), args)
    runnable = [c for c in cases if "timeout" not in c.needs or env.timeout_flag]
    skipped = [c for c in cases if c not in runnable]
    if args.list:
        for c in cases:
            print(f"{c.id:60} expect {'/'.join(map(str, sorted(c.expect)))}"
                  f"{'  (needs --timeout: n/a)' if c in skipped else ''}")
        print(f"{len(cases)} cases, {len(runnable)} runnable")
        return 0

    start = time.monotonic()
    try:
        fixtures.build(env)
    except (fixtures.FixtureError, subprocess.TimeoutExpired) as e:
        print(f"hostile: the fixtures could not be built, no case ran:\n{e}", file=sys.stderr)
        return 1

    runner = Runner(env)
    results = {}

    def run(c):
        if args.budget and time.monotonic() - start > args.budget:
            return Result(), [("hang", f"not started: the campaign's {args.budget:.0f} s budget was spent")]
        return runner.run(c)

    # Heavy cases (several processes, long bounds) first, so the light ones fill in around them.
    order = sorted(runnable, key=lambda c: -c.weight)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(run, c): c for c in order}
        for f in concurrent.futures.as_completed(futures):
            c = futures[f]
            try:
                results[c.id] = f.result()
            except Exception as e:  # a broken case (harness bug): counted, never hidden
                results[c.id] = (Result(), [("unclear", f"harness error in this case: {e!r}")])

    rows = defaultdict(Counter)
    failures = []
    for c in cases:
        if c in skipped:
            continue
        r, bad = results[c.id]
        rows[c.category]["cases"] += 1
        if bad:
            rows[c.category][bad[0][0]] += 1
            failures.append((c, r, bad))
        else:
            rows[c.category]["pass"] += 1
    na = Counter(c.category for c in skipped)

    out = [f"hostile campaign: {len(cases)} cases ({len(skipped)} n/a: they need fsdp-train --timeout), "
           f"{args.jobs} workers, {time.monotonic() - start:.0f} s", "", table(rows, na), ""]
    for c, r, bad in failures:
        code = "killed" if r.code is None and not r.signal else f"signal {r.signal}" if r.signal else f"exit {r.code}"
        out.append(f"FAIL {c.id} [{bad[0][0]}] {'; '.join(f'{k}: {w}' for k, w in bad)} "
                   f"({code}, {r.seconds:.1f} s)")
        out.append(f"     stderr: {first_error(r)}")
    if skipped:
        out.append("")
        out.append("n/a (fsdp-train has no --timeout): " + ", ".join(c.id for c in skipped))
    text = "\n".join(out) + "\n"
    print(text, end="")
    report = Path(args.report) if args.report else work / "report.txt"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    (work / "report.json").write_text(json.dumps(
        [{"case": c.id, "expect": sorted(c.expect), "code": results[c.id][0].code,
          "signal": results[c.id][0].signal, "seconds": round(results[c.id][0].seconds, 2),
          "failures": [list(b) for b in results[c.id][1]], "stderr": first_error(results[c.id][0])}
         for c in cases if c.id in results], indent=1))
    if not args.open_findings:
        return 1 if failures else 0
    listed = {line.split("#")[0].strip() for line in Path(args.open_findings).read_text().splitlines()}
    listed.discard("")
    failed = {c.id for c, _, _ in failures}
    new_failures = sorted(failed - listed)
    fixed = sorted(c.id for c in cases if c.id in listed and c.id in results and c.id not in failed)
    print(f"open findings (listed in {args.open_findings}): {len(failed & listed)} still fail")
    if new_failures:
        print("NEW failures (not in the open-findings list): " + ", ".join(new_failures))
    if fixed:
        print("listed as open but now pass (remove them from the list): " + ", ".join(fixed))
    return 1 if new_failures or fixed else 0


if __name__ == "__main__":
    sys.exit(main())

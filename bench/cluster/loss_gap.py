#!/usr/bin/env python3
"""The loss cost of the compressed collectives (docs/compression.md) over a long run.

    bench/cluster/loss_gap.py --train build/apps/fsdp-train [--steps 300] [--corpus pydoc|fallback]
                              [--seeds 1337,...] [--keep DIR] [--record]

Trains the `100m` row of the CPU head-to-head (bench/cpu/llama-100m.json, 99.9M
parameters) with 2 ranks (FULL_SHARD, fp32, one thread each), the same seed and
batches, once per wire option: fp32 (native), then each of --options. The
numerics of a wire format do not depend on the link, so the ranks share this
host (shared memory). Per option: the held-out loss after the last step (where
the corpus has one), the mean training loss of the last 20 steps and the last
step's, and their gaps to fp32, relative. The criterion: within 1% of fp32
after 300 steps. The option `fp32-1rank` is the floor: fp32 at one rank with
the whole batch, the same samples summed in another order, so its gap is what
rounding alone does to this run's end.

--corpus says what it trains on. `pydoc` (the default): the English text of the
interpreter's own reference topics (pydoc_data.topics, ~466 KB; no download),
nine topics in ten to train on and every tenth held out. 300 steps read about a
third of it once, so the model learns the language rather than memorizing a
page, and the yardstick is the loss on the held-out topics after the last step
(the exact mean over every target token, `fsdp-train`'s --eval-every), beside
the same loss of the master weights the run exported (fp32, read back by
`fsdp-train eval` with the native wire): with an int8 all-gather the first
includes the format's rounding of the weights, the second is what was trained.
Rows whose all-gather is native evaluated their masters unrounded already: they
export nothing, and both columns give that loss.
`fallback`: data/fallback_corpus.jsonl (8 KB, ~19 passes in 300 steps), the
corpus of the tables recorded before --corpus existed; there the model memorizes
and the end of a run swings with any perturbation (no held-out loss).

--seeds runs the whole set once per seed (initialization and data order both
follow the seed). One seed's gap cannot tell a format's systematic cost from the
spread of a perturbed run (large where the model memorizes); over several
seeds the table gives each gap, their mean with its 95% interval (Student's t
over the paired gaps) and their range, beside fp32's own spread.

About 14 minutes per option on 2 quiet cores at the default seq 128 x batch 2
(with --corpus pydoc, the two held-out evaluations included).
--keep DIR stores each finished row's result (JSON, one file per row and seed) and
reuses a stored row whose row, seed, shapes, corpus and fsdp-train binary all match:
a run stopped part-way resumes where it stopped, and the fp32 reference is not
retrained by every invocation.
--record appends the table to bench/RESULTS.md with the command and the load.
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (bench/cluster/results.py)

RANKS = 2  # every row sees RANKS x --batch-size samples per step on RANKS threads
# row: (fsdp-train flags, ranks). fp32 is the reference every other row is held to.
ROWS = {
    "fp32": ([], RANKS),
    "ag-bf16": (["--all-gather-wire", "bf16"], RANKS),
    "ag-int8": (["--all-gather-wire", "int8"], RANKS),
    "rs-bf16": (["--reduce-scatter-wire", "bf16"], RANKS),
    "rs-int8": (["--reduce-scatter-wire", "int8"], RANKS),
    "ag-int8+rs-bf16": (["--all-gather-wire", "int8", "--reduce-scatter-wire", "bf16"], RANKS),
    # The same at a quarter of the default block (256): four times the scales, a quarter of the
    # largest rounding step within a block (docs/compression.md, the chunk size formula).
    "ag-int8+rs-bf16-b64": (["--all-gather-wire", "int8", "--reduce-scatter-wire", "bf16",
                             "--quant-block", "64"], RANKS),
    # Not a wire format: fp32 at one rank with the whole batch, the same samples per
    # step summed in another order. Its gap to fp32 is what rounding alone moves the
    # end of this run by: the floor under which a wire format's gap says nothing.
    "fp32-1rank": ([], 1),
}
TAIL = 20  # steps averaged at the end


HELD_OUT_EVERY = 10  # --corpus pydoc: every tenth topic (in sorted order) is held out


def pydoc_corpus(tmp):
    """The interpreter's reference topics as two JSONL files, (train, held-out):
    one document per topic, in sorted order, every HELD_OUT_EVERY-th held out."""
    import pydoc_data.topics
    train, held = tmp / "pydoc.train.jsonl", tmp / "pydoc.heldout.jsonl"
    with open(train, "w") as t, open(held, "w") as h:
        for i, key in enumerate(sorted(pydoc_data.topics.topics)):
            print(json.dumps({"text": pydoc_data.topics.topics[key]}), file=h if i % HELD_OUT_EVERY == 0 else t)
    return train, held


CORPUS_WORDS = {
    "pydoc": f"the reference topics of Python {sys.version.split()[0]} (pydoc_data.topics; every "
             f"{HELD_OUT_EVERY}th topic held out)",
    "fallback": "data/fallback_corpus.jsonl",
}


def corpus_files(corpus, tmp):
    """(train data, held-out data or None) for --corpus."""
    if corpus == "pydoc":
        return pydoc_corpus(tmp)
    return ROOT / "data" / "fallback_corpus.jsonl", None


def run(a, name, seed, tmp, data, held):
    metrics = tmp / f"{name}.{seed}.jsonl"
    flags, ranks = ROWS[name]
    batch, threads = RANKS * a.batch_size // ranks, str(RANKS // ranks)
    hf = tmp / f"hf.{name}.{seed}"
    exports = "--all-gather-wire" in flags  # only a rounded forward needs its masters read back natively
    if held is not None:  # the held-out loss after the last step, over every target token
        flags = [*flags, "--val-data", str(held), "--eval-every", str(a.steps), "--eval-windows", "0",
                 *(["--export-hf", str(hf)] if exports else [])]
    argv = [a.train, "--model", str(ROOT / "bench" / "cpu" / "llama-100m.json"),
            "--data", str(data), "--seq-len", str(a.seq_len),
            "--batch-size", str(batch), "--max-steps", str(a.steps), "--log-every", "1", "--seed", str(seed),
            "--nproc-per-node", str(ranks), "--metrics-file", str(metrics), *flags]
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    t0 = time.time()
    log_path = tmp / f"{name}.{seed}.log"
    with open(log_path, "w") as log:
        r = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=a.timeout_s)
    if r.returncode != 0:
        print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
        raise RuntimeError(f"{name}, seed {seed}: fsdp-train exited {r.returncode}")
    rows = read_metrics(metrics)
    losses = [r["loss"] for r in rows if "loss" in r and "step" in r]
    if len(losses) != a.steps:
        raise RuntimeError(f"{name}, seed {seed}: {len(losses)} steps logged, expected {a.steps}")
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    if held is not None and not evals:
        raise RuntimeError(f"{name}, seed {seed}: no held-out loss in {metrics}")
    masters = None
    if held is not None:
        # Where the all-gather is native, the run's own held-out evaluation already read the
        # masters unrounded: that loss is theirs (fp32 gave 2.1594 both ways, RESULTS 2026-11-28).
        masters = eval_masters(a, hf, held, tmp / f"{name}.{seed}.masters", env) if exports else evals[-1]
        shutil.rmtree(hf, ignore_errors=True)
    return {"tail": statistics.mean(losses[-TAIL:]), "last": losses[-1], "first": losses[0],
            "heldout": evals[-1] if evals else None, "masters": masters, "seconds": time.time() - t0}


def read_metrics(path):
    """fsdp-train's --metrics-file: one JSON object per line."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def eval_masters(a, hf, held, stem, env):
    """The held-out loss of the master weights a run exported (fp32), read back and
    evaluated with the native wire: what the run trained, apart from the format its
    forward computed with. Only for rows whose all-gather is compressed: a run whose
    all-gather is native evaluated the same weights the same way at its end."""
    metrics = Path(f"{stem}.jsonl")
    argv = [a.train, "eval", "--init-from", str(hf), "--val-data", str(held), "--seq-len", str(a.seq_len),
            "--batch-size", str(a.batch_size), "--nproc-per-node", str(RANKS), "--metrics-file", str(metrics)]
    with open(f"{stem}.log", "w") as log:
        r = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(env, OMP_NUM_THREADS="1"),
                           timeout=a.timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"evaluating {hf}: fsdp-train eval exited {r.returncode} (log: {stem}.log)")
    return [r["eval_loss"] for r in read_metrics(metrics) if "eval_loss" in r][-1]


def kept_path(keep, key):
    return Path(keep) / f"{key['row']}.seed{key['seed']}.json"


def reuse(keep, key):
    """--keep: the result of a row finished earlier with the same key (row, flags, seed,
    steps, shapes, corpus and fsdp-train binary), else None. Rows are deterministic,
    so a kept result is what a rerun would print."""
    if not keep or not kept_path(keep, key).exists():
        return None
    saved = json.loads(kept_path(keep, key).read_text())
    return saved["result"] if saved.get("key") == key else None


def keep(keep_dir, key, result):
    """Writes a finished row's result under --keep (a whole file or none: written
    beside it, then renamed)."""
    path = kept_path(keep_dir, key)
    part = path.with_suffix(".part")
    part.write_text(json.dumps({"key": key, "result": result}, indent=1))
    os.replace(part, path)


def pct(x, base):
    return 100 * (x / base - 1)


# The columns a table may show: (key in run()'s result, header). The held-out loss
# comes first where the corpus has one: it is the yardstick there.
MEASURES = [("heldout", "held-out loss after the last step"),
            ("masters", "held-out loss of the exported masters, native forward"),
            ("tail", f"mean training loss of the last {TAIL} steps"),
            ("last", "last step's training loss")]


def measures(out):
    return [(k, label) for k, label in MEASURES if out["fp32"][k] is not None]


def one_seed_table(out):
    """One seed: each row's losses and their gaps to fp32."""
    base, cols = out["fp32"], measures(out)
    lines = ["| wire | " + " | ".join(f"{label} | vs fp32" for _, label in cols) + " |",
             "|---|" + "---|---|" * len(cols)]
    for name, r in out.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:.4f} | {pct(r[k], base[k]):+.2f}%" for k, _ in cols) + " |")
    return "\n".join(lines)


# Two-sided 95% quantiles of Student's t for 1..10 degrees of freedom (any table of the
# t distribution); more seeds than 11 use the last, which then errs on the wide side.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def mean_interval(gaps):
    """(mean, half-width of its 95% interval) of paired gaps; the half-width is None
    for a single seed. The seeds are the samples: each gap pairs a row with the fp32
    run of the same seed, so fp32's own spread across seeds cancels."""
    m = statistics.mean(gaps)
    if len(gaps) < 2:
        return m, None
    return m, T975[min(len(gaps), len(T975) + 1) - 2] * statistics.stdev(gaps) / len(gaps) ** 0.5


def seeds_table(by_seed, key, label):
    """Several seeds, one measure: per row, each seed's gap to that seed's fp32, their
    mean with its 95% interval, and their range; fp32's row gives its own loss per seed
    and the spread across seeds (range over mean)."""
    seeds = list(by_seed)
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| wire ({label}) | {head} | mean gap, 95% interval | range of gaps |",
             "|---|" + "---|" * (len(seeds) + 2)]
    base = [by_seed[s]["fp32"][key] for s in seeds]
    spread = 100 * (max(base) - min(base)) / statistics.mean(base)
    lines.append("| fp32 | " + " | ".join(f"{b:.4f}" for b in base) +
                 f" | - | fp32 across seeds: {spread:.2f}% of its mean |")
    for name in [n for n in by_seed[seeds[0]] if n != "fp32"]:
        gaps = [pct(by_seed[s][name][key], by_seed[s]["fp32"][key]) for s in seeds]
        cells = " | ".join(f"{by_seed[s][name][key]:.4f} ({g:+.2f}%)" for s, g in zip(seeds, gaps))
        m, half = mean_interval(gaps)
        within = "" if half is None else f" ± {half:.2f}% ({m - half:+.2f}% .. {m + half:+.2f}%)"
        lines.append(f"| {name} | {cells} | {m:+.2f}%{within} | {min(gaps):+.2f}% .. {max(gaps):+.2f}% |")
    return "\n".join(lines)


def measure_all(a, seeds, names, build, tmp, by_seed):
    """Every row of every seed, kept ones reused (--keep), into by_seed[seed][row]."""
    data, held = corpus_files(a.corpus, tmp)
    for seed in seeds:
        out = by_seed[seed] = {}
        for name in ["fp32", *names]:
            key = {"row": name, "flags": ROWS[name][0], "ranks": ROWS[name][1], "seed": seed, "steps": a.steps,
                   "seq_len": a.seq_len, "batch_size": a.batch_size, "corpus": a.corpus, "fsdp_train": build,
                   "python": sys.version.split()[0]}  # pydoc's topics are the interpreter's
            out[name] = r = reuse(a.keep, key)
            how = "kept"
            if r is None:
                out[name] = r = run(a, name, seed, tmp, data, held)
                how = f"{r['seconds']:.0f} s"
                if a.keep:
                    keep(a.keep, key, r)
            heldout = "" if r["heldout"] is None else \
                f", held-out {r['heldout']:.4f} (exported masters {r['masters']:.4f})"
            print(f"seed {seed} {name:18s} loss {r['first']:.4f} -> last {r['last']:.4f}, mean of the last "
                  f"{TAIL} {r['tail']:.4f}{heldout} ({how})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=2, help="per rank")
    ap.add_argument("--options", default=",".join(n for n in ROWS if n != "fp32"))
    ap.add_argument("--corpus", choices=["pydoc", "fallback"], default="pydoc",
                    help="pydoc: reference topics, a held-out tenth (default); fallback: the embedded 8 KB corpus")
    ap.add_argument("--seeds", default="1337", help="comma-separated; every row runs once per seed")
    ap.add_argument("--timeout-s", type=float, default=7200)
    ap.add_argument("--keep", metavar="DIR",
                    help="store each finished row's result in DIR and reuse those whose row, seed, shapes, corpus "
                         "and fsdp-train binary match (a stopped run resumes; fp32 is not rerun per invocation)")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    names = [n for n in a.options.split(",") if n]
    for n in names:
        if n not in ROWS or n == "fp32":
            known = ", ".join(r for r in ROWS if r != "fp32")
            print(f"loss_gap.py: unknown option '{n}' (known: {known}; fp32 always runs)", file=sys.stderr)
            return 2
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s]
    except ValueError:
        print(f"loss_gap.py: --seeds '{a.seeds}' is not a comma-separated list of integers (e.g. 1337,7,42)",
              file=sys.stderr)
        return 2
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        print(f"loss_gap.py: --seeds '{a.seeds}' needs one or more distinct non-negative integers", file=sys.stderr)
        return 2
    load = os.getloadavg()
    t0 = time.time()
    by_seed = {}
    build = hashlib.sha256(Path(a.train).read_bytes()).hexdigest()  # the project's code is linked in statically
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fsdp-loss-gap.") as d:
        try:
            measure_all(a, seeds, names, build, Path(d), by_seed)
        except (RuntimeError, subprocess.TimeoutExpired) as e:  # a row's fsdp-train failed (its log's tail above)
            if isinstance(e, subprocess.TimeoutExpired):
                e = f"fsdp-train ran past --timeout-s {a.timeout_s:.0f} ({' '.join(map(str, e.cmd[:2]))} ...)"
            resume = f"; the rows finished before it are kept in {a.keep}: the same command resumes after them" \
                if a.keep else "; rerun with --keep DIR to keep each row as it finishes"
            print(f"loss_gap.py: {e}{resume}", file=sys.stderr)
            return 1
    first = by_seed[seeds[0]]
    table = one_seed_table(first) if len(seeds) == 1 else "\n\n".join(
        seeds_table(by_seed, k, label) for k, label in measures(first) if k != "last")
    print(table)
    took = time.time() - t0
    if a.record:
        results.append("Compressed collectives: loss after 300 steps vs fp32", (
            f"Command: `bench/cluster/loss_gap.py --train {a.train} --steps {a.steps} --corpus {a.corpus} "
            f"--options {','.join(names)} "
            f"--seeds {','.join(map(str, seeds))}{' --keep ' + a.keep if a.keep else ''} --record` "
            f"({took / 60:.0f} min{', rows kept from earlier runs included' if a.keep else ''})\n"
            f"Machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before the run\n\n"
            f"bench/cpu/llama-100m.json (99.9M parameters), {CORPUS_WORDS[a.corpus]}, 2 ranks on one host "
            f"(FULL_SHARD, fp32, one thread each), seq {a.seq_len} x batch {a.batch_size} per rank, {a.steps} steps, "
            f"seed {', '.join(map(str, seeds))} (per seed, the same batches for every row).\n\n{table}\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The paste test (issue 38): every fsdp-train command line of README.md and docs/*.md, pasted after
`fsdp-inspect --estimate`, plans and estimates (exit 0).

fsdp-inspect accepts every fsdp-train flag (apps/train_options_table.h): those that change no plan are
ignored. What this test does to a line, and why:
  - lines are taken from fenced code blocks (a line ending in `\\` continues on the next; shell comments
    are dropped) and from inline code that starts with fsdp-train (`fsdp-train --device cuda`);
  - the program is the first word ending in `fsdp-train` (build/apps/fsdp-train), or one after a
    launcher (torchrun, srun) or environment variables, which are dropped; a `train` or `eval`
    subcommand is dropped; `fsdp-train convert` lines are skipped: a conversion has no step to estimate;
  - the docs' optional parts `[--flag value]` are kept (brackets dropped), `...` is dropped;
  - a placeholder (N, i) as the value of a number fsdp-inspect reads (--nproc-per-node N): 2;
  - no --cluster: `--cluster h100` (a preset; the lines are about flags, not machines);
  - --init-from DIR: a directory holding the tiny model's config.json (fsdp-inspect --write-hf-config),
    since the docs' directories are placeholders; a --model given beside it is the model, as in fsdp-train.
Model planning only (meta device), no training: about 0.3 s a line.

Usage: test_paste_commands.py FSDP_INSPECT SOURCE_DIR TMP_DIR
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

INSPECT, SOURCE, TMP = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
CLUSTER = ["--cluster", "h100"]
LAUNCHERS = ("torchrun", "srun", "mpirun")
# fsdp-train's flags fsdp-inspect reads as numbers (`fsdp-train --list-options`: inspect "uses").
NUMBERS = ("--nproc-per-node", "--nnodes", "--batch-size", "--seq-len", "--grad-accum", "--hybrid-shard-size",
           "--limit-all-gathers", "--quant-block", "--lora-rank", "--seed")


def code_lines(text):
    """The lines of fenced code blocks, `\\` continuations joined."""
    out, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            out += re.findall(r"`((?:[\w./-]*/)?fsdp-train [^`]*)`", line)
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def fsdp_train_args(line):
    """fsdp-train's arguments on `line`, None when it runs no fsdp-train (or a conversion)."""
    line = line.split(" #", 1)[0]  # a trailing shell comment
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    at = next((i for i, w in enumerate(words) if re.fullmatch(r"(.*/)?fsdp-train", w)), None)
    if at is None or not (at == 0 or words[0] in LAUNCHERS or all("=" in w for w in words[:at])):
        return None
    args = []
    for w in words[at + 1:]:
        if w in ("|", "&&", ";", ">", "2>&1", "&"):
            break
        w = w.strip("[]")
        if w and w != "...":
            args.append(w)
    if args and args[0] == "convert":
        return None
    if args and args[0] in ("train", "eval"):
        args = args[1:]
    return [("2" if i > 0 and args[i - 1] in NUMBERS and re.fullmatch(r"[A-Za-z]+", a) else a)
            for i, a in enumerate(args)]


def main():
    TMP.mkdir(parents=True, exist_ok=True)
    hf_dir = TMP / "hf-model"
    hf_dir.mkdir(exist_ok=True)
    r = subprocess.run([INSPECT, "--model", "tiny", "--write-hf-config", str(hf_dir / "config.json")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL: cannot write the stand-in --init-from directory: {r.stderr.strip()}")
    docs = [SOURCE / "README.md"] + sorted((SOURCE / "docs").glob("*.md"))
    tried, failures = 0, []
    for doc in docs:
        for line in code_lines(doc.read_text()):
            args = fsdp_train_args(line)
            if args is None:
                continue
            args = [str(hf_dir) if i > 0 and args[i - 1] == "--init-from" else a for i, a in enumerate(args)]
            cmd = [INSPECT, "--estimate"] + args + ([] if "--cluster" in args else CLUSTER)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            tried += 1
            where = f"{doc.relative_to(SOURCE)}: {line.strip()}"
            print(f"{'ok  ' if r.returncode == 0 else 'FAIL'} {where}")
            if r.returncode != 0:
                failures.append(f"{where}\n    {shlex.join(cmd[1:])}\n    exit {r.returncode}: {r.stderr.strip()}")
    if tried < 5:
        failures.append(f"only {tried} fsdp-train command lines found in README.md and docs/*.md: the extractor broke")
    if failures:
        print("\n".join(["", f"{len(failures)} of {tried} command lines failed:"] + failures))
        sys.exit(1)
    print(f"all {tried} fsdp-train command lines of README.md and docs/*.md pass fsdp-inspect --estimate")


main()

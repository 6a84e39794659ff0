"""fsdp-train's option table (apps/train_options_table.cpp, printed by `fsdp-train --list-options`) against
everything that lists fsdp-train's flags (issue 38: options declared once):
  - no flag twice in the table, and each configurable row's --config key is its flag without '--';
  - `fsdp-train --help` lists exactly the table's flags, plus CLI11's --help and --version;
  - `fsdp-train --print-config` writes only the table's config keys, and all of them;
  - fsdp-inspect declares none of fsdp-train's flags itself: it lists exactly the rows marked "uses", each
    with the table's help and fsdp-train's default (registered from the table), and accepts every other row,
    ignored, with one note naming the ignored flags given;
  - a bad word (`--fp8-linear bogus`) exits 2 with one line naming the flag, the value and the words, and
    `--fp8-linear rowwise` where nothing would run in FP8 (LoRA, T5) is refused;
  - docs/training.md's flag table names exactly the table's flags;
  - deploy/kubernetes/generate.py passes only the table's flags to fsdp-train.

Usage: test_options_table.py FSDP_TRAIN FSDP_INSPECT SOURCE_DIR
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

TRAIN, INSPECT, SOURCE = sys.argv[1], sys.argv[2], Path(sys.argv[3])
failures = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def run(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)


def help_flags(text):
    """The long flags --help lists (an option's line starts with 2 spaces, 4 in a group; descriptions further)."""
    return {m.group(1) for m in re.finditer(r"^ {2,4}(?:-\w,)?(--[a-z0-9][a-z0-9-]*)", text, re.M)}


def help_descriptions(text):
    """{flag: its description} as --help shows them: after the name column on the flag's line, or alone on the
    next line when the name column is full."""
    lines = text.splitlines() + [""]
    out = {}
    for i, line in enumerate(lines[:-1]):
        m = re.match(r"^ {2,4}(?:-\w,)?(--[a-z0-9][a-z0-9-]*)(?: \S+)*(?: {2,}(\S.*))?$", line)
        if m:
            out[m.group(1)] = m.group(2) if m.group(2) is not None else lines[i + 1].strip()
    return out


r = run(TRAIN, "--list-options")
check(r.returncode == 0, f"fsdp-train --list-options exits 0 ({r.stderr.strip()})")
rows = json.loads(r.stdout)
flags = [row["flag"] for row in rows]
check(len(rows) > 50, f"the table has {len(rows)} rows")
dupes = sorted({f for f in flags if flags.count(f) > 1})
check(not dupes, f"no flag declared twice in the table (twice: {dupes})")
bad_keys = [row["flag"] for row in rows if row["config_key"] not in ("", row["flag"][2:])]
check(not bad_keys, f"each config key is its flag without '--' (not: {bad_keys})")
table = set(flags)

# --help: the table's flags and CLI11's own.
listed = help_flags(run(TRAIN, "--help").stdout)
own = {"--help", "--version"}
check(listed == table | own, f"fsdp-train --help lists the table's flags + {sorted(own)} "
      f"(only in --help: {sorted(listed - table - own)}; only in the table: {sorted(table - listed)})")

# --print-config: a key per configurable row, given or commented. A default is printed where there is one
# to print: a switch's false, a default value, or text's "" (apps/config_flags.cpp); none for a number
# without a default (--metrics-port, --lora-alpha), a checked word without one, or a repeatable option.
r = run(TRAIN, "--print-config", "--seq-len", "64", "--lr-scale", "a=2")
keys = set(re.findall(r"^(?:# )?([a-z0-9-]+) = ", r.stdout, re.M))
configurable = {row["config_key"] for row in rows if row["config_key"]}
printable = {row["config_key"] for row in rows if row["config_key"] and (
    row["kind"] == "switch" or (row["kind"] == "value" and (row["default"] or row["type"] == "TEXT")))}
printable |= {"seq-len", "lr-scale"}
check(r.returncode == 0 and keys == printable and keys <= configurable,
      f"--print-config's keys are the table's config keys (extra: {sorted(keys - printable)}; "
      f"missing: {sorted(printable - keys)})")

# fsdp-inspect: the rows it uses come from the table (fsdp-train's help and default: it declares none of
# fsdp-train's flags itself); every other row is accepted and ignored.
inspect_text = run(INSPECT, "--help").stdout
inspect_help = help_flags(inspect_text)
uses = {row["flag"] for row in rows if row["inspect"] == "uses"}
check(len(uses) >= 20 and uses <= inspect_help,
      f"fsdp-inspect --help lists every row it uses (missing: {sorted(uses - inspect_help)})")
leaked = (inspect_help & table) - uses
check(not leaked, f"fsdp-inspect --help lists no ignored fsdp-train flag (listed: {sorted(leaked)})")
said = help_descriptions(inspect_text)
own_text = {row["flag"]: said.get(row["flag"]) for row in rows if row["flag"] in uses and said.get(row["flag"]) !=
            row["help"]}
check(not own_text, f"fsdp-inspect declares none of fsdp-train's flags itself: each it reads has the table's help "
      f"(its own: {own_text})")
shown = dict(re.findall(r"^ {2,4}(--[a-z0-9-]+) [A-Z]+(?::\{[^}]*\})?=(\S+)", inspect_text, re.M))
differ = {f: (shown[f], row["default"]) for row in rows for f in [row["flag"]]
          if f in uses and f in shown and shown[f] != row["default"]}
check(len(shown.keys() & uses) >= 15 and not differ,
      f"fsdp-inspect's defaults of the flags it reads are fsdp-train's (inspect, train: {differ})")
ignored = [row for row in rows if row["inspect"] == "ignores"]
args = []
for row in ignored:
    args.append(row["flag"])
    if row["kind"] != "switch":
        args.append(row["default"] or (row["choices"] or ["x"])[0])
r = run(INSPECT, "--model", "tiny", *args)
notes = [line for line in r.stderr.splitlines() if "ignored by fsdp-inspect" in line]
expected = "fsdp-inspect: note: ignored by fsdp-inspect: " + ", ".join(row["flag"] for row in ignored) + \
    " (no effect on a plan or estimate)"
check(r.returncode == 0, f"fsdp-inspect accepts all {len(ignored)} ignored fsdp-train flags at once "
      f"(exit {r.returncode}: {r.stderr.strip()[-300:]})")
check(notes == [expected], f"one note names them, in the table's order ({notes})")
r = run(INSPECT, "--model", "tiny", "--world-size", "2")
check(r.returncode == 0 and "ignored" not in r.stderr, "no note when no ignored flag is given")

# A word flag's bad value: one line naming the flag, the value and the accepted words, exit 2 (bad usage).
r = run(TRAIN, "--fp8-linear", "bogus")
check(r.returncode == 2 and "--fp8-linear: bogus not in {off,rowwise}" in r.stderr,
      f"fsdp-train --fp8-linear bogus exits 2 naming the words (exit {r.returncode}: {r.stderr.strip()[-300:]})")

# --fp8-linear rowwise where nothing would run in FP8: with LoRA (a frozen base) and on a model without the
# decoder's products (T5): refused, exit 2, when the model is built (before any step).
for extra, words in ((["--lora-rank", "4"], "--fp8-linear rowwise with LoRA"),
                     (["--model", "t5-tiny"], "this model has no decoder products")):
    r = run(TRAIN, "--data", str(SOURCE / "data" / "fallback_corpus.jsonl"), "--fp8-linear", "rowwise", *extra)
    check(r.returncode == 2 and words in r.stderr,
          f"fsdp-train --fp8-linear rowwise {' '.join(extra)} is refused (exit {r.returncode}: {r.stderr.strip()[-300:]})")

# docs/training.md: the rows of its "## Flags" table name exactly the table's flags.
doc = (SOURCE / "docs" / "training.md").read_text()
section = doc.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
documented = set()
for line in section.splitlines():
    if line.startswith("| `--"):
        documented |= set(re.findall(r"`(--[a-z0-9-]+)`", line.split("|")[1]))
check(documented == table, f"docs/training.md's flag table names the table's flags (only in the docs: "
      f"{sorted(documented - table)}; undocumented: {sorted(table - documented)})")

# deploy/kubernetes/generate.py: every fsdp-train flag it writes into the job's command line.
tree = ast.parse((SOURCE / "deploy" / "kubernetes" / "generate.py").read_text())
passed = set()
for node in ast.walk(tree):
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AugAssign) \
        else None
    if isinstance(target, ast.Name) and target.id == "train_args" and isinstance(node.value, ast.List):
        passed |= {e.value for e in node.value.elts if isinstance(e, ast.Constant) and str(e.value).startswith("--")}
check(len(passed) >= 5, f"found generate.py's fsdp-train flags: {sorted(passed)}")
check(passed <= table, f"generate.py passes only fsdp-train's flags (unknown: {sorted(passed - table)})")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("the option table agrees with --help, --print-config, fsdp-inspect, docs/training.md and generate.py")

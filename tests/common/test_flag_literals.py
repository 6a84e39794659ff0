#!/usr/bin/env python3
"""No command-line flag in the library's strings (issue 49): a source scan.

The library names its own options in its messages: the field of the struct a function takes
(`LoraConfig::rank`, `LrSchedule::min_lr`) or its parameter (`freeze_matching: pattern`). The flags are
the programs' words: fsdp-train and fsdp-inspect put each such name in flag terms from their option table
(apps/option_names.cpp; a row's `field` and `also`), so a library user reads what they set and a program
user what they typed. This test reads every C++ source and header of src/ and include/, splits it into
tokens with Pygments' C++ lexer (comments never count) and fails on each string literal holding a
`--flag` spelling, unless it is on the allow-list below with its reason.

  test_flag_literals.py SOURCE_DIR     exit 0: none found; 1: each one found, as FILE:LINE: FLAG

It also checks itself: a planted source must give exactly its literal flags (not those of its comments
or of a decrement), and every allow-list entry must still match a literal.
"""

import re
import sys
from pathlib import Path

from pygments.lexers import CppLexer
from pygments.token import String

from scan_report import report, run

FLAG = re.compile(r"(?<![A-Za-z0-9_-])--[a-z][a-z0-9-]+")
SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}

# (path, or a folder ending in "/"; flag, or None for any) -> why it may be there. Short on purpose: a new
# entry is earned in review.
ALLOWED = {
    **{(path, None): "the metric table: its texts document fsdp-train's flags for the program's users "
                     "(--list-metrics, the Prometheus HELP lines, docs/observability.md, held to each other "
                     "by Docs and Metrics tests), not a function's options"
       for path in ("src/train/metrics.cpp", "src/train/prometheus.cpp")},
    **{("src/common/main.cpp", flag): "run_main's out-of-memory hint: printed by the programs after "
                                      "with_flag_names, what a program user can change"
       for flag in ("--batch-size", "--seq-len", "--activation-checkpointing", "--cpu-offload")},
    ("src/plan/cluster.cpp", "--calibrate"): "names the program mode that writes a cluster file "
                                             "(fsdp-inspect --calibrate), not an option of a function",
    **{("src/models/nvrtc.cpp", flag): "NVRTC's own compiler options, handed to nvrtcCompileProgram: "
                                       "words of the CUDA compiler, not of our programs"
       for flag in ("--std", "--gpu-architecture")},
}


def literal_flags(text: str):
    """(line, flag) for each --flag inside a string literal of C++ `text`."""
    line = 1
    for _, kind, value in CppLexer(stripnl=False, ensurenl=False).get_tokens_unprocessed(text):
        if kind in String:
            for m in FLAG.finditer(value):
                yield line + value.count("\n", 0, m.start()), m.group(0)
        line += value.count("\n")


def allowed_by(rel: str, flag: str):
    """The allow-list entry that lets `flag` stand in file `rel`, or None."""
    for key in ALLOWED:
        where, which = key
        if (rel == where or (where.endswith("/") and rel.startswith(where))) and which in (None, flag):
            return key
    return None


def scan(root: Path):
    """(rel, line, flag, entry or None) for every literal flag of src/ and include/."""
    for top in ("src", "include"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            for line, flag in literal_flags(path.read_text(encoding="utf-8", errors="replace")):
                yield rel, line, flag, allowed_by(rel, flag)


SELF_TEST = r'''// --in-a-comment is not a literal
/* nor --this-one */
void f(int& i) {
  --i;
  FSDP_CHECK(i > 0, "--seq-len ", i, " must be >= 1");
  const char* raw = R"(--raw-string
and --on-its-second-line)";
  g('-', "x--not-a-flag", "LoraConfig::rank");
}
'''


def self_test() -> list:
    got = list(literal_flags(SELF_TEST))
    want = [(5, "--seq-len"), (6, "--raw-string"), (7, "--on-its-second-line")]
    return [] if got == want else [f"self-test: found {got}, expected {want}"]


def check(root: Path) -> int:
    problems = self_test()
    found = list(scan(root))
    bad = [f"{rel}:{line}: {flag}: name the field or parameter the function takes (LoraConfig::rank, "
           f"'freeze_matching: pattern'), and map it to the flag in apps/train_options_table.cpp (the row's also)"
           for rel, line, flag, entry in found if entry is None]
    used = {entry for _, _, _, entry in found if entry is not None}
    stale = [f"allow-list entry {key} matches no literal: remove it" for key in ALLOWED if key not in used]
    return report(problems, bad, stale, "flag literal(s) in src/ or include/",
                  f"ok: no flag literal in src/ or include/ outside the allow-list ({len(found)} allowed, "
                  f"{len(ALLOWED)} entries)")


if __name__ == "__main__":
    sys.exit(run(__doc__.split("\n\n")[2], check))

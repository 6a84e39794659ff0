"""What the source scans of tests/common print and return (test_function_length.py, test_file_access.py,
test_flag_literals.py): every self-test failure, place found and stale allow-list entry, one per line, then
a FAIL summary (exit 1) or their `ok` line (exit 0)."""

import sys
from pathlib import Path


def report(problems: list, found: list, stale: list, found_what: str, ok: str) -> int:
    """`found_what`: what each place found is, after its count ("function(s) over 120 lines")."""
    for line in problems + found + stale:
        print(line)
    if problems or found or stale:
        print(f"FAIL: {len(found)} {found_what}, {len(stale)} stale allow-list "
              f"entr{'y' if len(stale) == 1 else 'ies'}, {len(problems)} self-test failure(s)")
        return 1
    print(ok)
    return 0


def run(usage: str, check) -> int:
    """The scan's exit code: 2 (printing `usage`) unless given one argument, SOURCE_DIR; else check(root)."""
    if len(sys.argv) != 2:
        print(usage, file=sys.stderr)
        return 2
    return check(Path(sys.argv[1]).resolve())

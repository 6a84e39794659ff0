#!/usr/bin/env python3
"""No include loop between the rooms of a layer (issue 49): a source scan.

A room is a header and its source file: include/fsdp/AREA/NAME.h, src/AREA/NAME.h and src/AREA/NAME.cpp
are the room AREA/NAME. Room A leans on room B when a file of A includes a header of B. This test reads the
quoted includes of every C++ file under src/ and include/ and fails when the rooms of a checked area lean
on each other in a loop (A on B and B, through any others, on A): a loop means neither can be read,
built or replaced without the other — as when the checkpoint's step_N protocol and its DCP payload each
included the other's header (Note [Checkpoint payloads] in src/checkpoint/payload.h). Rooms of other
areas count on the way (a loop through them is found too).

  test_include_loops.py SOURCE_DIR     exit 0: no loop; 1: each loop, its rooms in order

It also checks itself: planted rooms that include each other must be found, and a chain must not.
"""

import re
import sys
import tempfile
from pathlib import Path

# The areas whose rooms must not lean on each other in a loop, each with its reason.
CHECKED = {
    "checkpoint": "the step_N protocol above its payloads (our shard files, DCP): issue 49",
}

# Loops known and left, each with its reason: (the loop's rooms, smallest first) -> why. Short on purpose.
ALLOWED = {
    ("checkpoint/export_dir", "checkpoint/hf"):
        "export_dir.h is hf.cpp's own internal header (the export peft.cpp shares), defined in hf.cpp",
    ("checkpoint/file_io", "checkpoint/ownership"):
        "io::replace_directory marks what it swaps out as owned; the marker is written through file_io",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(root: Path, path: Path):
    """(area, name) of a file under src/ or include/fsdp/, else None."""
    rel = path.relative_to(root).parts
    if len(rel) >= 3 and rel[0] == "src":
        return (rel[1], Path(rel[-1]).stem)
    if len(rel) >= 4 and rel[0] == "include" and rel[1] == "fsdp":
        return (rel[2], Path(rel[-1]).stem)
    return None


def included_room(root: Path, path: Path, name: str):
    """The room a quoted include names: "fsdp/AREA/NAME.h" or a header beside the including file."""
    parts = Path(name).parts
    if len(parts) == 3 and parts[0] == "fsdp":
        return (parts[1], Path(parts[2]).stem)
    if len(parts) == 1 and (path.parent / name).is_file():
        return room_of(root, path.parent / name)
    return None


def graph(root: Path):
    edges = {}
    for top in ("src", "include"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".h", ".cpp") or not path.is_file():
                continue
            me = room_of(root, path)
            if me is None:
                continue
            for name in INCLUDE.findall(path.read_text(errors="replace")):
                other = included_room(root, path, name)
                if other is not None and other != me:
                    edges.setdefault(me, set()).add(other)
    return edges


def loops(edges):
    """Each loop through a room of a checked area, as its rooms in order (each loop once)."""
    found, seen = [], set()

    def walk(start, node, path, on_path):
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    found.append(path + [start])
            elif nxt not in on_path and nxt > start:  # each loop once: from its smallest room
                on_path.add(nxt)
                walk(start, nxt, path + [nxt], on_path)
                on_path.discard(nxt)

    for start in sorted(edges):
        walk(start, start, [start], {start})
    return [p for p in found if any(area in CHECKED for area, _ in p)]


def scan(root: Path):
    out = []
    for p in loops(graph(root)):
        names = [f"{a}/{n}" for a, n in p]
        if tuple(names[:-1]) not in ALLOWED:
            out.append("  " + " -> ".join(names))
    return out


def self_test():
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "include/fsdp/checkpoint").mkdir(parents=True)
        (root / "src/checkpoint").mkdir(parents=True)
        pub = root / "include/fsdp/checkpoint"
        inc = "fsdp/" + "checkpoint/"  # planted rooms' includes (not paths of this repository)
        (pub / "a.h").write_text(f'#include "{inc}b.h"\n')
        (pub / "b.h").write_text('#include "fsdp/common/error.h"\n')
        (root / "src/checkpoint/b.cpp").write_text(f'#include "{inc}b.h"\n#include "c.h"\n')
        (root / "src/checkpoint/c.h").write_text(f'#include "{inc}d.h"\n')
        assert scan(root) == [], f"a chain taken for a loop: {scan(root)}"
        # d's header includes a's: a -> b (b.cpp) -> c -> d -> a.
        (pub / "d.h").write_text(f'#include "{inc}a.h"\n')
        found = scan(root)
        assert found == ["  checkpoint/a -> checkpoint/b -> checkpoint/c -> checkpoint/d -> checkpoint/a"], \
            f"the planted loop was not found as it is: {found}"


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    self_test()
    found = scan(Path(sys.argv[1]))
    if found:
        print("include loops between rooms (a room is NAME.h with NAME.cpp; break each loop by moving what both "
              "need into a room below them):")
        print("\n".join(found))
        return 1
    print(f"no include loop in {', '.join(sorted(CHECKED))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

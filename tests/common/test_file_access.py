#!/usr/bin/env python3
"""One writer and one reader for every file (issue 39), one remover (issue 50): a source scan.

Every file fsdp-cpp writes goes through the output writer (include/fsdp/common/output_file.h, Note
[Output targets]) and every file it reads because a user named it through the bounded reader
(include/fsdp/common/files.h, Note [Input files]). This test reads every C++ source and header of
src/, apps/ and include/ (comments and string literals blanked) and fails when any of them other
than those two opens a file for writing, renames over one, or opens one for reading — unless the
place is on the allow-list below, each entry with its reason. Every deletion and rename goes through
include/fsdp/common/remove.h (Note [Removing without following links]), which never follows a
link: no other place removes or renames a directory entry. A new place that needs its own I/O
earns an entry here, in review.

  test_file_access.py SOURCE_DIR     exit 0: no other path; 1: the places found, one per line

It also checks itself: a source with each forbidden call, outside the allow-list, must be found.
"""

import re
import sys
import tempfile
from pathlib import Path

from scan_report import report, run

# What opens a file or renames over one, by name (matched on code with comments and strings blanked).
FORBIDDEN = {
    "ofstream": r"\bofstream\b",
    "fstream": r"(?<![io])\bfstream\b",
    "ifstream": r"\bifstream\b",
    "fopen": r"\b(?:fopen|freopen|fdopen_path)\s*\(",
    "open()": r"(?<![\w.>])(?:::)?(?:open|openat|open64|creat)\s*\(",
    "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC": r"\bO_(?:CREAT|WRONLY|RDWR|TRUNC)\b",
    "rename": r"\b(?:rename|renameat2?|copy_file|copy_file_range)\s*\(",
    "temporary file": r"\b(?:mkstemps?|mkostemps?|tmpfile|tmpnam)\s*\(",
    "shm_open": r"\bshm_open\s*\(",
    "remove": r"(?:\b(?:fs|filesystem)::remove(?:_all)?|\bremove_all|(?<![\w.>])(?:::)?(?:unlink|unlinkat|rmdir)"
              r"|\bstd::remove(?=\s*\(\s*[\w.]+(?:\.c_str\(\))?\s*\)))\s*\(",
}

# (file, what) -> why it may. Short on purpose: everything else uses the writer or the reader.
ALLOWED = {
    ("src/common/output_file.cpp", "open()"): "the output writer",
    ("src/common/output_file.cpp", "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC"): "the output writer",
    ("src/common/output_file.cpp", "ofstream"): "the output writer (open_output_for_append)",
    ("include/fsdp/common/output_file.h", "ofstream"): "the output writer's declaration",
    ("src/common/files.cpp", "open()"): "the bounded input reader",
    ("src/common/remove.cpp", "remove"): "the one remover: never through a link",
    ("src/common/remove.cpp", "rename"): "the one rename: moves the entry itself",
    ("src/common/remove.cpp", "open()"): "the one remover: directories opened O_NOFOLLOW to be emptied",
    ("src/train/metrics.cpp", "ofstream"): "the metrics file's stream, opened by open_output_for_append only",
    ("src/common/memory.cpp", "ofstream"): "/proc/self/clear_refs: the kernel's control file, not a user's",
    ("src/checkpoint/file_io.cpp", "open()"):
        "checkpoint I/O: files inside directories fsdp-cpp owns (Note [Ownership of what we delete])",
    ("src/checkpoint/file_io.cpp", "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC"): "checkpoint I/O (as above)",
    ("src/checkpoint/ownership.cpp", "open()"): "the lock file of an owned directory (O_NOFOLLOW)",
    ("src/checkpoint/ownership.cpp", "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC"): "the lock file (as above)",
    ("src/comm/shm_transport.cpp", "shm_open"): "shared-memory segments: names only this program makes",
    ("src/comm/shm_transport.cpp", "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC"): "shared-memory segments (as above)",
    ("src/comm/shm_transport.cpp", "open()"): "/dev/shm, listed by the stale-segment sweep",
}

LITERAL = re.compile(r'R"(?P<d>[^(\s]*)\(.*?\)(?P=d)"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|^[ \t]*#[ \t]*include[^\n]*", re.S | re.M)


def code_only(text: str) -> str:
    """The source with comments and literals replaced by spaces (line numbers kept)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    out, i = [], 0
    token = re.compile(LITERAL.pattern + "|" + COMMENT.pattern, re.S | re.M)
    for m in token.finditer(text):
        out.append(text[i:m.start()])
        out.append(blank(m))
        i = m.end()
    out.append(text[i:])
    return "".join(out)


# Where each kind of call belongs, for the message.
HOME = {"remove": "the one remover (common/remove.h)", "rename": "the one remover (common/remove.h)",
        "json parse": "the bounded readers (common/json_input.h, checkpoint/pickle.h's DCP readers)",
        "pickle read": "the bounded readers (common/json_input.h, checkpoint/pickle.h's DCP readers)"}


def scan(root: Path, allowed: dict, patterns: dict = FORBIDDEN) -> list:
    found = []
    for top in ("src", "apps", "include"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".cpp", ".h", ".cc", ".hpp", ".inc") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            code = code_only(path.read_text(errors="replace"))
            for what, pattern in patterns.items():
                if (rel, what) in allowed:
                    continue
                for m in re.finditer(pattern, code):
                    line = code.count("\n", 0, m.start()) + 1
                    where = HOME.get(what, "the output writer (common/output_file.h) and the input reader "
                                           "(common/files.h)")
                    found.append(f"{rel}:{line}: {what} ({m.group(0).strip()}) outside {where}")
    return found


SELF_TEST = {
    "src/x/bad.cpp": """
        // std::ofstream in a comment is fine, and so is "fopen(" in a string
        void f(const std::string& p) {
          std::ofstream out(p);
          std::ifstream in(p);
          FILE* f = std::fopen(p.c_str(), "w");
          int fd = ::open(p.c_str(), O_WRONLY | O_CREAT, 0644);
          std::rename(a, b);
          mkstemp(buf);
          int g = open(p.c_str(), O_RDONLY);
          std::filesystem::remove_all(p);
          ::unlink(p.c_str());
          std::remove(p.c_str());
          v.erase(std::remove(v.begin(), v.end(), 3), v.end());
        }
    """,
}


def self_test() -> list:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for rel, text in SELF_TEST.items():
            (root / rel).parent.mkdir(parents=True)
            (root / rel).write_text(text)
        for top in ("apps", "include"):
            (root / top).mkdir()
        found = scan(root, {})
    want = {"ofstream", "ifstream", "fopen", "open()", "O_CREAT/O_WRONLY/O_RDWR/O_TRUNC", "rename", "temporary file",
            "remove"}
    got = {w for w in want if any(f": {w} (" in f for f in found)}
    bad = [f"self-test: the scan missed {w}" for w in sorted(want - got)]
    removes = [f for f in found if ": remove (" in f]
    if len(removes) != 3:  # remove_all, unlink, std::remove(path); never the algorithm std::remove(first, last, v)
        bad.append(f"self-test: the scan found {len(removes)} removals, not 3: " + "; ".join(removes))
    if any(":2:" in f for f in found):
        bad.append("self-test: the scan flagged a comment or a string: " + "; ".join(f for f in found if ":2:" in f))
    return bad


# Every JSON or pickle value read from a file goes through the bounded readers (issue 50): JSON
# through parse_json_input (include/fsdp/common/json_input.h: nesting bounded before parsing, every
# error one line), pickles through the restricted machine (checkpoint/pickle.h), which only the DCP
# readers call. What else parses JSON parses text this program made itself, in this process or on
# another rank of the job.
PARSERS = {
    "json parse": r"\bjson::parse\s*\(",
    "pickle read": r"\bpickle::read\s*\(",
}
PARSERS_ALLOWED = {
    ("src/common/json_input.cpp", "json parse"): "the bounded JSON reader",
    ("src/train/model_family.cpp", "json parse"): "the model config's own config.json text (ModelConfig::hf_config_json)",
    ("src/checkpoint/hf.cpp", "json parse"): "the model config's own config.json text (HfModelInfo::config_json)",
    ("apps/estimate_cli.cpp", "json parse"): "the cluster's own JSON (cluster_to_json)",
    ("src/train/profiling.cpp", "json parse"): "trace events the ranks of this job made (all_gather_strings)",
    ("src/checkpoint/agreement.cpp", "json parse"): "a rank's status and payload (RankStatus::payload_json), made by "
                                                    "this program on another rank",
    ("src/checkpoint/dcp_format.cpp", "pickle read"): "the DCP readers: .metadata and items (dcp_format.h)",
}


def check(root: Path) -> int:
    problems = self_test()
    with tempfile.TemporaryDirectory() as d:  # the parser scan checks itself too
        (Path(d) / "src").mkdir()
        (Path(d) / "src" / "x.cpp").write_text('auto j = nlohmann::json::parse(text);  // "json::parse(" in a string\n'
                                               "auto p = pickle::read(bytes, {}, origin);\n")
        if len(scan(Path(d), {}, PARSERS)) != 2:
            problems.append("self-test: the parser scan missed a json::parse or a pickle::read")
    found = scan(root, ALLOWED) + scan(root, PARSERS_ALLOWED, PARSERS)
    stale = [f"allow-list entry {f} {w!r} matches nothing: remove it" for (f, w) in ALLOWED
             if not (root / f).is_file() or not re.search(FORBIDDEN[w], code_only((root / f).read_text()))]
    stale += [f"allow-list entry {f} {w!r} matches nothing: remove it" for (f, w) in PARSERS_ALLOWED
              if not (root / f).is_file() or not re.search(PARSERS[w], code_only((root / f).read_text()))]
    return report(problems, found, stale, "place(s) outside the writer and the reader",
                  f"ok: every file access in src/, apps/ and include/ goes through the writer, the reader, the "
                  f"remover and the bounded parsers ({len(ALLOWED) + len(PARSERS_ALLOWED)} allowed places)")


if __name__ == "__main__":
    sys.exit(run(__doc__.split("\n\n")[1], check))

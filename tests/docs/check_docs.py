"""The documentation's checks.

    check_docs.py links SOURCE_DIR
        Every relative link of every Markdown file of the repository ([text](path),
        [text](path#anchor), ![image](path), [ref]: path) names a file or directory that exists,
        and an anchor names a heading of the linked page (GitHub's heading ids). Every file a code
        comment cites by path (src/fsdp/plan.cpp, docs/design.md, checkpoint/ownership.h, ...),
        and every Markdown file it names (DESIGN.md), exists in the repository.
    check_docs.py notes SOURCE_DIR
        Every design note cited anywhere in the repository (source, test, script or Markdown file)
        has exactly one definition, and no note is defined twice. A definition is a comment
        paragraph that opens with the note's header: the first line of a comment block, or the
        line after an empty comment line, whose text starts with `Note [` Name `]` followed by
        nothing, by '.', or by '(issue N)'. Every other mention is a citation: `See Note [...]`,
        `Note [...] in file.cpp`, or `Note [...]: a summary` opening a comment. A name may run
        over lines; its spaces count as one.
    check_docs.py doxygen DOXYGEN DOXYFILE OUTPUT_DIR [HEADER...]
        Doxygen generates the API reference from the public headers with no warning; and every
        declaration of each HEADER (the core API, paths under include/) is documented: a second
        pass over them alone with EXTRACT_ALL off warns about each undocumented one.

Prints every problem with its file and line; exit 0 pass, 1 fail.
"""

import re
import subprocess
import sys
from pathlib import Path

SOURCE_SUFFIXES = {".h", ".cpp", ".cc", ".inc", ".py", ".sh", ".cmake", ".in", ".toml", ".yaml", ".yml", ".sbatch"}
SOURCE_NAMES = {"CMakeLists.txt", "run"}


def repository_files(root):
    """The repository's files: git's list when it is a checkout, else a walk without build trees."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout.decode()
        files = [root / f for f in out.split("\0") if f]
        return [f for f in files if f.is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = re.compile(r"^(build[^/]*|\.git)(/|$)")
        return [p for p in root.rglob("*") if p.is_file() and not skip.match(str(p.relative_to(root)))]


# ------------------------------------------------------------------------ Markdown links

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
FENCE = re.compile(r"^\s*(```|~~~)")


def github_anchor(heading):
    """GitHub's id of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        ids, seen, fenced = set(), {}, False
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = re.match(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if m and not fenced:
                base = github_anchor(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                ids.add(base if n == 0 else f"{base}-{n}")
        cache[path] = ids
    return cache[path]


def check_markdown(root, md, problems):
    fenced = False
    for no, line in enumerate(md.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        targets = [m.group(1) for m in LINK.finditer(line)]
        m = REFERENCE.match(line)
        if m:
            targets.append(m.group(1))
        for t in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t):  # https:, mailto:, ...
                continue
            path_part, _, anchor = t.partition("#")
            target = md if not path_part else (md.parent / path_part.split("?")[0])
            where = f"{md.relative_to(root)}:{no}"
            if not target.exists():
                problems.append(f"{where}: link to {t}: {target.relative_to(root) if root in target.parents else target}"
                                f" does not exist")
                continue
            try:
                target.resolve().relative_to(root.resolve())
            except ValueError:
                problems.append(f"{where}: link to {t} leaves the repository")
                continue
            if anchor and target.suffix == ".md" and anchor not in anchors_of(target):
                problems.append(f"{where}: link to {t}: {target.name} has no heading with id '{anchor}'")


# ------------------------------------------------------------------------ citations in code

CITED_PATH = re.compile(r"(?<![\w/.:-])((?:\.\./|\./)?(?:[\w.-]+/)+[\w.-]+\.(?:md|h|hpp|cpp|cc|cmake|py|sh|txt|json|toml|inc|in))\b")
CITED_MD = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")


def comment_text(path, line, state):
    """The comment part of `line` ('' when none). state['block'] tracks /* ... */ in C++."""
    if path.suffix in {".h", ".cpp", ".cc", ".inc"}:
        out = ""
        rest = line
        while rest:
            if state.get("block"):
                end = rest.find("*/")
                if end < 0:
                    return out + rest
                out += rest[:end]
                rest = rest[end + 2:]
                state["block"] = False
                continue
            # Outside comments: skip string literals, find // or /*.
            m = re.search(r'"(?:[^"\\]|\\.)*"|//|/\*', rest)
            if not m:
                return out
            if m.group(0) == "//":
                return out + rest[m.end():]
            if m.group(0) == "/*":
                state["block"] = True
                rest = rest[m.end():]
                continue
            rest = rest[m.end():]
        return out
    # Python, shell, CMake, TOML, YAML: '#' comments (a '#' inside a string is rare enough here).
    i = line.find("#")
    return line[i + 1:] if i >= 0 and not line.startswith("#!") else ""


# Paths that name other projects' files (LibTorch's, nlohmann's headers), what a run writes (build/,
# test-tmp/), or a placeholder (DIR/adapter_config.json): not files of this repository.
EXTERNAL = re.compile(r"^(include/)?(torch|ATen|c10|nlohmann|CLI|gtest|gmock|nvidia|cuda|sentencepiece)/"
                      r"|^(build[\w-]*|test-tmp)/|^[A-Z_]+/")


def cited_exists(root, src, cited):
    cited = cited.rstrip(".")
    if EXTERNAL.match(cited):
        return True
    bases = [root, src.parent, root / "include" / "fsdp", root / "include", root / "src", root / "tests", root / "docs"]
    return any((b / cited).exists() for b in bases)


def check_citations(root, src, problems):
    state = {}
    try:
        lines = src.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return
    for no, line in enumerate(lines, 1):
        text = comment_text(src, line, state)
        if not text:
            continue
        text = re.sub(r"https?://\S+", "", text)  # URLs cite other sites
        for m in CITED_PATH.finditer(text):
            if not cited_exists(root, src, m.group(1)):
                problems.append(f"{src.relative_to(root)}:{no}: cites {m.group(1)}, which does not exist")
        for m in CITED_MD.finditer(text):
            if not cited_exists(root, src, m.group(1)) and not any(
                    (root / d / m.group(1)).exists() for d in ["docs"]):
                problems.append(f"{src.relative_to(root)}:{no}: cites {m.group(1)}, which does not exist "
                                f"(the design document is docs/design.md)")


def links(root):
    root = root.resolve()
    files = repository_files(root)
    problems = []
    mds = [f for f in files if f.suffix == ".md"]
    for md in mds:
        check_markdown(root, md, problems)
    sources = [f for f in files if f.suffix in SOURCE_SUFFIXES or f.name in SOURCE_NAMES]
    for src in sources:
        check_citations(root, src, problems)
    for p in problems:
        print(p)
    print(f"{len(mds)} Markdown files, {len(sources)} source files: {len(problems)} problem(s)")
    return 1 if problems else 0


# ------------------------------------------------------------------------ design notes

# A name starts with a letter or digit, so a placeholder (`Note [...]`) is no citation; it may run over
# lines (comment markers and spaces between its words count as one space).
NOTE = re.compile(r"\bNote\s+\[([A-Za-z0-9][^\]\[]{0,100})\]")
NOTE_HEADER = re.compile(r"^Note \[([A-Za-z0-9][^\]\[]*)\](?:$|\.|\s+\(issue \d+\))")
LEADING_MARKER = re.compile(r"^[ \t]*(?://+|/\*+|\*+/?|#+)?[ \t]?", re.M)


def note_name(raw):
    return " ".join(raw.split())


def comment_lines(path, lines):
    """(line number, text) of each line: the text of a line that holds only a comment (in Python, also
    a line of a string that opens a statement: a docstring), ' ' for an empty one, '' for a line of code."""
    state, out = {}, []
    cpp = path.suffix in {".h", ".cpp", ".cc", ".inc"}
    in_string = docstring = False  # Python's triple-quoted strings
    for no, line in enumerate(lines, 1):
        code = line.strip()
        if path.suffix == ".py" and (in_string or '"""' in code):
            parts = code.split('"""')
            if not in_string:
                docstring = re.match(r'^[rRbBuU]?"""', code) is not None
            text = parts[0] if in_string else parts[1]
            if len(parts) % 2 == 0:  # an odd number of quotes opens or closes a string
                in_string = not in_string
            out.append((no, (text.strip() or " ") if docstring else ""))
            continue
        in_block = state.get("block", False)
        text = comment_text(path, line, state)
        only = (in_block or code.startswith("//") or code.startswith("/*")) if cpp else \
            (code.startswith("#") and not code.startswith("#!"))
        if not only:
            out.append((no, ""))
            continue
        text = re.sub(r"^[*/\s]+|\*/\s*$", "", text.strip()) if cpp else text.lstrip("#").strip()
        out.append((no, text or " "))
    return out


def note_definitions(path, lines):
    """(name, line number) of each note that `path` defines: a header opening a comment paragraph."""
    found, previous = [], ""
    for no, text in comment_lines(path, lines):
        if text and (not previous or previous == " "):
            m = NOTE_HEADER.match(text)
            if m:
                found.append((note_name(m.group(1)), no))
        previous = text
    return found


def note_citations(text):
    """(name, line number) of every mention of a note in `text`, comment markers between lines dropped."""
    joined = LEADING_MARKER.sub("", text)
    return [(note_name(m.group(1)), joined.count("\n", 0, m.start()) + 1) for m in NOTE.finditer(joined)]


def notes(root):
    root = root.resolve()
    this = Path(__file__).resolve()
    files = [f for f in repository_files(root) if f.resolve() != this and
             (f.suffix == ".md" or f.suffix in SOURCE_SUFFIXES or f.name in SOURCE_NAMES)]
    definitions, citations = {}, {}
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        where = f.relative_to(root)
        if f.suffix != ".md":
            for name, no in note_definitions(f, text.splitlines()):
                definitions.setdefault(name, []).append(f"{where}:{no}")
        for name, no in note_citations(text):
            citations.setdefault(name, []).append(f"{where}:{no}")
    problems = []
    for name, places in sorted(definitions.items()):
        places.sort()
        if len(places) > 1:
            problems.append(f"Note [{name}] is defined {len(places)} times: {', '.join(places)} — keep one "
                            f"definition and cite it elsewhere (`See Note [{name}]`)")
    for name, places in sorted(citations.items()):
        places.sort()
        if name not in definitions:
            problems.append(f"Note [{name}] is cited at {', '.join(places)} but defined nowhere — write it as a "
                            f"comment paragraph opening with `Note [{name}]` where the behaviour lives")
    for p in problems:
        print(p)
    cited = sum(len(v) for v in citations.values())
    print(f"{len(files)} files: {len(definitions)} notes defined, {cited} mentions of {len(citations)} notes; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


def run_doxygen(exe, config, log):
    """Runs doxygen on `config` (text); returns (exit code or None when it cannot start, output, warnings)."""
    try:
        p = subprocess.run([exe, "-"], input=config, capture_output=True, text=True)
    except OSError as e:
        return None, f"cannot run doxygen ({exe}): {e} — install it (Debian: doxygen; scripts/deps.sh does) and " \
                     f"configure the build again", []
    warnings = log.read_text().strip().splitlines() if log.exists() else []
    return p.returncode, p.stdout + p.stderr, warnings


def doxygen(exe, doxyfile, out_dir, strict_headers):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Path(doxyfile).read_text()
    log = out_dir / "warnings.log"
    rc, out, warnings = run_doxygen(exe, base + f"\nOUTPUT_DIRECTORY = {out_dir}\nWARN_LOGFILE = {log}\n", log)
    if rc is None or rc != 0:
        print(out if rc is None else f"doxygen exited {rc}:\n{out}")
        return 1
    for w in warnings:
        print(w)
    index = out_dir / "html" / "index.html"
    if not index.exists():
        print(f"doxygen wrote no {index}")
        return 1
    pages = len(list((out_dir / "html").glob("*.html")))
    print(f"doxygen: {pages} HTML pages in {out_dir / 'html'}, {len(warnings)} warning(s)")
    failed = bool(warnings)
    if strict_headers:
        include = Path(re.search(r"^STRIP_FROM_INC_PATH\s*=\s*(\S+)", base, re.M).group(1))
        inputs = " ".join(str(include / h) for h in strict_headers)
        strict_log = out_dir / "undocumented.log"
        rc, out, undocumented = run_doxygen(exe, base + f"""
INPUT = {inputs}
RECURSIVE = NO
EXTRACT_ALL = NO
GENERATE_HTML = NO
OUTPUT_DIRECTORY = {out_dir / 'strict'}
WARN_LOGFILE = {strict_log}
""", strict_log)
        if rc != 0:
            print(f"doxygen (undocumented declarations) exited {rc}:\n{out}")
            return 1
        for w in undocumented:
            print(w)
        print(f"undocumented declarations in {', '.join(strict_headers)}: {len(undocumented)}")
        failed = failed or bool(undocumented)
    return 1 if failed else 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "links":
        return links(Path(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "notes":
        return notes(Path(sys.argv[2]))
    if len(sys.argv) >= 5 and sys.argv[1] == "doxygen":
        return doxygen(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

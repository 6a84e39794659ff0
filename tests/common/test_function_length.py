#!/usr/bin/env python3
"""No function in src/ or apps/ over 120 lines (issue 49): a source scan.

A function that long does several things in a row; its own section comments name them, and each step
reads better as a function (or a small struct) of its own with that name. This test reads every C++
source and header of src/ and apps/, finds each function definition at namespace or class scope, and
fails when one spans more than LIMIT lines, from its signature's first line to its closing brace,
unless it is on the allow-list below with its reason. Lambdas and local classes count as part of the
function that holds them.

The sources are split into tokens by Pygments' C++ lexer (comments, strings and character literals
never reach the brace count), and only the first branch of each #if/#ifdef is read (so both branches
of a conditional signature do not open two bodies).

  test_function_length.py SOURCE_DIR     exit 0: none too long; 1: each one found, one per line

It also checks itself: planted functions, one over the limit among tricky shapes, must be measured
right; and every allow-list entry must still name a function over the limit.
"""

import re
import sys
import tempfile
from pathlib import Path

from pygments.lexers import CppLexer
from pygments.token import Comment, Keyword, Name, Operator, Punctuation, String, Text, Whitespace

from scan_report import report, run

LIMIT = 120

# (file, function) -> why it may be longer. Short on purpose: a new entry is earned in review.
ALLOWED = {
    ("src/checkpoint/pickle.cpp", "step"):
        "the pickle machine's opcode switch: one case per opcode, read as a table",
}

CLASS_KEYWORDS = {"class", "struct", "union"}


def directives_blanked(text: str) -> str:
    """The source with every preprocessor line, and each #else/#elif branch, blanked (newlines kept)."""
    out, stack, continued = [], [], False  # stack: whether the current conditional's branch is skipped
    for line in text.split("\n"):
        stripped = line.lstrip()
        if continued or stripped.startswith("#"):
            continued = line.endswith("\\")
            word = re.match(r"#\s*(\w*)", stripped)
            word = word.group(1) if word else ""
            if word in ("if", "ifdef", "ifndef"):
                stack.append(False)
            elif word in ("elif", "else") and stack:
                stack[-1] = True
            elif word == "endif" and stack:
                stack.pop()
            out.append("")
        elif any(stack):
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def tokens(text: str):
    """(line, text) for each token that is code: no comments, whitespace; a literal becomes '""'."""
    pending = None  # the lexer may split `::` in two
    for line, t in lexed(text):
        if pending and t == ":" and pending[1] == ":":
            t, pending = "::", None
        if pending:
            yield pending
        pending = (line, t)
    if pending:
        yield pending


def lexed(text: str):
    lexer = CppLexer(stripnl=False, ensurenl=False)
    line = 1
    for _, kind, value in lexer.get_tokens_unprocessed(text):
        if kind in Comment or kind in Whitespace or (kind in Text and not value.strip()):
            pass
        elif kind in String:
            yield line, '""'
        else:
            for piece in re.findall(r"::|->|[A-Za-z_]\w*|\d[\w.']*|\S", value):
                yield line, piece
        line += value.count("\n")


def without_template(stmt):
    """The tokens after a leading `template <...>` (its parameters may say `class`)."""
    if not stmt or stmt[0][1] != "template":
        return stmt
    depth = 0
    for i, (_, t) in enumerate(stmt):
        depth += (t == "<") - (t == ">")
        if t == ">" and depth == 0:
            return without_template(stmt[i + 1:])
    return stmt


def function_name(stmt) -> str:
    """The (qualified) name before the first top-level '(' of a definition's tokens."""
    stmt = without_template(stmt)
    words = [t for _, t in stmt]
    if "operator" in words:  # operator==, operator(), operator bool
        k = words.index("operator")
        end = k + 1 + (words[k + 1:k + 3] == ["(", ")"]) * 2
        while end < len(words) and words[end] != "(":
            end += 1
        j = k
        while j >= 2 and words[j - 1] == "::":
            j -= 2
        return "".join(words[j:k]) + "operator" + "".join(words[k + 1:end])
    depth = 0
    for i, (_, t) in enumerate(stmt):
        if t == "<":
            depth += 1
        elif t == ">" and depth:
            depth -= 1
        elif t == "(" and depth == 0:
            j = i - 1  # back over `A::B::name` or `A::~A`
            if j < 0 or not re.fullmatch(r"[A-Za-z_]\w*", stmt[j][1]):
                return "?"
            j -= stmt[j - 1][1] == "~" if j else 0
            while j >= 2 and stmt[j - 1][1] == "::" and re.fullmatch(r"[A-Za-z_]\w*", stmt[j - 2][1]):
                j -= 2
            return "".join(t for _, t in stmt[j:i])
    return "?"


def is_function_head(stmt) -> bool:
    """Whether a statement at namespace/class scope that meets '{' is a function's signature."""
    stmt = without_template(stmt)
    depth = 0
    for k, (_, t) in enumerate(stmt):
        if t in ("(", "["):
            if depth == 0 and t == "(":
                return True
            depth += 1
        elif t in (")", "]"):
            depth -= 1
        elif depth == 0 and t == "=" and not (k and stmt[k - 1][1] in ("operator", "=", "!", "<", ">")):
            return False  # an initializer: `auto x = ...{`
        elif depth == 0 and t in CLASS_KEYWORDS | {"enum", "namespace"}:
            return False
    return False


def functions(text: str):
    """(name, first line, last line) of each function defined at namespace or class scope."""
    found = []
    frames = []  # each: ("scope"|"body"|"inner"|"init", the stmt to resume, function's name/first line)
    stmt = []    # code tokens since the last ';', '{' or '}' at the current scope
    paren = 0    # parenthesis depth within stmt
    for line, t in tokens(directives_blanked(text)):
        in_scope = not frames or frames[-1][0] == "scope"
        if not in_scope:
            if t == "{":
                frames.append(("inner", None, None))
            elif t == "}":
                kind, saved, head = frames.pop()
                if kind == "body":
                    found.append((head[0], head[1], line))
                    stmt, paren = [], 0
                elif kind == "init":
                    stmt = saved
            continue
        if t == "(":
            paren += 1
        elif t == ")":
            paren -= 1
        if t == "{":
            prev = stmt[-1][1] if stmt else ""
            words = {w for _, w in stmt}
            if paren > 0:
                frames.append(("init", stmt + [(line, t)], None))  # a braced argument
            elif is_function_head(stmt):
                # In a constructor's initializer list `x_{a}` initializes a member; the body's brace
                # follows ')' or '}' or a qualifier.
                init_list = any(w == ":" for _, w in stmt)
                if init_list and re.fullmatch(r"[A-Za-z_]\w*|>", prev) and prev not in (
                        "const", "noexcept", "override", "final", "mutable", "try"):
                    frames.append(("init", stmt + [(line, t)], None))
                else:
                    frames.append(("body", None, (function_name(stmt), stmt[0][0])))
            elif words & ({"namespace", "extern"} | CLASS_KEYWORDS) and "=" not in words:
                frames.append(("scope", None, None))
                stmt, paren = [], 0
            else:
                frames.append(("init", stmt + [(line, t)], None))  # an initializer or an enum's list
            continue
        if t == "}":
            if frames:
                kind, saved, _ = frames.pop()
                stmt = saved if kind == "init" else []
            paren = 0 if not stmt else paren
            continue
        if t == ";" and paren == 0:
            stmt = []
            continue
        stmt.append((line, t))
    return found


def scan(root: Path):
    """(rel path, name, lines, first line) of every function over LIMIT lines in src/ and apps/."""
    long = []
    for top in ("src", "apps"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".cpp", ".h", ".cc", ".hpp", ".inc") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            for name, first, last in functions(path.read_text(errors="replace")):
                if last - first + 1 > LIMIT:
                    long.append((rel, name, last - first + 1, first))
    return long


SELF_TEST = """
#include <x>
namespace a { namespace b {
struct S : Base<int> {
  S(int x) : x_{x}, y_(x) {
    f("}{");  // }
  }
  int g() const { return '}'; }
  int x_ = {1}; int y_;
};
const std::map<int, int> kTable = {{1, 2}, {3, 4}};
enum class E { kA, kB };
#if A
int h(int x) {
#else
int h(long x) {
#endif
  auto l = [&](int y) { return y + x; };
  return l(x);
}
template <class T> T S::k(T v) noexcept {
  LONG
}
bool operator==(const S& a, const S& b) { return true; }
} }
"""


def self_test() -> list:
    text = SELF_TEST.replace("LONG", "\n".join("  v += 1;" for _ in range(LIMIT)))
    got = {name: last - first + 1 for name, first, last in functions(text)}
    want = {"S": 3, "g": 1, "h": 7, "S::k": LIMIT + 2, "operator==": 1}
    return [] if got == want else [f"self-test: measured {got}, expected {want}"]


def check(root: Path) -> int:
    problems = self_test()
    long = scan(root)
    found = [f"{rel}:{first}: {name} is {n} lines (at most {LIMIT}): cut it into the steps it names"
             for rel, name, n, first in long if (rel, name) not in ALLOWED]
    present = {(rel, name) for rel, name, _, _ in long}
    stale = [f"allow-list entry {rel} {name!r} is not a function over {LIMIT} lines: remove it"
             for rel, name in ALLOWED if (rel, name) not in present]
    return report(problems, found, stale, f"function(s) over {LIMIT} lines",
                  f"ok: no function in src/ or apps/ over {LIMIT} lines ({len(ALLOWED)} allowed)")


if __name__ == "__main__":
    sys.exit(run(__doc__.split("\n\n")[2], check))

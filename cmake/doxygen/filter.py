"""Doxygen input filter: the public headers' plain // comments as documentation.

The headers state their contracts in ordinary // comments (docs/design.md, "contracts in headers");
Doxygen reads only its own comment forms. This filter, run by Doxygen on each header (INPUT_FILTER),
turns
  - the file's opening comment into the file's documentation (\\file),
  - a // line above a declaration into ///,
  - a comment after code on the same line into ///< (it documents that member),
escapes the characters Doxygen would take as commands or HTML (\\ @ < > & # % $), and keeps every
line where it was, so line numbers in warnings are the header's own.
"""
import re
import sys

SPECIAL = re.compile(r'([\\@<>&#%$"])')


def escape(text):
    return SPECIAL.sub(r"\\\1", text)


def main(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    opening = True  # still inside the comment block that opens the file
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("//"):
            text = stripped[2:]
            if text.startswith("/") or text.startswith("!"):
                text = text[1:]
            if opening:
                out.append("//! " + escape(text) + (" \\file" if i == 0 else ""))
            else:
                out.append(indent + "/// " + escape(text))
            continue
        opening = False
        # Code followed by a comment: the comment documents the member declared on this line. Only
        # outside string literals (a quote before the // leaves the line alone).
        m = re.match(r'^([^"/]*?[;,{}]\s*)//(.*)$', line)
        if m and not stripped.startswith("#"):
            out.append(m.group(1) + "///< " + escape(m.group(2).lstrip("/")))
            continue
        out.append(line)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])

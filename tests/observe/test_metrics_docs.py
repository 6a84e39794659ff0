"""The metrics documentation and fsdp-train --help say what the metrics table says.

  python3 test_metrics_docs.py --train build/apps/fsdp-train --doc docs/metrics.md

 1. docs/metrics.md holds `fsdp-train --list-metrics` (the table, from the code)
    verbatim between its two markers; on a difference the script prints the
    table to paste in.
 2. fsdp-train --help names, under --metrics-file, every key of the file; under
    --tensorboard every tag; under --metrics-port every Prometheus name.
Exit 1 when one fails.
"""

import argparse
import re
import subprocess
import sys

BEGIN = "<!-- metrics table: the output of fsdp-train --list-metrics (tests/observe/test_metrics_docs.py) -->"
END = "<!-- end of the metrics table -->"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--doc", required=True)
    a = ap.parse_args()
    table = subprocess.run([a.train, "--list-metrics"], check=True, stdout=subprocess.PIPE, text=True).stdout
    doc = open(a.doc).read()
    failed = False
    if BEGIN not in doc or END not in doc:
        print(f"[FAIL] {a.doc} has no markers\n  {BEGIN}\n  {END}")
        failed = True
    else:
        documented = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
        same = documented == table
        print(f"[{'ok' if same else 'FAIL'}] {a.doc} holds the table of fsdp-train --list-metrics "
              f"({table.count(chr(10)) - 2} metrics)")
        if not same:
            print("  the table to put between the markers:\n" + table)
            failed = True

    help_text = subprocess.run([a.train, "--help"], check=True, stdout=subprocess.PIPE, text=True).stdout
    # Each option's description, up to the next option.
    def described(flag):
        m = re.search(re.escape(flag) + r"\b.*?(?=\n\s+--[a-z]|\Z)", help_text, re.S)
        return " ".join(m.group(0).split()) if m else ""
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(cells)
    wanted = {
        "--metrics-file": [re.sub(r"`", "", r[1]) for r in rows if r[1] != "-"],
        "--tensorboard": [re.sub(r"`", "", r[2]) for r in rows if r[2] != "-"],
        "--metrics-port": [re.match(r"`([^`]+)`", r[3]).group(1) for r in rows if r[3] != "-"],
    }
    for flag, names in wanted.items():
        text = described(flag)
        missing = [n for n in names if not re.search(r"(?<![\w/])" + re.escape(n) + r"(?![\w/])", text)]
        print(f"[{'ok' if not missing else 'FAIL'}] fsdp-train --help: {flag} names its {len(names)} metrics"
              + (f"; missing {missing}" if missing else ""))
        failed |= bool(missing) or not names
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The Grafana dashboard in deploy/grafana loads and shows fsdp-train's metrics.

  python3 test_grafana_dashboard.py --train build/apps/fsdp-train --dashboard deploy/grafana/fsdp-train-dashboard.json \
      --schema tests/deploy/grafana_dashboard.schema.json

Checks, each printed, exit 1 on the first list of failures:
 1. The JSON validates against grafana_dashboard.schema.json (Grafana's dashboard
    JSON model transcribed: field names and types, required fields,
    enumerations; unknown fields are errors) with the jsonschema library.
 2. What a schema cannot say and Grafana needs to lay the dashboard out: panel
    ids unique, every panel inside the 24-column grid, no two panels overlapping,
    every query's refId unique within its panel.
 3. Every variable a query or panel uses ($rank, ${datasource}) is defined in
    templating, and every query names only metrics fsdp-train serves (the
    Prometheus names of `fsdp-train --list-metrics`, the metrics table).
 4. Every metric fsdp-train serves is shown by some panel, so a metric added
    to the table without a panel fails here.
"""

import argparse
import json
import re
import subprocess
import sys

import jsonschema


def served_metrics(train):
    """The Prometheus names of fsdp-train's metrics table (the --list-metrics Markdown)."""
    out = subprocess.run([train, "--list-metrics"], check=True, stdout=subprocess.PIPE, text=True).stdout
    names = set()
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4:
            m = re.match(r"`(fsdp_[a-z0-9_]+)`", cells[3])
            if m:
                names.add(m.group(1))
    return names


def layout_problems(panels):
    problems, seen, boxes = [], set(), []
    for p in panels:
        if p["id"] in seen:
            problems.append(f"panel id {p['id']} is used twice")
        seen.add(p["id"])
        g = p["gridPos"]
        if g["x"] + g["w"] > 24:
            problems.append(f"panel '{p['title']}' ends at column {g['x'] + g['w']}, past the grid's 24")
        for other, o in boxes:
            if g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"] and g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"]:
                problems.append(f"panels '{other}' and '{p['title']}' overlap")
        boxes.append((p["title"], g))
        refs = [t["refId"] for t in p.get("targets", [])]
        if len(refs) != len(set(refs)):
            problems.append(f"panel '{p['title']}' repeats a refId: {refs}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--schema", required=True)
    a = ap.parse_args()
    dashboard = json.load(open(a.dashboard))
    schema = json.load(open(a.schema))
    failed = False

    def report(what, problems):
        nonlocal failed
        print(f"[{'ok' if not problems else 'FAIL'}] {what}")
        for p in problems:
            print(f"    {p}")
        failed |= bool(problems)

    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(dashboard), key=lambda e: list(e.absolute_path))
    def why(e):
        # An anyOf (a panel is a Panel or a RowPanel): the closest alternative's own error.
        e = jsonschema.exceptions.best_match(e.context) if e.context else e
        return f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
    report(f"schema: {a.dashboard} is a Grafana dashboard (schemaVersion {dashboard.get('schemaVersion')})",
           [why(e) for e in errors])
    if errors:
        return 1
    panels = dashboard["panels"]
    report(f"layout: {len(panels)} panels, unique ids, inside the grid, none overlapping", layout_problems(panels))

    variables = {v["name"] for v in dashboard["templating"]["list"]}
    served = served_metrics(a.train)
    used_vars, used_metrics, problems = set(), set(), []
    text = json.dumps(panels)
    for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text):
        if not name.startswith("__"):
            used_vars.add(name)
    for p in panels:
        for t in p.get("targets", []):
            for m in re.findall(r"\b(fsdp_[a-z0-9_]+)\b", t["expr"]):
                used_metrics.add(m)
                if m not in served:
                    problems.append(f"panel '{p['title']}' queries {m}, which fsdp-train does not serve")
    problems += [f"variable ${v} is used but not defined in templating" for v in sorted(used_vars - variables)]
    report(f"queries: {len(used_metrics)} metrics, all served by fsdp-train; variables {sorted(used_vars)} defined",
           problems)
    report(f"coverage: every one of the {len(served)} metrics fsdp-train serves has a panel",
           [f"{m} has no panel" for m in sorted(served - used_metrics)])
    if not served:
        report("fsdp-train --list-metrics names Prometheus metrics", ["none found"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

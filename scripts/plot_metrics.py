#!/usr/bin/env python3
"""Plots of a training run from its --metrics-file, for a run without TensorBoard.

    python scripts/plot_metrics.py METRICS.jsonl [--out DIR]

fsdp-train's rank 0 appends one JSON object per logged step to --metrics-file
(step, loss, lr, grad_norm, samples_per_s, tokens_per_s, step_time_s,
peak_mem_bytes, the step's collective bytes, world_size; loss_scale and skipped
under dynamic loss scaling) and one per evaluation (eval_loss, eval_tokens, and
the number of steps trained when it ran as "step"; an --eval-only run's record
has no step and is left out here). This writes, with matplotlib's Agg backend
(no display needed), into DIR (default: the metrics file's directory):

  loss.png        training loss per step; evaluation loss as markers
  throughput.png  tokens/s per step (global: every rank's tokens)
  memory.png      rank 0's peak memory per step, in MiB as the log prints it
                  (the process's peak RSS on CPU, the CUDA allocator's peak on GPU),
                  and of it the engine's unsharded buffers beside the plan's bound
                  (unsharded_peak_bytes, unsharded_bound_bytes) where recorded

A step recorded twice (a file older than the resume logic, which drops the
records of steps a resumed run trains again: Note [Metrics after a resume] in
src/train/run_state.cpp) is plotted with its last record, the run that went on.

Exit status: 0 with the plots written, 2 for a file that cannot be read as a
metrics file (the reason and the line number printed).
"""

import argparse
import json
import math
import os
import sys

PROG = "plot_metrics.py"
MIB = 1024.0 * 1024.0


class UsageError(Exception):
    pass


def number(value):
    """A metric as a float: nlohmann::json writes NaN and inf as null."""
    if value is None or isinstance(value, bool):
        return math.nan
    return float(value)


def read_metrics(path):
    """(steps, evals): {step: record} for step records and for evaluations with
    a step, the last record of a step winning."""
    if not os.path.isfile(path):
        raise UsageError("%s: no such file (give the path fsdp-train was run with as --metrics-file)" % path)
    steps, evals = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.strip())
            except json.JSONDecodeError as e:
                raise UsageError("%s:%d: not JSON (%s): %.80r" % (path, n, e.msg, line.rstrip("\n")))
            if not isinstance(rec, dict):
                raise UsageError("%s:%d: a JSON %s, not an object: %.80r" % (
                    path, n, type(rec).__name__, line.rstrip("\n")))
            step = rec.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                continue  # an --eval-only record, or a note without a step
            if "eval_loss" in rec:
                evals[step] = rec
            elif "loss" in rec:
                steps[step] = rec
    if not steps:
        raise UsageError("%s has no step records: was it written by fsdp-train --metrics-file?" % path)
    return steps, evals


def series(records, key, scale=1.0):
    """(x, y) over the records' steps in order, values that are missing, null or
    negative (peak_mem_bytes is -1 where the device cannot tell) left out."""
    xs, ys = [], []
    for step in sorted(records):
        v = number(records[step].get(key))
        if math.isnan(v) or v < 0:
            continue
        xs.append(step)
        ys.append(v / scale)
    return xs, ys


def new_figure(plt, title, ylabel):
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def save(fig, out_dir, name, n):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path)
    print("%s: wrote %s (%d step%s)" % (PROG, path, n, "" if n == 1 else "s"), flush=True)


def plot(steps, evals, label, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = steps[min(steps)]
    world = first.get("world_size")
    subtitle = "%s%s" % (label, ", %s ranks" % world if world else "")

    fig, ax = new_figure(plt, "loss: " + subtitle, "loss")
    xs, ys = series(steps, "loss")
    ax.plot(xs, ys, linewidth=1.2, label="train")
    skipped = [s for s in sorted(steps) if steps[s].get("skipped") is True]
    if skipped:  # dynamic loss scaling: these steps changed no weight
        ax.plot(skipped, [number(steps[s]["loss"]) for s in skipped], "x", color="tab:red",
                label="skipped (overflow)")
    ex, ey = series(evals, "eval_loss")
    if ex:
        ax.plot(ex, ey, "o", color="tab:orange", label="eval")
    ax.legend()
    save(fig, out_dir, "loss.png", len(xs))
    plt.close(fig)

    fig, ax = new_figure(plt, "throughput: " + subtitle, "tokens/s (all ranks)")
    xs, ys = series(steps, "tokens_per_s")
    ax.plot(xs, ys, linewidth=1.2)
    ax.set_ylim(bottom=0)
    save(fig, out_dir, "throughput.png", len(xs))
    plt.close(fig)

    fig, ax = new_figure(plt, "peak memory (rank 0): " + subtitle, "MiB")
    xs, ys = series(steps, "peak_mem_bytes", scale=MIB)
    if xs:
        ax.plot(xs, ys, linewidth=1.2, label="peak memory of the process")
        ux, uy = series(steps, "unsharded_peak_bytes", scale=MIB)
        bx, by = series(steps, "unsharded_bound_bytes", scale=MIB)
        if ux:
            ax.plot(ux, uy, linewidth=1.2, label="unsharded buffers (engine's peak)")
        if bx:
            ax.plot(bx, by, "--", linewidth=1.0, color="tab:gray", label="unsharded buffers (plan's bound)")
        if ux or bx:
            ax.legend()
        ax.set_ylim(bottom=0)
    else:
        ax.text(0.5, 0.5, "peak memory not measured on this device (peak_mem_bytes < 0)",
                ha="center", va="center", transform=ax.transAxes)
    save(fig, out_dir, "memory.png", len(xs))
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="fsdp-train's --metrics-file (JSON lines)")
    parser.add_argument("--out", help="directory for the PNGs (default: the metrics file's)")
    args = parser.parse_args(argv)
    try:
        steps, evals = read_metrics(args.metrics)
        out_dir = args.out if args.out else (os.path.dirname(args.metrics) or ".")
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise UsageError("--out %s: cannot create the directory (%s)" % (out_dir, e.strerror))
        plot(steps, evals, os.path.basename(args.metrics), out_dir)
    except UsageError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

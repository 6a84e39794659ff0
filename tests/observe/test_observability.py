#!/usr/bin/env python3
"""What fsdp-train tells you about a run, read back by the tools people read it with.

One small run (the tiny model, 2 local ranks, 6 steps) with everything on, a
simulated crash, and a resume to step 9; then the configuration-file flags on
their own. Checks (each prints one summary line; the test fails if any fails):

  runs         both runs exit 0 within their time limit
  console      'Batch N Loss: X, Speed: Y samples/sec, lr: Z' once per step (the
               familiar prefix scripts grep), followed by tokens/s, grad norm and
               ETA; a 'Run summary' line that names the checkpoint directory
  metrics      --metrics-file: each step 0..8 once after the resume, although the
               crashed run left a step-7 record behind (Note [Metrics after a
               resume], src/train/run_state.cpp); every field of a step record;
               the engine's unsharded-buffer peak within [0.9, 1] x the plan's
               bound at every step (the memory contract, as the trainer logs it)
  tensorboard  --tensorboard: the event files read back by TensorBoard's own
               EventAccumulator; every tag, train/* at steps 0..8 once, each value
               the metrics file's within float32 rounding, the crashed run's
               step-7 point gone (Note [TensorBoard after a resume] in
               src/train/tensorboard.h: a resumed run's file starts with a
               SessionLog START at the resumed step, and the file sorts after
               the earlier ones; this test also starts the resume in a later
               second, wait_for_a_later_second)
"""

import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import traceback

RUN_TIMEOUT_S = 120       # each training run (each takes a few seconds)
QUICK_TIMEOUT_S = 60      # --print-config and refused configurations
FIRST_STEPS, ALL_STEPS = 6, 9
PROFILE = (2, 4)          # --profile-steps 2:4 traces steps 2 and 3
FAKE_STEP, FAKE_LOSS = 7, 99.0  # what the crashed run logged after its last checkpoint (step 6)
# TensorBoard scalar tag -> metrics file key. Values are float32 in the event
# file, doubles in the metrics file: equal within float32 rounding (2^-24 relative).
TRAIN_TAGS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
              "train/tokens_per_s": "tokens_per_s", "train/samples_per_s": "samples_per_s",
              "train/step_time_s": "step_time_s", "train/peak_mem_bytes": "peak_mem_bytes",
              "train/unsharded_peak_bytes": "unsharded_peak_bytes"}
FLOAT32_REL = 1e-6
STEP_KEYS = ["step", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "step_time_s", "peak_mem_bytes",
             "unsharded_peak_bytes", "unsharded_bound_bytes", "allgather_bytes", "reduce_scatter_bytes", "allreduce_bytes", "world_size"]
BATCH_LINE = re.compile(r"Batch (\d+) Loss: [0-9.]+, Speed: [0-9.]+ samples/sec, lr: [0-9.]+")


# ---------------------------------------------------------------------------
# Checks: each collects its failures under its name; one summary line each.

class Check:
    """`with Check("name") as c: c.expect(cond, msg)`. Several blocks may share
    a name (a check made before and after the resume). An exception inside a
    block is one more failure of that check, and the test goes on."""
    all = {}  # name -> [failure messages], in the order first used

    def __init__(self, name):
        self.name = name
        self.failures = Check.all.setdefault(name, [])
        self.before = len(self.failures)
        self.notes = []

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            here = [f for f in traceback.extract_tb(tb) if f.filename == __file__]
            self.fail("raised %s: %s (%s line %d)" % (kind.__name__, value, os.path.basename(__file__),
                                                       here[-1].lineno if here else 0))
        if len(self.failures) == self.before:
            for note in self.notes:
                print("[%s] %s" % (self.name, note), flush=True)
        return True

    def note(self, msg):
        """What was seen, printed when the block passed."""
        self.notes.append(msg)

    def fail(self, msg):
        self.failures.append(msg)
        print("FAIL [%s]: %s" % (self.name, msg), flush=True)

    def expect(self, cond, msg):
        if not cond:
            self.fail(msg)
        return cond


class Run:
    def __init__(self, cmd, rc, out, err, seconds):
        self.cmd, self.rc, self.out, self.err, self.seconds = cmd, rc, out, err, seconds

    def describe(self):
        return "%s\n--- stdout (tail) ---\n%s\n--- stderr (tail) ---\n%s" % (
            " ".join(self.cmd), self.out[-3000:], self.err[-3000:])


def run(cmd, timeout):
    """Runs cmd in a process group of its own: past `timeout` the group is
    killed (the launcher's workers die with it: PR_SET_PDEATHSIG) and the Run's
    rc is None."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return Run(cmd, p.returncode, out, err, time.time() - t0)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Run(cmd, None, out, err, time.time() - t0)


def expect_exit(c, r, rc, what):
    if r.rc is None:
        return c.fail("%s did not finish within its time limit (%.0f s):\n%s" % (what, r.seconds, r.describe()))
    return c.expect(r.rc == rc, "%s exited %s (expected %d):\n%s" % (what, r.rc, rc, r.describe()))


def close(a, b, rel=FLOAT32_REL):
    if a is None or b is None:
        return a is None and b is None
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def step_records(records):
    return [r for r in records if isinstance(r, dict) and "step" in r and "eval_loss" not in r]


def eval_records(records):
    return [r for r in records if isinstance(r, dict) and "eval_loss" in r and "step" in r]


def counts(values):
    out = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def find_key(table, key):
    """Every value of `key` in a parsed TOML document, at any depth (CLI11 may
    write option groups as tables)."""
    found = []
    for k, v in table.items():
        if k == key:
            found.append(v)
        elif isinstance(v, dict):
            found.extend(find_key(v, key))
    return found


def expect_key(c, table, key, want, label):
    values = find_key(table, key)
    if not c.expect(len(values) == 1, "%s: key '%s' found %d times (expected once)" % (label, key, len(values))):
        return
    v = values[0]
    if isinstance(want, float):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isclose(v, want, rel_tol=1e-12)
    else:
        ok = v == want and type(v) is type(want)
    c.expect(ok, "%s: %s = %r (%s), expected %r" % (label, key, v, type(v).__name__, want))


def event_files(tb_dir):
    return sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))


# ---------------------------------------------------------------------------
# The runs

def train_command(a, max_steps, profile):
    w = a.work
    cmd = [a.train, "--model", "tiny", "--data", os.path.join(a.source, "data", "fallback_corpus.jsonl"),
           "--val-data", os.path.join(a.source, "data", "fallback_corpus.val.jsonl"),
           "--seq-len", "32", "--batch-size", "2", "--nproc-per-node", "2", "--log-every", "1",
           "--eval-every", "3", "--eval-windows", "4",
           "--metrics-file", os.path.join(w, "metrics.jsonl"), "--tensorboard", os.path.join(w, "tb"),
           "--checkpoint-dir", os.path.join(w, "ckpt"), "--checkpoint-every", "3",
           "--max-steps", str(max_steps)]
    if profile:
        cmd += ["--profile-steps", "%d:%d" % PROFILE, "--profile-file", os.path.join(w, "trace.json")]
    else:
        cmd += ["--resume"]
    return cmd


def simulate_crash(a):
    """What a run killed after step 7 (its last checkpoint at 6) leaves behind:
    a step-7 record in the metrics file and a step-7 point in its event file."""
    path = os.path.join(a.work, "metrics.jsonl")
    if not os.path.isfile(path):
        return  # the first run failed: already reported
    with Check("metrics"):
        steps = step_records(read_jsonl(path))
        fake = dict(steps[-1]) if steps else {k: 0 for k in STEP_KEYS}
        fake.update(step=FAKE_STEP, loss=FAKE_LOSS)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fake) + "\n")
    with Check("tensorboard"):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
        files = event_files(os.path.join(a.work, "tb"))
        if len(files) == 1:  # otherwise check_tensorboard reported it
            event = Event(wall_time=time.time(), step=FAKE_STEP,
                          summary=Summary(value=[Summary.Value(tag="train/loss", simple_value=FAKE_LOSS)]))
            with open(files[-1], "ab") as f:
                RecordWriter(f).write(event.SerializeToString())


def wait_for_a_later_second(a):
    """See Note [TensorBoard after a resume]: the resumed run's event file must
    sort after the first run's."""
    files = event_files(os.path.join(a.work, "tb"))
    m = re.match(r"events\.out\.tfevents\.(\d+)\.", os.path.basename(files[-1])) if files else None
    deadline = time.time() + 2  # a file stamped in the future (clock steps) must not hang the test
    while m and time.time() < min(int(m.group(1)) + 1, deadline):
        time.sleep(0.05)


# ---------------------------------------------------------------------------
# What the runs wrote

def check_console(a, first, resumed):
    with Check("console") as c:
        for r, steps in ((first, range(FIRST_STEPS)), (resumed, range(FIRST_STEPS, ALL_STEPS))):
            label = "run to step %d" % (steps.stop)
            lines = [line for line in r.out.splitlines() if BATCH_LINE.search(line)]
            seen = counts(int(BATCH_LINE.search(line).group(1)) for line in lines)
            if not c.expect(seen == {s: 1 for s in steps},
                            "%s: 'Batch N Loss: X, Speed: Y samples/sec, lr: Z' lines for steps %s (expected %s once "
                            "each, --log-every 1)%s" % (label, seen, list(steps),
                                                       "; stderr has %d such lines" % len(
                                                           [x for x in r.err.splitlines() if BATCH_LINE.search(x)])
                                                       if not lines else "")):
                continue
            for field in ("tokens/s", "grad norm", "unsharded", "ETA"):
                missing = [line for line in lines if field not in line[BATCH_LINE.search(line).end():]]
                c.expect(not missing, "%s: '%s' missing after the familiar prefix in %d Batch line(s), e.g. %r" % (
                    label, field, len(missing), missing[0] if missing else ""))
            summary = [line for line in r.out.splitlines() if "Run summary" in line]
            ckpt = os.path.join(a.work, "ckpt")
            if c.expect(len(summary) == 1, "%s: %d 'Run summary' lines on stdout (expected 1)" % (label, len(summary))):
                c.expect(ckpt in summary[0], "%s: the Run summary does not name the checkpoint directory %s: %r" % (
                    label, ckpt, summary[0]))
        c.note("Batch lines with tokens/s, grad norm, unsharded (plan), ETA; e.g. %r" % next(
            (x for x in first.out.splitlines() if BATCH_LINE.search(x)), ""))


def check_metrics(a, phase):
    path = os.path.join(a.work, "metrics.jsonl")
    with Check("metrics") as c:
        records = read_jsonl(path)
        steps, evals = step_records(records), eval_records(records)
        last = FIRST_STEPS if phase == "first" else ALL_STEPS
        seen = counts(r["step"] for r in steps)
        c.expect(seen == {s: 1 for s in range(last)}, "%s, after the %s run: step records %s, expected steps "
                 "0..%d once each" % (path, phase, seen, last - 1))
        for r in steps:
            missing = [k for k in STEP_KEYS if k not in r]
            c.expect(not missing, "step %s's record lacks %s: %s" % (r.get("step"), missing, r))
            c.expect(r.get("world_size") == 2, "step %s: world_size %s, expected 2" % (
                r.get("step"), r.get("world_size")))
            for k in ("allgather_bytes", "reduce_scatter_bytes"):  # FULL_SHARD at 2 ranks moves bytes every step
                c.expect(isinstance(r.get(k), int) and r[k] > 0, "step %s: %s = %r, expected > 0" % (
                    r.get("step"), k, r.get(k)))
            # The memory contract (tests/fsdp/test_memory_contract.cpp) as the trainer logs it: the engine's
            # unsharded buffers held at once, within the plan's bound, which this FULL_SHARD run reaches.
            peak, bound = r.get("unsharded_peak_bytes"), r.get("unsharded_bound_bytes")
            c.expect(isinstance(peak, int) and isinstance(bound, int) and 0.9 * bound <= peak <= bound,
                     "step %s: unsharded_peak_bytes %r not within [0.9, 1] x unsharded_bound_bytes %r" % (
                         r.get("step"), peak, bound))
        if phase == "resumed":
            sevens = [r for r in steps if r["step"] == FAKE_STEP]
            c.expect(len(sevens) == 1 and sevens[0]["loss"] != FAKE_LOSS,
                     "the crashed run's step-%d record (loss %g) survived the resume: %s" % (
                         FAKE_STEP, FAKE_LOSS, sevens))
        eval_seen = counts(r["step"] for r in evals)
        want = {3, FIRST_STEPS} if phase == "first" else {3, ALL_STEPS}
        c.expect(want <= set(eval_seen) and all(n == 1 for n in eval_seen.values()),
                 "after the %s run: eval records at steps %s, expected %s among them, each once" % (
                     phase, eval_seen, sorted(want)))
        c.note("after the %s run: %d step records (steps %s), evaluations at %s" % (
            phase, len(steps), sorted(seen), sorted(eval_seen)))
        return records


def read_scalars(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})  # 0: keep every point; purge_orphaned_data=True
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_tensorboard(a, phase):
    tb_dir = os.path.join(a.work, "tb")
    with Check("tensorboard") as c:
        files = event_files(tb_dir)
        want_files = 1 if phase == "first" else 2
        c.expect(len(files) == want_files, "after the %s run: %d event files in %s (expected %d): %s" % (
            phase, len(files), tb_dir, want_files, [os.path.basename(f) for f in files]))
        if not os.path.isdir(tb_dir):
            return c.fail("after the %s run: --tensorboard %s was not created" % (phase, tb_dir))
        scalars = read_scalars(tb_dir)
        missing = sorted((set(TRAIN_TAGS) | {"eval/loss"}) - set(scalars))
        c.expect(not missing, "after the %s run: tags %s missing (found %s)" % (phase, missing, sorted(scalars)))
        records = read_jsonl(os.path.join(a.work, "metrics.jsonl"))
        if phase == "first":  # the crash is simulated after this
            records = [r for r in records if not (r.get("step") == FAKE_STEP and r.get("loss") == FAKE_LOSS)]
        by_step = {r["step"]: r for r in step_records(records)}
        last = FIRST_STEPS if phase == "first" else ALL_STEPS
        for tag, key in TRAIN_TAGS.items():
            points = scalars.get(tag, [])
            seen = counts(s for s, _ in points)
            if not c.expect(seen == {s: 1 for s in range(last)},
                            "after the %s run: %s at steps %s, expected 0..%d once each%s" % (
                                phase, tag, seen, last - 1,
                                " (the crashed run's step %d was not purged: is the resumed file's first event a "
                                "SessionLog START, Event field 7?)" % FAKE_STEP if seen.get(FAKE_STEP, 0) > 1 else "")):
                continue
            bad = [(s, v, by_step.get(s, {}).get(key)) for s, v in points if not close(v, by_step.get(s, {}).get(key))]
            c.expect(not bad, "%s: %d value(s) differ from the metrics file's %s beyond float32 rounding "
                     "(step, TensorBoard, metrics): %s" % (tag, len(bad), key, bad[:4]))
        evals = {r["step"]: r["eval_loss"] for r in eval_records(records)}
        points = scalars.get("eval/loss", [])
        c.expect(sorted(s for s, _ in points) == sorted(evals),
                 "after the %s run: eval/loss at steps %s, the metrics file's evaluations at %s" % (
                     phase, [s for s, _ in points], sorted(evals)))
        bad = [(s, v, evals.get(s)) for s, v in points if not close(v, evals.get(s))]
        c.expect(not bad, "eval/loss differs from the metrics file's eval_loss (step, TensorBoard, metrics): %s" % bad)
        c.note("after the %s run: %d event files, tags %s; train/loss at steps %s; eval/loss at %s" % (
            phase, len(files), sorted(scalars), [s for s, _ in scalars.get("train/loss", [])],
            [s for s, _ in points]))


def print_config(a, config_file, extra=()):
    return run([a.train, "--config", config_file, *extra, "--print-config"], QUICK_TIMEOUT_S)


def check_effective_config(a, phase):
    metrics_toml = os.path.join(a.work, "metrics.config.toml")
    tb_toml = os.path.join(a.work, "tb", "config.toml")
    max_steps = FIRST_STEPS if phase == "first" else ALL_STEPS
    with Check("config") as c:
        texts = {}
        for path in (metrics_toml, tb_toml):
            if not c.expect(os.path.isfile(path), "after the %s run: %s was not written" % (phase, path)):
                continue
            with open(path, "rb") as f:
                texts[path] = f.read()
            try:
                table = tomllib.loads(texts[path].decode("utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
                c.fail("%s is not TOML (%s):\n%s" % (path, e, texts[path][:2000].decode(errors="replace")))
                continue
            expect_key(c, table, "max-steps", max_steps, path)
            expect_key(c, table, "seq-len", 32, path)
            expect_key(c, table, "model", "tiny", path)
            if phase == "resumed":
                expect_key(c, table, "resume", True, path)
            c.expect(not find_key(table, "print-config"), "%s holds print-config: used as --config, it would "
                     "print instead of train" % path)
        if len(texts) == 2:
            c.expect(texts[metrics_toml] == texts[tb_toml], "%s and %s differ" % (metrics_toml, tb_toml))
        if phase == "resumed" and metrics_toml in texts:
            # "use it with --config": the same configuration comes back.
            r = print_config(a, metrics_toml)
            if expect_exit(c, r, 0, "--config %s --print-config" % metrics_toml):
                again = without_config_key(tomllib.loads(r.out))
                c.expect(again == without_config_key(tomllib.loads(texts[metrics_toml].decode())),
                         "--config %s --print-config prints another configuration:\n%s" % (metrics_toml, r.out))
        c.note("after the %s run: %s and %s with max-steps = %d" % (phase, metrics_toml, tb_toml, max_steps))


def without_config_key(table):
    return {k: (without_config_key(v) if isinstance(v, dict) else v) for k, v in table.items() if k != "config"}


def check_config_file(a):
    with Check("config-file") as c:
        path = os.path.join(a.work, "options.toml")
        with open(path, "w") as f:
            f.write('# fsdp-train options\nmodel = "tiny"\nseq-len = 16\nbatch-size = 3\nmax-steps = 2\nlr = 0.001\n')
        r = print_config(a, path, ["--lr", "0.002"])
        if expect_exit(c, r, 0, "--config %s --lr 0.002 --print-config" % path):
            c.expect(not BATCH_LINE.search(r.out), "--print-config trained:\n" + r.describe())
            try:
                table = tomllib.loads(r.out)
            except tomllib.TOMLDecodeError as e:
                table = None
                c.fail("--print-config's stdout is not TOML (%s):\n%s" % (e, r.out[:3000]))
            if table is not None:
                label = "--print-config of %s with --lr 0.002" % path
                expect_key(c, table, "model", "tiny", label)
                expect_key(c, table, "seq-len", 16, label)
                expect_key(c, table, "batch-size", 3, label)
                expect_key(c, table, "max-steps", 2, label)
                expect_key(c, table, "lr", 0.002, label)  # the command line wins over the file
                printed = os.path.join(a.work, "printed.toml")
                with open(printed, "w") as f:
                    f.write(r.out)
                r2 = print_config(a, printed)
                if expect_exit(c, r2, 0, "--config %s --print-config (the printed configuration read back)" % printed):
                    c.expect(without_config_key(tomllib.loads(r2.out)) == without_config_key(table),
                             "the printed configuration read back with --config prints another:\n%s" % r2.out)
        bad = os.path.join(a.work, "bad.toml")
        with open(bad, "w") as f:
            f.write("no-such-flag = 1\n")
        r = print_config(a, bad)
        if expect_exit(c, r, 2, "--config %s (a key that names no flag)" % bad):
            c.expect("no-such-flag" in r.err, "--config %s: stderr does not name the key no-such-flag:\n%s" % (
                bad, r.describe()))
        missing = os.path.join(a.work, "no-such-dir", "options.toml")
        r = print_config(a, missing)
        if expect_exit(c, r, 2, "--config %s (no such file)" % missing):
            c.expect(missing in r.out + r.err, "--config %s: the error does not name the path:\n%s" % (
                missing, r.describe()))
        c.note("--config with a command-line override, --print-config read back, unknown key and "
              "missing file refused")


def check_profile(a, first, resumed):
    path = os.path.join(a.work, "trace.json")
    traced = list(range(*PROFILE))
    with Check("profile") as c:
        lines = [line for line in first.out.splitlines() if "Profile step" in line]
        seen = counts(int(m.group(1)) for m in (re.search(r"Profile step (\d+):", x) for x in lines) if m)
        c.expect(seen == {s: 1 for s in traced}, "'Profile step N:' lines for steps %s, expected %s once each" % (
            seen, traced))
        c.expect(all("exposed" in x for x in lines), "a 'Profile step' line without 'exposed': %s" % lines)
        wrote = [x for x in first.out.splitlines() if "Wrote trace" in x]
        c.expect(len(wrote) == 1 and path in wrote[0], "expected one 'Wrote trace ... %s' line, got %s" % (path, wrote))
        c.expect("Profile step" not in resumed.out, "the resumed run (no --profile-steps) printed Profile lines")
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        c.expect(isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list),
                 "%s: not {\"traceEvents\": [...]}" % path)
        c.expect(trace.get("displayTimeUnit") == "ms", "%s: displayTimeUnit %r" % (path, trace.get("displayTimeUnit")))
        events = trace.get("traceEvents", [])
        spans = [e for e in events if e.get("ph") == "X"]
        meta = [e for e in events if e.get("ph") == "M"]
        malformed = [e for e in spans if not (isinstance(e.get("name"), str) and isinstance(e.get("cat"), str)
                                              and isinstance(e.get("ts"), (int, float))
                                              and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0
                                              and isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int)
                                              and isinstance(e.get("args"), dict))]
        c.expect(not malformed, "%d X events lack name/cat/ts/dur >= 0/pid/tid/args, e.g. %s" % (
            len(malformed), malformed[:2]))
        pids = sorted({e.get("pid") for e in spans})
        c.expect(pids == [0, 1], "X events of pids %s, expected ranks [0, 1]" % pids)
        cats = {e.get("cat") for e in spans}
        c.expect({"comm", "compute", "optim", "data", "step"} <= cats, "categories %s lack %s" % (
            sorted(cats), sorted({"comm", "compute", "optim", "data", "step"} - cats)))
        for pid in (0, 1):
            mine = [e for e in spans if e.get("pid") == pid]
            for name, cat in (("all_gather", "comm"), ("reduce_scatter", "comm")):
                moved = [e for e in mine if e.get("name") == name and e.get("cat") == cat
                         and isinstance(e.get("args", {}).get("bytes"), int) and e["args"]["bytes"] > 0]
                c.expect(moved, "rank %d: no '%s' event (cat %s) with args.bytes > 0" % (pid, name, cat))
            for name, cat in (("forward", "compute"), ("backward", "compute"), ("optimizer", "optim")):
                c.expect(any(e.get("name") == name and e.get("cat") == cat for e in mine),
                         "rank %d: no '%s' event (cat %s)" % (pid, name, cat))
            steps = sorted((e for e in mine if e.get("name") == "step" and e.get("cat") == "step"),
                           key=lambda e: e.get("ts", 0))
            numbers = [e.get("args", {}).get("step") for e in steps]
            if c.expect(numbers == traced, "rank %d: 'step' events for steps %s, expected %s" % (pid, numbers, traced)):
                c.expect(steps[1]["ts"] >= steps[0]["ts"] + steps[0]["dur"],
                         "rank %d: step %d starts before step %d ends" % (pid, traced[1], traced[0]))
            names = [e for e in meta if e.get("pid") == pid and e.get("name") == "process_name"]
            c.expect(len(names) == 1 and names[0].get("args", {}).get("name") == "rank %d" % pid,
                     "rank %d: process_name metadata %s, expected one named 'rank %d'" % (pid, names, pid))
            c.expect(any(e.get("pid") == pid and e.get("name") == "thread_name"
                         and isinstance(e.get("args", {}).get("name"), str) for e in meta),
                     "rank %d: no thread_name metadata" % pid)
        c.note("%s: %d spans of ranks %s, categories %s; %s" % (
            path, len(spans), pids, sorted(cats), "; ".join(x.strip() for x in lines)))


def check_plots(a):
    out_dir = os.path.join(a.work, "plots")
    script = os.path.join(a.source, "scripts", "plot_metrics.py")
    with Check("plots") as c:
        r = run([sys.executable, script, os.path.join(a.work, "metrics.jsonl"), "--out", out_dir], QUICK_TIMEOUT_S)
        if not expect_exit(c, r, 0, "plot_metrics.py"):
            return
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.image
        for name in ("loss.png", "throughput.png", "memory.png"):
            path = os.path.join(out_dir, name)
            if not c.expect(os.path.isfile(path), "%s was not written:\n%s" % (path, r.describe())):
                continue
            c.expect("wrote %s (%d steps)" % (path, ALL_STEPS) in r.out,
                     "plot_metrics.py did not report 'wrote %s (%d steps)':\n%s" % (path, ALL_STEPS, r.out))
            shape = matplotlib.image.imread(path).shape
            c.expect(len(shape) >= 2 and shape[0] >= 100 and shape[1] >= 100, "%s: image of shape %s" % (path, shape))
        c.note("%s" % "; ".join(r.out.strip().splitlines()))


# ---------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True, help="the fsdp-train binary")
    parser.add_argument("--source", required=True, help="the source tree (its data/ and scripts/)")
    parser.add_argument("--work", required=True, help="scratch directory (replaced; removed when all passes)")
    parser.add_argument("--keep", action="store_true", help="keep --work even when all passes")
    a = parser.parse_args()
    a.work = os.path.abspath(a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()

    first = run(train_command(a, FIRST_STEPS, profile=True), RUN_TIMEOUT_S)
    with Check("runs") as c:
        expect_exit(c, first, 0, "the first run (steps 0..%d)" % (FIRST_STEPS - 1))
        c.note("first run: exit %s in %.1f s" % (first.rc, first.seconds))
    check_metrics(a, "first")
    check_tensorboard(a, "first")
    check_effective_config(a, "first")
    simulate_crash(a)
    wait_for_a_later_second(a)

    resumed = run(train_command(a, ALL_STEPS, profile=False), RUN_TIMEOUT_S)
    with Check("runs") as c:
        expect_exit(c, resumed, 0, "the resumed run (steps %d..%d)" % (FIRST_STEPS, ALL_STEPS - 1))
        c.note("resumed run: exit %s in %.1f s" % (resumed.rc, resumed.seconds))
    check_console(a, first, resumed)
    check_metrics(a, "resumed")
    check_tensorboard(a, "resumed")
    check_effective_config(a, "resumed")
    check_config_file(a)
    check_profile(a, first, resumed)
    check_plots(a)

    failed = 0
    print("\nSummary (%.1f s):" % (time.time() - t0))
    for name, failures in Check.all.items():
        failed += len(failures)
        print("  %-12s %s" % (name, "ok" if not failures else "FAILED (%d): %s" % (
            len(failures), failures[0].splitlines()[0])))
    if failed:
        print("%d failure(s)" % failed)
        return 1
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

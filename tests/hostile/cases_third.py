"""The third campaign's findings (issue 39), one case or more each, with the command the issue
gives: files written or read outside the one writer and the one reader, the join's deadline and
agreement, the estimate's event replay, the shared-memory sweep, the deploy generators, and the
low findings 11-21. Expectations follow issue 16's rules (cases.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import time
from pathlib import Path

from cases import (FAIL, INSPECT, OK, TRAIN, USAGE, E, _config, _fifo, _files, _merge, _node, _not_said, _says,
                   free_port, wait_until)
from harness import Case, Ctx, Process, Result

# A calibration of the tiny model that takes a second: one measured step of one short sequence.
CALIBRATE = INSPECT + ["--estimate", "--batch-size", "1", "--seq-len", "16", "--calibrate-steps", "1", "--calibrate"]


def _unchanged_link(rel: str, target: str):
    """A symbolic link the user made must still be that link afterwards."""
    def check(ctx: Ctx, r: Result) -> list:
        p = ctx.path(rel)
        if not p.is_symlink() or os.readlink(p) != target.format(d=ctx.d):
            return [("lost data", f"the link {rel} was replaced or changed")]
        return []
    return check


def _absent(*rels):
    def check(ctx: Ctx, r: Result) -> list:
        return [("lost data", f"{rel} was left behind") for rel in rels if os.path.lexists(ctx.path(rel))]
    return check


def _faster_than(seconds: float, why: str):
    def check(ctx: Ctx, r: Result) -> list:
        return [("hang", f"took {r.seconds:.1f} s: {why}")] if r.seconds > seconds else []
    return check


def _all(*checks):
    def check(ctx: Ctx, r: Result) -> list:
        return [b for c in checks for b in c(ctx, r)]
    return check


# --- 1, 6, 7, 21: fsdp-inspect's calibration and cluster files -----------------------------------

def _link_job(ctx: Ctx, case: Case, runner) -> Result:
    """--calibrate-link as documented: one process per node of a 2-process job (RANK, WORLD_SIZE, ...)."""
    port = str(free_port())
    env = lambda rank: {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",  # noqa: E731
                        "MASTER_PORT": port, "FSDP_SHM": "0"}
    a = runner.start(case, ctx, env=env(0), tag=".r0")
    b = runner.start(case, ctx, env=env(1), tag=".r1")
    deadline = time.monotonic() + case.timeout
    ra, rb = a.wait(deadline), b.wait(deadline)
    return _merge(ra, [("rank 1", rb)], [])


def calibration_file_cases() -> list:
    c = "third-files"
    link = ["inspect", "--calibrate-link"]
    cluster = INSPECT + ["--estimate", "--cluster"]
    return [
        # Finding 1: the calibration replaced a device node by a regular file, exit 0.
        Case(c, "calibrate-null-node", CALIBRATE + ["{d}/null"], OK, setup=_node("null"), timeout=60,
             check=_absent("null.tmp")),
        Case(c, "calibrate-link-null-node", link + ["{d}/null", "--calibrate-link-seconds", "0.2"], USAGE,
             setup=_node("null"), driver=_link_job, names=("--calibrate-link",), weight=3, timeout=60),
        # Finding 6: special files read without bound (a FIFO blocked, /dev/zero filled memory).
        Case(c, "cluster-fifo", cluster + ["{d}/c.json"], USAGE, setup=_files(c_DOT_json=_fifo), names=("c.json",)),
        Case(c, "cluster-dev-zero", cluster + ["/dev/zero"], USAGE, names=("/dev/zero",)),
        Case(c, "calibrate-link-fifo", link + ["{d}/c.json"], USAGE, setup=_files(c_DOT_json=_fifo),
             names=("c.json",)),
        Case(c, "calibrate-link-dev-zero", link + ["/dev/zero"], USAGE, names=("/dev/zero",)),
        # Finding 7: a planted FILE.tmp link was followed and its target overwritten.
        Case(c, "calibrate-tmp-is-link", CALIBRATE + ["{d}/cal.json"], OK, timeout=60,
             setup=lambda ctx: (ctx.plant("notes.txt"), os.symlink(ctx.path("notes.txt"), ctx.path("cal.json.tmp"))),
             check=_unchanged_link("cal.json.tmp", "{d}/notes.txt")),
        # Finding 21: a missing directory was found only after measuring, leaving a .tmp behind.
        Case(c, "calibrate-into-missing-directory", CALIBRATE + ["{d}/nodir/cal.json"], USAGE,
             names=("nodir",), check=_all(_absent("nodir"), _not_said("calibrating:"))),
    ]


# --- 2, 14: fsdp-train's configuration copies and its records --------------------------------

MY_CONFIG = "# my experiment, by hand\nseed = 7  # the lucky one\n"


def config_copy_cases() -> list:
    c = "third-files"
    copy_of = lambda rel: lambda ctx, r: (  # noqa: E731
        [] if ctx.path(rel).read_text().startswith("# fsdp-train's effective configuration")
        else [("wrong exit", f"{rel} is not the run's configuration")])
    return [
        # Finding 2: the --config file itself was the metrics file's copy and was rewritten.
        Case(c, "config-copy-is-the-config-file",
             TRAIN + ["--config", "{d}/exp.config.toml", "--metrics-file", "{d}/exp.jsonl"], OK,
             setup=lambda ctx: ctx.plant("exp.config.toml", MY_CONFIG), check=_says("exp.config.toml")),
        Case(c, "config-copy-is-a-user-file", TRAIN + ["--metrics-file", "{d}/run.jsonl"], OK,
             setup=lambda ctx: ctx.plant("run.config.toml", MY_CONFIG), check=_says("run.config.toml")),
        Case(c, "tensorboard-config-is-a-user-file", TRAIN + ["--tensorboard", "{d}/tb"], OK,
             setup=lambda ctx: ctx.plant("tb/config.toml", MY_CONFIG), check=_says("config.toml")),
        # What the program wrote before is its own: replaced by this run's.
        Case(c, "config-copy-of-an-earlier-run", TRAIN + ["--metrics-file", "{d}/run.jsonl"], OK,
             setup=lambda ctx: ctx.write("run.config.toml", "# fsdp-train's effective configuration (old)\n"),
             check=copy_of("run.config.toml")),
        # Finding 14: --metrics-file and --profile-file on one path lost the metrics in silence.
        Case(c, "metrics-and-profile-one-file",
             TRAIN + ["--metrics-file", "{d}/m.json", "--profile-steps", "0:1", "--profile-file", "{d}/m.json"], USAGE,
             names=("--profile-file",)),
        Case(c, "metrics-file-is-the-config-file",
             TRAIN + ["--config", "{d}/run.toml", "--metrics-file", "{d}/run.toml"], USAGE,
             setup=lambda ctx: ctx.plant("run.toml", MY_CONFIG), names=("--metrics-file",)),
    ]


# --- 3: the estimate's event replay --------------------------------------------------------------

def _calibration_file(seconds: float):
    def setup(ctx: Ctx) -> None:
        units = {name: {"forward_s": seconds, "backward_s": seconds} for name in
                 ["", "model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head"]}
        ctx.write("cluster.json", json.dumps({
            "name": "calibrated", "procs_per_node": 1, "inter": {"gbit_per_s": 10, "latency_us": 10},
            "algorithm": "mesh", "execution": "host", "peak_tflops": None, "compute_efficiency": 0.5,
            "calibration": {"model": "tiny", "batch_size": 8, "seq_len": 256, "mixed_precision": "fp32",
                            "activation_checkpointing": False, "units": units}}))
    return setup


def estimate_cases() -> list:
    c = "third-estimate"
    est = lambda model: ["inspect", "--model", model, "--estimate", "--cluster", "h100", "--nnodes", "2"]  # noqa: E731
    return [
        # Finding 3: past ~8000 s of simulated time the replay never returned.
        Case(c, "70b-2-nodes-0.1-gbps", est("llama3.1-70b") + ["--inter-node-gbps", "0.1"], OK, timeout=60),
        Case(c, "8b-2-nodes-0.01-gbps", est("llama3.1-8b") + ["--inter-node-gbps", "0.01"], OK, timeout=60),
        Case(c, "latency-1e308-us", est("llama3.1-8b") + ["--inter-node-latency-us", "1e308"], USAGE,
             names=("--inter-node-latency-us",)),
        Case(c, "grad-accum-2^30", est("llama3.1-8b") + ["--grad-accum", str(2**30)], USAGE, names=("--grad-accum",)),
        Case(c, "calibrated-unit-1e308-s", INSPECT + ["--estimate", "--cluster", "{d}/cluster.json", "--nnodes", "2"],
             USAGE, setup=_calibration_file(1e308), names=("forward_s",)),
        Case(c, "cluster-file-latency-1e308-us", INSPECT + ["--estimate", "--cluster", "{d}/cluster.json"], USAGE,
             setup=lambda ctx: ctx.write("cluster.json", json.dumps({"inter": {"gbit_per_s": 1, "latency_us": 1e308}})),
             names=("latency_us",)),
    ]


# --- 4, 10, 17: joining a multi-node job ---------------------------------------------------------

def _two_launchers(node0: list, node1: list):
    """Two fsdp-train launchers of one job on this host, node 0 and node 1 (each adds its flags)."""
    def driver(ctx: Ctx, case: Case, runner) -> Result:
        port = str(free_port())
        common = case.argv + ["--master-addr", "127.0.0.1", "--master-port", port, "--timeout", "20"]
        a = runner.start(case, ctx, common + ["--node-rank", "0"] + node0, tag=".n0")
        b = runner.start(case, ctx, common + ["--node-rank", "1"] + node1, tag=".n1")
        deadline = time.monotonic() + case.timeout
        ra, rb = a.wait(deadline), b.wait(deadline)
        ctx.other = rb
        return _merge(ra, [("node 1", rb)], [])
    return driver


def _both_named(flag: str, x: str, y: str):
    """Both nodes refused, and the message names the flag with both values."""
    def check(ctx: Ctx, r: Result) -> list:
        bad = []
        other = getattr(ctx, "other", None)
        if other is not None and other.code not in (1, 2):
            bad.append(("wrong exit", f"node 1 exited {other.code}, expected 1 or 2"))
        text = "\n".join(l for l in r.stderr.splitlines() if flag in l)
        if not (re.search(rf"\b{x}\b", text) and re.search(rf"\b{y}\b", text)):
            bad.append(("unclear", f"no message names {flag} with both {x} and {y}"))
        return bad
    return check


def _ported(extra: list):
    def driver(ctx: Ctx, case: Case, runner) -> Result:
        proc = runner.start(case, ctx, case.argv + extra + ["--master-port", str(free_port())])
        return proc.wait(proc.start + case.timeout)
    return driver


def join_cases() -> list:
    c = "third-join"
    return [
        # Finding 4: node 0 with another host's address waited forever, silent.
        Case(c, "node-0-master-addr-not-here",
             TRAIN + ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1", "--timeout", "10"], USAGE,
             driver=_ported([]), names=("--master-addr",), check=_faster_than(15, "node 0 waited"), weight=2),
        # Finding 4: node 1 without a master said "within 10000 ms" after 23-36 s.
        Case(c, "node-1-no-master",
             TRAIN + ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--timeout", "3"], FAIL,
             driver=_ported([]), names=("within 3 s",), check=_faster_than(9, "past --timeout 3 s"), needs=("timeout",),
             weight=3),
        # Finding 10: launchers with different --nnodes both waited out the timeout, unnamed.
        Case(c, "nnodes-mismatch", TRAIN, E(1, 2), driver=_two_launchers(["--nnodes", "2"], ["--nnodes", "3"]),
             names=("--nnodes",), check=_both_named("--nnodes", "2", "3"), needs=("timeout",), weight=6, timeout=60),
        # Finding 17: nodes with different --max-steps were not checked.
        Case(c, "max-steps-mismatch", TRAIN + ["--nnodes", "2"], E(1, 2),
             driver=_two_launchers(["--max-steps", "1"], ["--max-steps", "3"]), names=("--max-steps",),
             check=_both_named("--max-steps", "1", "3"), needs=("timeout",), weight=6, timeout=60),
    ]


# --- 5: the shared-memory sweep --------------------------------------------------------------------

SHM = Path("/dev/shm")


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _shm_setup(ctx: Ctx) -> None:
    """Names a sweep must leave alone, and one it must remove (a dead creator's, in our namespace)."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    dead = _dead_pid()
    tag = f"{random.getrandbits(60):015x}"
    names = {
        "not-a-pid": f"fsdp-cpp.notapid.{tag}",
        "other-namespace": f"fsdp-cpp.{dead}.{ns + 1}.1{tag}",
        "other-user": f"fsdp-cpp.{dead}.{ns}.2{tag}",
        "link": f"fsdp-cpp.{dead}.{ns}.3{tag}",
        "stale": f"fsdp-cpp.{dead}.{ns}.4{tag}",
    }
    for what, name in names.items():
        p = SHM / name
        if what == "link":
            os.symlink(ctx.plant("linked.txt"), p)
        else:
            p.write_bytes(b"a segment's bytes\n")
            if what == "other-user":
                os.chown(p, 65534, 65534)
    ctx.shm = names


def _shm_check(ctx: Ctx, r: Result) -> list:
    bad = []
    names = getattr(ctx, "shm", {})
    for what, name in names.items():
        there = os.path.lexists(SHM / name)
        if what != "stale" and not there:
            bad.append(("lost data", f"/dev/shm/{name} ({what}) was removed by the sweep"))
        if what == "stale" and there and r.code == 0:
            bad.append(("wrong exit", f"/dev/shm/{name}, a dead creator's segment, was not swept"))
        if there:
            os.unlink(SHM / name)
    return bad


def shm_cases() -> list:
    # Finding 5: the sweep removed any fsdp-cpp.<x>.* whose <x> was not a live pid.
    return [Case("third-shm", "sweep-only-stale-segments", TRAIN + ["--nproc-per-node", "2"], OK, setup=_shm_setup,
                 check=_shm_check, weight=5, timeout=90)]


# --- 8, 18, 19, 20: deploy/kubernetes/generate.py ------------------------------------------------

GEN = ["generate", "--image", "registry/fsdp-cpp:1", "--nodes", "2"]


def _manifests_hold(env_name: str, env_value: str):
    """The manifests parse to the intended objects only (no key added by an escaped value) and keep the value."""
    def check(ctx: Ctx, r: Result) -> list:
        import yaml
        if r.code != 0:
            return []
        bad = []
        for f in sorted(ctx.path("out").glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if doc is not None and sorted(doc) != ["apiVersion", "kind", "metadata", "spec"]:
                    bad.append(("wrong exit", f"{f.name} has top-level keys {sorted(doc)}"))
        job = yaml.safe_load(ctx.path("out/pytorchjob.yaml").read_text())
        env = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
        if {e["name"]: e["value"] for e in env}.get(env_name) != env_value:
            bad.append(("wrong exit", f"--env {env_name} did not keep its value"))
        return bad
    return check


def _lines_on_stderr(n: int):
    def check(ctx: Ctx, r: Result) -> list:
        k = len([l for l in r.stderr.splitlines() if l.strip()])
        return [("unclear", f"{k} lines on stderr, expected {n}")] if k > n else []
    return check


def generator_cases() -> list:
    c = "third-generate"
    out = ["--output-dir", "{d}/out"]
    cases = []
    # Finding 8: a CR, U+2028 or U+0085 in --env ended the '# generated by:' comment and added YAML keys.
    for name, value in (("cr", "1\rinjected: true"), ("crlf", "1\r\ninjected: true"),
                        ("line-separator", "1\u2028injected: true"), ("next-line", "1\u0085injected: true"),
                        ("paragraph-separator", "1\u2029injected: true")):
        cases.append(Case(c, f"env-value-{name}", GEN + ["--env", f"X={value}"] + out, OK,
                          check=_manifests_hold("X", value)))
    cases += [
        Case(c, "env-value-not-utf8", GEN + ["--env", "X=\udcff"] + out, USAGE, names=("UTF-8",)),
        # Finding 18: '$' matched before a trailing newline.
        Case(c, "shm-size-trailing-newline", GEN + ["--shm-size", "64Gi\n"] + out, USAGE, names=("--shm-size",)),
        Case(c, "job-name-trailing-newline", GEN + ["--job-name", "job\n"] + out, USAGE, names=("--job-name",)),
        Case(c, "nodes-trailing-newline", GEN + ["--nodes", "2\n"] + out, USAGE, names=("--nodes",)),
        Case(c, "create-pvc-trailing-newline", GEN + ["--create-pvc", "10Gi\n"] + out, USAGE,
             names=("--create-pvc",)),
        # Finding 19: output-directory errors ended in tracebacks.
        Case(c, "output-dir-is-a-file", GEN + out, USAGE, setup=lambda ctx: ctx.plant("out"), names=("--output-dir",)),
        Case(c, "output-dir-under-proc", GEN + ["--output-dir", "/proc/self/nope"], E(1, 2), names=("--output-dir",)),
        Case(c, "output-file-is-a-directory", GEN + out, USAGE,
             setup=lambda ctx: ctx.path("out/etcd.yaml").mkdir(parents=True), names=("etcd.yaml",)),
        # Finding 20: a usage error printed 21 lines before the error.
        Case(c, "no-arguments", ["generate"], USAGE, names=("--image",), check=_lines_on_stderr(1)),
        Case(c, "unknown-flag", GEN + ["--bogus"], USAGE, names=("--bogus",), check=_lines_on_stderr(1)),
        Case(c, "nodes-text", GEN + ["--nodes", "many"], USAGE, names=("--nodes",), check=_lines_on_stderr(1)),
    ]
    return cases


# --- 9: deploy/slurm/fsdp-train.sbatch ---------------------------------------------------------------

def _sbatch_driver(train_args: str):
    """The batch script with stand-ins for Slurm's scontrol and srun (srun records its arguments)."""
    def driver(ctx: Ctx, case: Case, runner) -> Result:
        bin_dir = ctx.path("bin")
        bin_dir.mkdir()
        for name, body in (("scontrol", 'echo node1\n'), ("srun", f'printf "%s\\n" "$@" > "{ctx.d}/srun.args"\n')):
            p = bin_dir / name
            p.write_text("#!/bin/sh\n" + body)
            p.chmod(0o755)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_NODELIST": "node1", "FSDP_TRAIN": "/bin/true", "CHECKPOINT_DIR": "none", "DEVICE": "cpu",
               "USE_EFA": "0", "TRAIN_ARGS": train_args}
        proc = runner.start(case, ctx, env=env)
        return proc.wait(proc.start + case.timeout)
    return driver


def _srun_got(*words):
    def check(ctx: Ctx, r: Result) -> list:
        p = ctx.path("srun.args")
        got = p.read_text().split("\n") if p.is_file() else []
        missing = [w for w in words if w not in got]
        return [("wrong exit", f"srun did not get {missing} from TRAIN_ARGS")] if missing and r.code == 0 else []
    return check


def sbatch_cases() -> list:
    # Finding 9: a multi-line TRAIN_ARGS kept only its first line, silently.
    return [Case("third-sbatch", "train-args-several-lines", ["sbatch"], OK,
                 driver=_sbatch_driver("--max-steps 5\n--lr 1e-4\n  --seed 3\n"),
                 check=_srun_got("--max-steps", "5", "--lr", "1e-4", "--seed", "3"))]


# --- 11, 12, 13, 15, 16, 21: the low findings ---------------------------------------------------------

def _shim_of_installed_package(ctx: Ctx, case: Case, runner) -> Result:
    """fsdp-train as an installed package lays it out: bin/fsdp-train and lib/libfsdp_spm_shim.so."""
    build = Path(runner.env.train).resolve().parent.parent
    shim = build / "src" / "data" / "libfsdp_spm_shim.so"
    prefix = ctx.path("prefix")
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    exe = prefix / "bin" / "fsdp-train"
    try:
        os.link(runner.env.train, exe)
    except OSError:
        shutil.copy2(runner.env.train, exe)
    shutil.copy2(shim, prefix / "lib" / shim.name)
    argv = [str(exe)] + [a.format(**runner.env.values(ctx.d)) for a in case.argv[1:]]
    proc = Process(argv, ctx, case, env={"LD_DEBUG": "files"})
    return proc.wait(proc.start + case.timeout)


def _loaded_own_shim(ctx: Ctx, r: Result) -> list:
    loads = re.findall(r"file=(\S*libfsdp_spm_shim\.so)", r.stderr)
    if not loads:
        return [("unclear", "no SentencePiece module was loaded (LD_DEBUG=files shows none)")]
    if Path(loads[0]).resolve() != ctx.path("prefix/lib/libfsdp_spm_shim.so").resolve():
        return [("wrong exit", f"loaded {loads[0]} before the package's own lib/libfsdp_spm_shim.so")]
    return []


def _fd_pressure(ctx: Ctx, case: Case, runner) -> Result:
    """Trains with 32 descriptors (it needs 7), then holds 120 connections to the metrics port: past 25
    sessions accept fails with EMFILE, and the metrics thread must wait between tries, not spin."""
    import socket
    port = free_port()
    proc = runner.start(case, ctx, case.argv + ["--metrics-port", str(port)])
    held = []
    ctx.metrics_cpu = None
    if wait_until(lambda: "Batch 1 Loss" in proc.out_path.read_text(errors="replace"), proc, 60):
        for _ in range(120):
            s = socket.socket()
            s.settimeout(1)
            try:
                s.connect(("127.0.0.1", port))
                held.append(s)
            except OSError:
                s.close()
                break
        time.sleep(0.5)
        ctx.metrics_cpu = _helper_thread_cpu(proc.pid, 2.0)
    for s in held:
        s.close()
    proc.send(15)
    return proc.wait(time.monotonic() + 30)


def _helper_thread_cpu(pid: int, seconds: float):
    """(CPU seconds, name) of the busiest thread but the main one over `seconds` of wall time; None if
    the process is gone. With --metrics-port and one OpenMP thread the helpers are the metrics server
    (fsdp-metrics) and an idle loader: none has work while the main thread trains."""
    def ticks():
        out = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            if int(tid) == pid:
                continue
            try:
                f = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            fields = f[f.rindex(")") + 2:].split()
            out[tid] = (int(fields[11]) + int(fields[12]), name)
        return out
    try:
        t0 = ticks()
        time.sleep(seconds)
        t1 = ticks()
    except OSError:
        return None
    used = [((t1[t][0] - t0[t][0]) / os.sysconf("SC_CLK_TCK"), t1[t][1]) for t in t1 if t in t0]
    return max(used, default=(0.0, ""))


def _metrics_thread_waits(ctx: Ctx, r: Result) -> list:
    busiest = getattr(ctx, "metrics_cpu", None)
    if busiest is None:
        return [("unclear", "the run ended before the metrics server was out of descriptors")]
    cpu, name = busiest
    # Spinning takes what the scheduler gives (0.4-0.6 s of 2 s measured at load 11 with 9fc8542, as much
    # as the training thread); waiting 100 ms between accepts, nothing measurable (0 ticks).
    return [("hang", f"thread {name} used {cpu:.2f} s of CPU in 2 s while the metrics server was out of "
                     "descriptors: its accept loop spins")] if cpu > 0.1 else []


def _every_rank_port(ctx: Ctx, r: Result) -> list:
    ports = re.findall(r"rank (\d+) port (\d+)", r.stdout + r.stderr)
    if len({rank for rank, _ in ports}) < 2 or len({p for _, p in ports}) < 2:
        return [("unclear", "the log does not name each rank's own metrics port")]
    return []


def low_cases() -> list:
    c = "third-low"
    return [
        # 11: a NUL in a TOML string cut the opened name while its suffix chose the format.
        Case(c, "config-string-with-nul", ["train", "--config", "{d}/run.toml"], USAGE,
             setup=lambda ctx: ctx.write("run.toml", f'model = "tiny"\nmax-steps = 1\nseq-len = 16\nbatch-size = 2\n'
                                                     f'data = "{ctx.env.corpus}\\u0000.txt"\n'), names=("NUL",)),
        # 12: the installed package loaded the build tree's SentencePiece module before its own.
        Case(c, "installed-shim-first", TRAIN + ["--tokenizer", "{d}/sp.model"], USAGE,
             setup=_files(sp_DOT_model=bytes((i * 31) % 256 for i in range(5000))), driver=_shim_of_installed_package,
             check=_loaded_own_shim, names=("sp.model",)),
        # 13: --export-hf given a link to an empty directory replaced the link.
        Case(c, "export-to-link-to-empty-directory", TRAIN + ["--export-hf", "{d}/out"], USAGE,
             setup=lambda ctx: (ctx.path("real").mkdir(), os.symlink(ctx.path("real"), ctx.path("out"))),
             names=("--export-hf",), check=_unchanged_link("out", "{d}/real")),
        # 15: with any free port on every rank, only rank 0's port was logged.
        Case(c, "metrics-port-0-every-rank",
             TRAIN + ["--nproc-per-node", "2", "--metrics-port", "0", "--metrics-every-rank", "--metrics-host",
                      "127.0.0.1"], OK, check=_every_rank_port, weight=5, timeout=90),
        # 16: the metrics server's accept loop spun on EMFILE.
        Case(c, "metrics-accept-out-of-descriptors",
             TRAIN + ["--max-steps", "100000", "--metrics-host", "127.0.0.1"], E(0, 143), driver=_fd_pressure,
             check=_metrics_thread_waits, open_files_limit=32, weight=4, timeout=90),
        # 21: an empty list was refused with an internal message.
        Case(c, "config-lr-scale-empty-list", ["train", "--config", "{d}/run.toml", "--data", "{corpus}"], E(0, 2),
             setup=_config('model = "tiny"\nmax-steps = 1\nseq-len = 16\nbatch-size = 2\nlr-scale = []\n'),
             names=("lr-scale",), check=_not_said("Could not convert")),
    ]


def all_cases() -> list:
    return (calibration_file_cases() + config_copy_cases() + estimate_cases() + join_cases() + shm_cases()
            + generator_cases() + sbatch_cases() + low_cases())

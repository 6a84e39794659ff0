"""The hostile campaign's machinery: what a case is, how one runs, how its outcome is judged.

A case runs the real programs in a directory of its own, with the environment of a clean
machine (no rendezvous variables, one OpenMP thread), bounded in time, memory and process
count, and is judged on six promises (issue 16), checked in this order; a case's verdict is the
first promise it breaks, and every broken one is listed in the report:

  hang        still running after its time bound (killed then), or it left processes behind
  crash       died by a signal, or exited 128 + SIGSEGV / SIGBUS / SIGABRT / SIGILL / SIGFPE
  lost data   a file the user had (a sentinel planted by the case) is gone or changed
  backtrace   a C++ backtrace, an uncaught exception or a sanitizer report in the output
  wrong exit  an exit code outside the case's expected set (0 success, 2 bad usage, 1 failure)
  unclear     a failure without a one-line `<program>: error|failed: ...` on stderr, a line that
              does not name what the case is about, that names internal fields or quotes a bare
              C++ exception, or a warning written to stdout
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

KINDS = ("hang", "crash", "lost data", "backtrace", "wrong exit", "unclear")

# Output that must never reach a user.
FORBIDDEN = [
    ("backtrace", re.compile(r"frame #\d+")),
    ("backtrace", re.compile(r"Exception raised from")),
    ("backtrace", re.compile(r"terminate called")),
    ("backtrace", re.compile(r"Segmentation fault")),
    ("backtrace", re.compile(r"(Address|Leak|Thread|Memory|UndefinedBehavior)Sanitizer")),
    ("backtrace", re.compile(r"runtime error: .*(overflow|out of bounds|misaligned|invalid)")),
    ("backtrace", re.compile(r"Assertion `.*' failed")),
    ("backtrace", re.compile(r"Traceback \(most recent call last\)")),
]

# An error line: what run_main prints, or the launcher's summary of a failed rank.
ERROR_LINE = re.compile(r"^(?:fsdp-train|fsdp-inspect|prepare_data\.sh|generate\.py|fsdp-train\.sbatch)(?:\[[^\]]*\])?: "
                        r"(?:error: |failed: )?\S.*$")

# Messages must speak in the user's terms (flags, config keys), not the trainer's field names
# (issue 16, item 7), and not quote a bare C++ exception.
INTERNAL_NAMES = re.compile(
    r"\b(seq_len|batch_size|grad_accum|warmup_steps|max_steps|log_every|metrics_file|nproc_per_node|"
    r"hybrid_shard_size|limit_all_gathers|initial_loss_scale|checkpoint_dir|checkpoint_every|keep_last|"
    r"init_from|export_dir|export_dtype|export_shard_size|val_data|eval_every|max_windows|text_field|"
    r"token_dtype|loss_scaling|backward_prefetch|plan_sharding|validate_options|world size 0)\b")
BARE_EXCEPTION = re.compile(
    r"std::bad_alloc|vector::reserve|vector::_M_|basic_string::|\bstoi\b|\bstol\b|\bstoull?\b|"
    r"Interrupted system call|bad_function_call|bad_optional_access|std::out_of_range|\bmap::at\b")
STDOUT_WARNING = re.compile(r"^\S+ \S+ W \[fsdp-train\]", re.M)

CRASH_CODES = {128 + s for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE)}

# Variables that would make fsdp-train a worker of some job, or change its output.
SCRUBBED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "FSDP_LAUNCHER", "FSDP_DEBUG", "FSDP_TIMEOUT", "OMP_NUM_THREADS", "GTEST_OUTPUT")
SCRUBBED_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "KUBEFLOW_", "PET_")

MEMORY_LIMIT = 3 << 30   # bytes of data segment per process (RLIMIT_DATA): no case can exhaust the host
MAX_PROCESSES = 12       # processes a case may have at once; more is a fork bomb, killed at once
OUTPUT_CAP = 1 << 20     # bytes of stdout/stderr kept for judging (head and tail)


@dataclasses.dataclass
class Env:
    """What every case may use: the programs and the shared inputs (fixtures.py builds them)."""
    train: str
    inspect: str
    prepare: str          # scripts/prepare_data.sh
    corpus: str           # small JSON-lines corpus and its validation split
    val: str
    fx: Path              # fixtures directory
    work: Path            # this run's cases live in work/cases
    timeout_flag: bool    # fsdp-train --help mentions --timeout
    generate: str = ""    # deploy/kubernetes/generate.py (run by this Python)
    sbatch: str = ""      # deploy/slurm/fsdp-train.sbatch (run by bash)

    def values(self, d: Path) -> dict:
        return {"d": str(d), "fx": str(self.fx), "corpus": self.corpus, "val": self.val}


class Ctx:
    """One case's directory and its sentinels: files the user owns, checked after the run."""

    def __init__(self, env: Env, d: Path):
        self.env = env
        self.d = d
        self.fx = env.fx
        self._sentinels: dict[Path, tuple[str, bytes]] = {}
        # Device nodes a case made (mknod): each must be the same node afterwards (kind, device numbers).
        self.nodes: dict[Path, tuple[int, int]] = {}

    def path(self, rel: str) -> Path:
        return self.d / rel

    def write(self, rel: str, data: bytes | str) -> Path:
        p = self.d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return p

    def plant(self, rel: str, data: bytes | str = b"the user's notes, not the program's\n") -> Path:
        """A user's file that must be exactly as it was after the run."""
        p = self.write(rel, data)
        self._sentinels[p] = ("exact", p.read_bytes())
        return p

    def plant_prefix(self, rel: str, data: bytes | str) -> Path:
        """A user's file the program may append to (--metrics-file) but must not truncate."""
        p = self.write(rel, data)
        self._sentinels[p] = ("prefix", p.read_bytes())
        return p

    def protect(self, rel: str) -> None:
        """Every file under rel must stay as it is (e.g. a previous checkpoint while a save fails)."""
        root = self.d / rel
        for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if p.is_file():
                self._sentinels[p] = ("exact", p.read_bytes())

    def lost(self) -> list[str]:
        bad = []
        for p, (kind, rdev) in self.nodes.items():
            rel = os.path.relpath(p, self.d)
            try:
                st = os.lstat(p)
            except OSError:
                bad.append(f"the device node {rel} is gone")
                continue
            if stat.S_IFMT(st.st_mode) != kind or st.st_rdev != rdev:
                bad.append(f"the device node {rel} was replaced (now mode {oct(st.st_mode)}, {st.st_size} bytes)")
        for p, (how, want) in self._sentinels.items():
            rel = os.path.relpath(p, self.d)
            if not p.is_file():
                bad.append(f"{rel} is gone")
                continue
            got = p.read_bytes()
            if (how == "exact" and got != want) or (how == "prefix" and not got.startswith(want)):
                bad.append(f"{rel} was changed")
        return bad


@dataclasses.dataclass
class Result:
    code: Optional[int] = None   # exit code; None: killed by the harness (hang)
    signal: int = 0              # the signal it died of (not sent by the harness)
    hang: str = ""               # why it counts as a hang
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0


@dataclasses.dataclass
class Case:
    category: str
    name: str
    # argv[0] is "train", "inspect" or "prepare"; {d} {fx} {corpus} {val} are filled in.
    argv: list
    expect: frozenset
    setup: Optional[Callable[[Ctx], None]] = None
    timeout: float = 20.0
    env: dict = dataclasses.field(default_factory=dict)
    # The error line must name one of these (case-insensitive); empty: any error line will do.
    names: tuple = ()
    # Custom run (fault injection): driver(ctx, case, runner) -> Result.
    driver: Optional[Callable] = None
    # Extra judgement: check(ctx, result) -> [(kind, why)].
    check: Optional[Callable] = None
    needs: tuple = ()            # "timeout": only when fsdp-train has --timeout
    file_size_limit: int = 0     # RLIMIT_FSIZE (writes past it fail with EFBIG: a full disk); 0: none
    memory_limit: int = MEMORY_LIMIT  # RLIMIT_DATA per process
    open_files_limit: int = 0    # RLIMIT_NOFILE; 0: the harness's own
    weight: int = 1              # scheduling: heavy cases start first

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


def _proc_stat(pid: int) -> Optional[tuple[int, int, str]]:
    """(ppid, session id, state) of a process, None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[3]), fields[0]


def descendants(pid: int) -> list[int]:
    """pid and the processes it started, transitively (cheap: follows /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def session_members(sid: int) -> list[int]:
    """Processes of a session (the case's: each case starts one), zombies left out."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(int(name))
            if st and st[1] == sid and st[2] != "Z":
                out.append(int(name))
    return out


def kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def base_environment(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUBBED_ENV and not k.startswith(SCRUBBED_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def _limits(file_size_limit: int, memory_limit: int, open_files_limit: int = 0) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))
        if open_files_limit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files_limit, open_files_limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        # Enforced for unprivileged users only; the watchdog below covers root.
        resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))
        if file_size_limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored dispositions survive exec: EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    return apply


def _copy_stream(source, path: Path) -> None:
    with open(path, "wb") as f:
        for chunk in iter(lambda: source.read1(65536), b""):
            f.write(chunk)
    source.close()


def _read_capped(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= OUTPUT_CAP:
            data = f.read()
        else:
            head = f.read(OUTPUT_CAP // 2)
            f.seek(size - OUTPUT_CAP // 2)
            data = head + b"\n[... output cut ...]\n" + f.read()
    return data.decode("utf-8", "replace")


class Process:
    """A program started for a case: its own session, bounded, output in files beside the case."""

    def __init__(self, argv: list, ctx: Ctx, case: Case, env: Optional[dict] = None, tag: str = ""):
        self.ctx = ctx
        logs = ctx.d.parent / f".{ctx.d.name}{tag}"
        self.out_path, self.err_path = Path(f"{logs}.out"), Path(f"{logs}.err")
        self.start = time.monotonic()
        # Under a file-size limit (a full disk) the program's own stdout and stderr files would
        # be cut at the limit too, which no user's terminal is: then they go through pipes,
        # copied to the files by this process.
        piped = bool(case.file_size_limit)
        self.copiers: list[threading.Thread] = []
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(argv, cwd=ctx.d, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE if piped else out, stderr=subprocess.PIPE if piped else err,
                                      env=base_environment({**case.env, **(env or {})}), start_new_session=True,
                                      restore_signals=False,
                                      preexec_fn=_limits(case.file_size_limit, case.memory_limit, case.open_files_limit))
        if piped:
            for source, path in ((self.p.stdout, self.out_path), (self.p.stderr, self.err_path)):
                t = threading.Thread(target=_copy_stream, args=(source, path), daemon=True)
                t.start()
                self.copiers.append(t)
        self.pid = self.p.pid
        self.fork_bomb = False

    def members(self) -> list[int]:
        return session_members(self.pid)

    def poll(self) -> Optional[int]:
        if len(descendants(self.pid)) > MAX_PROCESSES:
            # Stop the one forking first, then everything it started.
            kill_all([self.pid])
            kill_all(self.members())
            self.fork_bomb = True
        return self.p.poll()

    def wait(self, deadline: float) -> Result:
        """Waits until the process exits or `deadline` (monotonic) passes; then judges leftovers."""
        r = Result()
        code = self.poll()
        while code is None and time.monotonic() < deadline and not self.fork_bomb:
            time.sleep(0.02)
            code = self.poll()
        if self.fork_bomb:
            self.p.wait()
            r.hang = f"started more than {MAX_PROCESSES} processes (killed)"
        elif code is None:
            members = self.members()
            kill_all(members)
            self.p.wait()
            r.hang = f"still running after {deadline - self.start:.0f} s (killed {len(members)} processes)"
        else:
            # The program is gone; its workers must be too (allow them a moment to be reaped).
            leftover = self.members()
            end = time.monotonic() + 2
            while leftover and time.monotonic() < end:
                time.sleep(0.05)
                leftover = self.members()
            if leftover:
                kill_all(leftover)
                r.hang = f"exited but left {len(leftover)} processes running"
            if code < 0:
                r.signal = -code
            else:
                r.code = code
        r.seconds = time.monotonic() - self.start
        for t in self.copiers:
            t.join(timeout=5)
        r.stdout = _read_capped(self.out_path)
        r.stderr = _read_capped(self.err_path)
        return r

    def send(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except OSError:
            pass


class Runner:
    def __init__(self, env: Env):
        self.env = env

    def argv(self, case: Case, ctx: Ctx, argv: Optional[list] = None) -> list:
        args = [a.format_map(self.env.values(ctx.d)) for a in (argv or case.argv)]
        if args[0] == "generate":
            return [sys.executable, self.env.generate] + args[1:]
        if args[0] == "sbatch":
            return ["bash", self.env.sbatch] + args[1:]
        program = {"train": self.env.train, "inspect": self.env.inspect, "prepare": self.env.prepare}[args[0]]
        return (["bash", program] if args[0] == "prepare" else [program]) + args[1:]

    def start(self, case: Case, ctx: Ctx, argv: Optional[list] = None, env: Optional[dict] = None,
              tag: str = "") -> Process:
        return Process(self.argv(case, ctx, argv), ctx, case, env, tag)

    def run(self, case: Case) -> tuple[Result, list]:
        d = self.env.work / "cases" / case.category / case.name
        d.mkdir(parents=True)
        ctx = Ctx(self.env, d)
        if case.setup:
            case.setup(ctx)
        if case.driver:
            r = case.driver(ctx, case, self)
        else:
            proc = self.start(case, ctx)
            r = proc.wait(proc.start + case.timeout)
        return r, judge(case, ctx, r)


def error_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if ERROR_LINE.match(l)]


def judge(case: Case, ctx: Ctx, r: Result) -> list:
    """[(kind, why)] for every promise the run broke, in KINDS order."""
    bad = []
    if r.hang:
        bad.append(("hang", r.hang))
    if r.signal:
        bad.append(("crash", f"killed by signal {r.signal} ({signal.Signals(r.signal).name})"))
    elif r.code in CRASH_CODES and r.code not in case.expect:
        bad.append(("crash", f"exit code {r.code} (128 + {signal.Signals(r.code - 128).name})"))
    for what in ctx.lost():
        bad.append(("lost data", what))
    out = r.stdout + "\n" + r.stderr
    for kind, rx in FORBIDDEN:
        m = rx.search(out)
        if m:
            bad.append((kind, f"output has '{m.group(0)}'"))
            break
    if r.code is not None and r.code not in case.expect:
        bad.append(("wrong exit", f"exit {r.code}, expected {'/'.join(map(str, sorted(case.expect)))}"))
    # A failure says why in one line; 128 + signal (stopped by a signal, as documented) need not.
    if r.code is not None and 0 < r.code < 128:
        lines = error_lines(r.stderr)
        if not lines:
            bad.append(("unclear", "no '<program>: error: ...' line on stderr"))
        else:
            text = "\n".join(lines)
            if case.names and not any(n.lower() in text.lower() for n in case.names):
                bad.append(("unclear", f"the error does not name {' or '.join(case.names)}"))
            m = INTERNAL_NAMES.search(text) or BARE_EXCEPTION.search(text)
            if m:
                bad.append(("unclear", f"the error says '{m.group(0)}'"))
    m = STDOUT_WARNING.search(r.stdout)
    if m:
        bad.append(("unclear", "a warning on stdout instead of stderr"))
    if case.check:
        bad.extend(case.check(ctx, r))
    bad.sort(key=lambda b: KINDS.index(b[0]))
    return bad


def first_error(r: Result) -> str:
    lines = error_lines(r.stderr) or [l for l in r.stderr.splitlines() if l.strip()]
    line = lines[0] if lines else "(stderr empty)"
    return line if len(line) <= 200 else line[:197] + "..."


#!/usr/bin/env python3
"""An emulated cluster on one Linux host: N "nodes" as network namespaces.

    with Cluster(nodes=2, rate_mbit=150) as c:
        p = c.popen(0, ["fsdp-train", ...], env=..., log=path)
        c.link(1, up=False)          # pull node 1's cable (ip link set eth0 down)

Note [Emulated cluster]. The layout:

    namespace <run>-sw:  bridge br0, ports p0..pN-1 (one veth end each)
    namespace <run>-n<i>: lo, and eth0 (the other veth end) with 10.29.0.<i+1>/24

Nothing is created in the host's own namespace: no address, no interface,
no route; everything lives in namespaces this fixture created, and deleting
those namespaces deletes every interface in them. Ranks on one node talk to
each other over that node's own addresses (the kernel loops them back, not
rate-shaped, like NVLink beside the NIC); ranks on different nodes cross the
bridge. With rate_mbit, tc tbf shapes both directions of every node's link
(eth0's egress in the node, the bridge port's egress towards it); netem is
not used (it is missing on some kernels).

Naming and cleanup. Every namespace is named fsdpc-<pid>-<start>-<tag>-...,
<pid> and <start> (the process start time, /proc/<pid>/stat field 22)
identifying the process that created it. Cleanup happens three ways:
  1. close() / the with-block: kills every process in the namespaces, deletes them;
  2. a watchdog process (its own session, so a killed test's process group does
     not take it along) that waits for the creator to die — it holds the read
     end of a pipe whose write end only the creator holds — and then does 1;
  3. reap_stale(), run before every new cluster: namespaces whose creator is no
     longer running (pid gone or reused: another start time) are cleaned up.
So a test that fails, raises, or is killed with SIGKILL leaves nothing behind.

Requires: root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2 (ip, tc), the tbf qdisc.
check_capabilities() returns None or the one missing thing, in words.

Also a command line, for people: `netcluster.py reap` removes every
namespace of dead runs (what reap_stale does); `netcluster.py list`.
"""

import os
import signal
import subprocess
import sys
import time

PREFIX = "fsdpc-"
SUBNET = "10.29.0"
GSO_MAX = 16384  # bytes: the largest segment a link carries (see _build)
LINK_BUCKET = 256 * 1024  # bytes: the token bucket of a shaped link (see shape)
STRICT_BUCKET = GSO_MAX + 4096  # bytes: one segment and a bit, the smallest bucket tbf takes


def _run(argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _start_time(pid):
    """The process start time in clock ticks since boot, or None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22; fields after "pid (comm) " start at 3


def _namespaces():
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _owner(ns):
    """(pid, start) of the process that created namespace `ns`, or None if not ours."""
    if not ns.startswith(PREFIX):
        return None
    parts = ns[len(PREFIX):].split("-")
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1]


def _pids(ns):
    return [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]


def _kill_processes(ns, rounds=20):
    """SIGKILL every process in `ns` until none is left (or `rounds` tries); returns those left."""
    for _ in range(rounds):
        pids = _pids(ns)
        if not pids:
            return []
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return _pids(ns)


def _kill_namespace(ns):
    """SIGKILL every process in `ns`, then delete it (its interfaces go with it)."""
    _kill_processes(ns)
    _run(["ip", "netns", "delete", ns], check=False)


def reap(run_prefix):
    """Removes every namespace whose name starts with `run_prefix`; returns their names."""
    gone = [ns for ns in _namespaces() if ns.startswith(run_prefix)]
    for ns in gone:
        _kill_namespace(ns)
    return gone


def reap_stale():
    """Removes the namespaces of runs whose creating process is gone; returns their names."""
    gone = []
    for ns in _namespaces():
        owner = _owner(ns)
        if owner is not None and _start_time(owner[0]) != owner[1]:
            _kill_namespace(ns)
            gone.append(ns)
    return gone


def check_capabilities():
    """None when this host can run the cluster, else what is missing (one sentence)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run the cluster tests as root"
    for tool in ("ip", "tc"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"'{tool}' is missing (Debian: iproute2)"
    probe = f"{PREFIX}{os.getpid()}-{_start_time(os.getpid())}-probe"
    try:
        r = _run(["ip", "netns", "add", probe], check=False)
        if r.returncode != 0:
            return f"cannot create a network namespace: {r.stderr.strip()}"
        r = _run(["ip", "-n", probe, "link", "add", "t0", "type", "veth", "peer", "name", "t1"], check=False)
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stderr.strip()}"
        r = _run(["tc", "-n", probe, "qdisc", "add", "dev", "t0", "root", "tbf", "rate", "100mbit", "burst",
                  "128kb", "latency", "100ms"], check=False)
        if r.returncode != 0:
            return f"the tbf qdisc is unavailable (tc qdisc add ... tbf: {r.stderr.strip()})"
    finally:
        _kill_namespace(probe)
    return None


class Cluster:
    """N nodes joined by a bridge; see the module's docstring."""

    def __init__(self, nodes, rate_mbit=None, tag="c"):
        if not 1 <= nodes <= 16:
            raise ValueError(f"nodes={nodes}: 1..16 nodes")
        reap_stale()
        me = os.getpid()
        self.nodes = nodes
        self.rate_mbit = None
        self.run_prefix = f"{PREFIX}{me}-{_start_time(me)}-{tag}{time.monotonic_ns() % 10**9}-"
        self.switch = self.run_prefix + "sw"
        self.names = [f"{self.run_prefix}n{i}" for i in range(nodes)]
        self.procs = []
        self._watchdog = None
        self._closed = False
        try:
            self._start_watchdog()
            self._build()
            if rate_mbit is not None:
                self.shape(rate_mbit)
        except BaseException:
            self.close()
            raise

    # --- construction ---------------------------------------------------------------------
    def _start_watchdog(self):
        # The watchdog reads a pipe only we hold the write end of: EOF means we are gone
        # (closed, crashed or killed), and it reaps this run's namespaces.
        r, w = os.pipe()
        self._watchdog = subprocess.Popen([sys.executable, os.path.abspath(__file__), "watch", self.run_prefix],
                                          stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, close_fds=True)
        os.close(r)
        self._watch_fd = w
        os.set_inheritable(w, False)

    def _build(self):
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, ns in enumerate(self.names):
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                  "netns", self.switch])
            _run(["ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0"])
            _run(["ip", "-n", self.switch, "link", "set", f"p{i}", "up"])
            # Segments of at most 16 KiB (a veth's default is 64 KiB): tbf drops a
            # packet larger than its bucket, and STRICT_BUCKET, which keeps short
            # transfers from passing faster than the rate, must hold one.
            for where, dev in ((ns, "eth0"), (self.switch, f"p{i}")):
                _run(["ip", "-n", where, "link", "set", "dev", dev, "gso_max_size", str(GSO_MAX)])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    # --- use ------------------------------------------------------------------------------
    def addr(self, i):
        return f"{SUBNET}.{i + 1}"

    def shape(self, rate_mbit, bucket=None):
        """tbf at rate_mbit on both directions of every node's link (None: unshaped).
        bucket: the token bucket in bytes (default below); STRICT_BUCKET lets no
        transfer pass faster than the rate, for a check that needs that floor."""
        self.rate_mbit = rate_mbit
        # Bucket 256 KiB (2 ms at the rate where that is more), queue limit 50 ms: the
        # settings a user shapes a link with, under which a bulk TCP stream each way gets
        # 93-96% of the rate (140-144 Mbit/s of 150). The earlier 2 ms bucket (37.5 KB at
        # 150 Mbit/s) with a 200 ms queue gave 100-120 Mbit/s: a "150 Mbit/s" row ran on a
        # slower link than it said. Measured in docs/benchmarks.md.
        burst = bucket or (max(LINK_BUCKET, int(rate_mbit * 1e6 / 8 * 0.002)) if rate_mbit else 0)
        for i, ns in enumerate(self.names):
            for where, dev in ((ns, "eth0"), (self.switch, f"p{i}")):
                if rate_mbit is None:
                    _run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], check=False)
                else:
                    _run(["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                          f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"])

    def link(self, i, up):
        """Node i's link up or down (ip link set eth0 down inside the node: its cable pulled)."""
        _run(["ip", "-n", self.names[i], "link", "set", "eth0", "up" if up else "down"])

    def power_off(self, i):
        """Node i gone as a machine goes: its link down and every process in it SIGKILLed
        (the namespace stays, so the node can come back: link(i, up=True), new processes)."""
        self.link(i, up=False)
        left = _kill_processes(self.names[i], rounds=40)
        if left:
            raise RuntimeError(f"node {i}: processes {left} survived SIGKILL")

    def argv(self, i, argv):
        """`argv` run inside node i's namespace."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def popen(self, i, argv, env=None, log=None, cwd=None):
        """Starts `argv` on node i in its own session (stdout+stderr to `log`); tracked for close()."""
        out = open(log, "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(self.argv(i, argv), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                             start_new_session=True)
        if log:
            out.close()
        self.procs.append(p)
        return p

    def pids(self, i):
        return _pids(self.names[i])

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        reap(self.run_prefix)
        if self._watchdog is not None:
            os.close(self._watch_fd)  # EOF: the watchdog finds nothing left and exits
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _main(argv):
    if len(argv) == 3 and argv[1] == "watch":
        # The watchdog: block until the creator's pipe closes, then reap its namespaces.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            reap(argv[2])
        return 0
    if len(argv) == 2 and argv[1] == "reap":
        for ns in reap_stale():
            print(f"removed {ns}")
        return 0
    if len(argv) == 2 and argv[1] == "list":
        for ns in _namespaces():
            if ns.startswith(PREFIX):
                owner = _owner(ns)
                alive = owner is not None and _start_time(owner[0]) == owner[1]
                print(f"{ns} ({'running' if alive else 'stale'})")
        return 0
    print("usage: netcluster.py reap | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))

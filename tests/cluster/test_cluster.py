#!/usr/bin/env python3
"""Multi-node training on an emulated cluster (netcluster.py: network namespaces
joined by a bridge, tc tbf for a slow link).

    test_cluster.py CHECK --train FSDP_TRAIN --source SOURCE_DIR

CHECK is one of:

  parity    Every multi-node launch (also over c10d's ProcessGroupGloo, --backend gloo)
            trains bit-identically to the same ranks on
            one host: fsdp-train's own launcher (--nnodes 2 --node-rank i
            --master-addr), torchrun --nnodes 2 --node-rank i with the c10d
            rendezvous, and torchrun with the etcd rendezvous (etcd in node 0),
            FULL_SHARD over 2 nodes x 1 process against 2 local processes; and
            HYBRID with one shard group per node, 2 nodes x 2 processes against 4
            local processes with --hybrid-shard-size 2. Equal: every step's loss
            and gradient norm in the metrics file (exactly: the TCP group sums
            in rank order on every topology) and the exported model.safetensors,
            byte for byte.
  linkcut   2 nodes x 2 processes, --timeout 5: node 1's link is cut (ip link set
            eth0 down) while training. Every rank exits, each node's launcher
            within --timeout + its kill grace of the cut, non-zero; the ranks of
            node 0 name node 1's ranks (those whose bytes were missing: 2, 3 or
            both) as the ones that did not arrive, and node 1's ranks name node 0's.
  elastic   torchrun (c10d, --max-restarts 2) on 2 nodes, a checkpoint every
            step: node 1's link is cut mid-run and restored; the workers fail,
            torchrun restarts them, they resume from the last checkpoint and
            finish; the exported model equals an uninterrupted run's, byte for byte.
  discovery 2 nodes x 1 process whose host name resolves to 127.0.1.1 (each
            node's /etc/hosts, bind-mounted over in the node's own mount
            namespace, as many images ship it), without GLOO_SOCKET_IFNAME:
            --nnodes 2 --master-addr <node 0> trains, and each rank advertised
            its node's own address, found from the route to MASTER_ADDR (rank
            0's "process group:" log line names it), never loopback.
  headtohead
            A small run of bench/cluster/headtohead.py (fsdp-train vs PyTorch FSDP2
            with gloo across 2 nodes at 150 Mbit/s, a 2-layer Llama, 2 measured
            steps), once with fsdp-train's int8 all-gather + bf16 reduce-scatter:
            both sides train the same thing (the first step's loss agrees within
            1e-3), the table has both sides' tokens/s, ratio and exposed
            communication, and the compressed row moves under half the
            collective bytes of the plain one. No timing is asserted.
  hpz       2 nodes x 2 processes, FULL_SHARD over all 4, with --reshard-after-forward 2
            (ZeRO++'s hpZ: after forward each unit keeps a shard over its node's 2
            processes) against the default (true): every step's loss and gradient
            norm and the exported weights are bit-identical (backward computes with
            the bits forward used), with the native and the int8 all-gather; and
            the bytes through node 1's link (its eth0 counters) fall to under 0.8 of
            the default's, since backward's all-gathers no longer leave the node
            (about 2/3: forward's all-gather and the reduce-scatter still cross it).
  cleanup   The fixture leaves nothing: a test process SIGKILLed while its cluster
            runs a process loses its namespaces and processes (the watchdog), and
            a dead run's namespace is reaped by the next cluster.
  slowlink  2 nodes x 1 process with --profile-steps: on links shaped to 100
            Mbit/s the traced steps take at least the time the bytes sent need
            at that rate (the shaping works), wait for communication most of the
            time (exposed >= 50% of the step, from the trace's own summary line
            and from the merged Chrome trace), and more than on the unshaped link.

Each check creates its own cluster, named with this process's id and start time,
and removes it (namespaces, interfaces, processes) when it ends, fails, or is
killed (netcluster's watchdog; and the next run reaps what a dead one left).
Exit 0 pass, 1 fail. A host that cannot build the cluster (not root, no
iproute2, no tbf) fails with the missing capability named: there is no skip.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netcluster  # noqa: E402

RESUMED_LINE = re.compile(r"Resumed from .*?\(step (\d+)\)")
# Every check ends (and cleans up) well inside CTest's TIMEOUT (tests/cluster/CMakeLists.txt).
BUDGET_S = {"lose-c10d": 250, "lose-etcd": 250}
DEADLINE = time.time() + 170
failures = []


def expect(cond, message):
    if not cond:
        failures.append(message)
        print(f"  FAIL: {message}", flush=True)
    return cond


def left():
    return max(1.0, DEADLINE - time.time())


def train_args(a, tmp, name, steps, extra=()):
    return [a.train, "--model", "tiny", "--data", str(Path(a.source) / "data" / "fallback_corpus.jsonl"),
            "--seq-len", "64", "--batch-size", "2", "--max-steps", str(steps), "--log-every", "1", "--seed", "3",
            "--metrics-file", str(tmp / f"{name}.metrics.jsonl"), "--export-hf", str(tmp / f"{name}.hf"), *extra]


def env_for(extra=None):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["GLOO_SOCKET_IFNAME"] = "eth0"  # each node's own address (inside its namespace)
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env.update(extra or {})
    return env


def wait_all(procs, timeout):
    end = time.time() + min(timeout, left())
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in procs]


def show_logs(logs, tail=3000):
    for log in logs:
        text = Path(log).read_text(errors="replace") if Path(log).exists() else "(no log)"
        print(f"----- {log} (tail)\n{text[-tail:]}")


def run_nodes(c, tmp, name, argvs, env=None, timeout=90):
    """argvs[i] runs on node i; all must exit 0."""
    logs = [tmp / f"{name}.node{i}.log" for i in range(len(argvs))]
    procs = [c.popen(i, argv, env=env or env_for(), log=logs[i]) for i, argv in enumerate(argvs)]
    codes = wait_all(procs, timeout)
    ok = all(code == 0 for code in codes)
    if not expect(ok, f"{name}: exit codes {codes} (None: still running after {timeout} s)"):
        show_logs(logs)
    return ok


def records(tmp, name):
    path = tmp / f"{name}.metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_training(tmp, ref, other):
    """Bit-identical: losses and gradient norms of every step, and the exported weights."""
    a, b = records(tmp, ref), records(tmp, other)
    steps_a = [(r["step"], r["loss"], r["grad_norm"]) for r in a]
    steps_b = [(r["step"], r["loss"], r["grad_norm"]) for r in b]
    ok = expect(len(steps_a) > 0 and steps_a == steps_b,
                f"{other}: per-step (step, loss, grad norm) {steps_b} differ from {ref}'s {steps_a}")
    wa, wb = tmp / f"{ref}.hf" / "model.safetensors", tmp / f"{other}.hf" / "model.safetensors"
    ok = expect(wa.exists() and wb.exists() and wa.read_bytes() == wb.read_bytes(),
                f"{other}: exported model.safetensors differs from {ref}'s (or is missing)") and ok
    if ok:
        print(f"  {other} == {ref}: {len(steps_a)} steps, last loss {steps_a[-1][1]!r}, weights identical", flush=True)
    return ok


def torchrun_argv(nnodes, node, nproc, rdzv, endpoint, run_id, addr, extra=(), max_restarts=0, rdzv_conf=()):
    # c10d: node 0's agent hosts the rendezvous store. torchrun decides that by matching the
    # endpoint with the host name, which in a namespace is the host's; so it is said (is_host).
    keys = ([f"is_host={1 if node == 0 else 0}"] if rdzv == "c10d" else []) + list(rdzv_conf)
    conf = [f"--rdzv-conf={','.join(keys)}"] if keys else []
    return ["torchrun", f"--nnodes={nnodes}", f"--node-rank={node}", f"--nproc-per-node={nproc}",
            f"--rdzv-backend={rdzv}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", f"--local-addr={addr}",
            *conf, f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "--redirects=1", "--tee=1",
            "--no-python", *extra]


def start_etcd(c, tmp):
    etcd = shutil.which("etcd")
    if not expect(etcd is not None, "etcd not found (Debian: etcd-server, installed by scripts/deps.sh)"):
        return None
    url = f"http://{c.addr(0)}:2379"
    c.popen(0, ["timeout", "-k", "5", str(int(left()) + 10), etcd, "--name", "rdzv",
                "--data-dir", str(tmp / "etcd-data"), "--enable-v2=true", "--listen-client-urls", url,
                "--advertise-client-urls", url, "--listen-peer-urls", f"http://{c.addr(0)}:2380",
                "--initial-advertise-peer-urls", f"http://{c.addr(0)}:2380",
                "--initial-cluster", f"rdzv=http://{c.addr(0)}:2380"], log=tmp / "etcd.log")
    for _ in range(100):
        r = subprocess.run(c.argv(0, ["python3", "-c", f"import urllib.request,json;"
                                      f"print(json.load(urllib.request.urlopen('{url}/health',timeout=1))['health'])"]),
                           capture_output=True, text=True)
        if r.stdout.strip() == "true":
            return f"{c.addr(0)}:2379"
        time.sleep(0.2)
    expect(False, "etcd did not come up in node 0")
    show_logs([tmp / "etcd.log"])
    return None


# ---- checks ---------------------------------------------------------------------------------------

def check_parity(a, tmp):
    steps = 3
    with netcluster.Cluster(2, tag="par") as c:
        master = c.addr(0)
        print("reference: 2 processes on one host (FULL_SHARD)", flush=True)
        run_nodes(c, tmp, "ref2", [train_args(a, tmp, "ref2", steps, ["--nproc-per-node", "2"])])

        print("fsdp-train's launcher: 2 nodes x 1 process (--nnodes 2 --node-rank i --master-addr)", flush=True)
        run_nodes(c, tmp, "own2x1", [train_args(a, tmp, "own2x1", steps, [
            "--nnodes", "2", "--node-rank", str(i), "--master-addr", master, "--master-port", "29500"])
            for i in range(2)])
        same_training(tmp, "ref2", "own2x1")

        print("c10d's ProcessGroupGloo across the nodes (--backend gloo): the TCP group's bits", flush=True)
        run_nodes(c, tmp, "gloo2x1", [train_args(a, tmp, "gloo2x1", steps, [
            "--backend", "gloo", "--nnodes", "2", "--node-rank", str(i), "--master-addr", master,
            "--master-port", "29500"]) for i in range(2)])
        same_training(tmp, "ref2", "gloo2x1")
        text = (tmp / "gloo2x1.node0.log").read_text(errors="replace")
        expect(f"process group: c10d ProcessGroupGloo (LibTorch " in text and f"address {master} " in text,
               f"--backend gloo across nodes: rank 0's log does not name c10d's ProcessGroupGloo on {master}")

        print("torchrun --nnodes 2 --node-rank i, c10d rendezvous", flush=True)
        run_nodes(c, tmp, "c10d2x1", [torchrun_argv(2, i, 1, "c10d", f"{master}:29400", "c10d-parity", c.addr(i),
                                                    train_args(a, tmp, "c10d2x1", steps)) for i in range(2)])
        same_training(tmp, "ref2", "c10d2x1")

        endpoint = start_etcd(c, tmp)
        if endpoint:
            print("torchrun --nnodes 2 --node-rank i, etcd rendezvous (etcd in node 0)", flush=True)
            run_nodes(c, tmp, "etcd2x1", [torchrun_argv(2, i, 1, "etcd", endpoint, f"etcd-parity-{os.getpid()}",
                                                        c.addr(i), train_args(a, tmp, "etcd2x1", steps))
                                          for i in range(2)])
            same_training(tmp, "ref2", "etcd2x1")

        print("HYBRID, one shard group per node: 2 nodes x 2 processes vs 4 local processes, shard size 2",
              flush=True)
        hybrid = ["--sharding", "hybrid"]
        run_nodes(c, tmp, "ref4h", [train_args(a, tmp, "ref4h", steps,
                                               [*hybrid, "--hybrid-shard-size", "2", "--nproc-per-node", "4"])])
        run_nodes(c, tmp, "own2x2h", [train_args(a, tmp, "own2x2h", steps, [
            *hybrid, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", str(i), "--master-addr", master])
            for i in range(2)])
        same_training(tmp, "ref4h", "own2x2h")
        # The shard groups really were the nodes: the default shard size is LOCAL_WORLD_SIZE.
        text = (tmp / "own2x2h.node0.log").read_text(errors="replace")
        expect(re.search(r"shard group 2 x 2 replicas", text) is not None,
               "HYBRID over 2 nodes x 2: the plan line does not say 'shard group 2 x 2 replicas'")


def check_linkcut(a, tmp):
    timeout_s = 5
    with netcluster.Cluster(2, tag="cut") as c:
        argvs = [train_args(a, tmp, "cut", 100000, [
            "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", str(i), "--master-addr", c.addr(0),
            "--timeout", str(timeout_s)]) for i in range(2)]
        logs = [tmp / f"cut.node{i}.log" for i in range(2)]
        procs = [c.popen(i, argv, env=env_for(), log=logs[i]) for i, argv in enumerate(argvs)]
        # Cut once training runs (rank 0 logged a few steps): a step is a few ms of
        # compute and many collectives, so the cut lands inside one.
        while time.time() < DEADLINE - 60 and all(p.poll() is None for p in procs):
            if len(re.findall(r"Batch \d+ Loss", logs[0].read_text(errors="replace"))) >= 3:
                break
            time.sleep(0.1)
        if not expect(all(p.poll() is None for p in procs), "the job ended before the cut"):
            show_logs(logs)
            return
        cut_at = time.time()
        c.link(1, up=False)
        print(f"  cut node 1's link (ip link set eth0 down) after step 3", flush=True)
        # Bound: --timeout for the collective, then the launcher's kill grace (10 s) for
        # siblings that are stuck elsewhere, plus start-up slack of a loaded machine.
        bound = timeout_s + 10 + 10
        exited = [None, None]
        while time.time() < cut_at + bound + 5 and None in exited:
            for i, p in enumerate(procs):
                if exited[i] is None and p.poll() is not None:
                    exited[i] = time.time() - cut_at
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        print(f"  node launchers exited {['%.1f s' % e if e is not None else 'no' for e in exited]} after the cut, "
              f"codes {codes}", flush=True)
        ok = expect(all(e is not None and e <= bound for e in exited),
                    f"every node's launcher must exit within {bound} s of the cut (--timeout {timeout_s} + kill "
                    f"grace + slack); exited after {exited}")
        ok = expect(all(code not in (None, 0) for code in codes), f"exit codes {codes}: a lost node is a failure") and ok
        text0 = logs[0].read_text(errors="replace")
        errors0 = [line for line in text0.splitlines() if "error" in line or "did not" in line]
        for line in errors0[:6]:
            print(f"  node 0: {line}")
        names_lost = [line for line in errors0 if re.search(r"\branks? (2|3)\b|\branks 2, 3\b|\brank [23]\b", line)]
        ok = expect(len(names_lost) > 0, "node 0's ranks did not name node 1's ranks (2, 3) in their errors") and ok
        text1 = logs[1].read_text(errors="replace")
        ok = expect(re.search(r"\brank [01]\b|\branks 0, 1\b", text1) is not None,
                    "node 1's ranks did not name node 0's ranks (0, 1) in their errors") and ok
        if not ok:
            show_logs(logs)


def check_elastic(a, tmp):
    steps = 24
    ckpt = ["--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "1", "--keep-last", "2", "--resume",
            "--timeout", "4"]
    with netcluster.Cluster(2, tag="ela") as c:
        print("reference: the same run uninterrupted, 2 processes on one host", flush=True)
        run_nodes(c, tmp, "ref", [train_args(a, tmp, "ref", steps, ["--nproc-per-node", "2"])])
        print("torchrun c10d --max-restarts 2 on 2 nodes; node 1's link cut mid-run, then restored", flush=True)
        logs = [tmp / f"ela.node{i}.log" for i in range(2)]
        argvs = [torchrun_argv(2, i, 1, "c10d", f"{c.addr(0)}:29400", "elastic", c.addr(i),
                               train_args(a, tmp, "ela", steps, ckpt), max_restarts=2) for i in range(2)]
        procs = [c.popen(i, argv, env=env_for(), log=logs[i]) for i, argv in enumerate(argvs)]
        while time.time() < DEADLINE - 60 and all(p.poll() is None for p in procs):
            if len(re.findall(r"Batch \d+ Loss", logs[0].read_text(errors="replace") +
                              logs[1].read_text(errors="replace"))) >= 4:
                break
            time.sleep(0.1)
        if not expect(all(p.poll() is None for p in procs), "the job ended before the cut"):
            show_logs(logs)
            return
        c.link(1, up=False)
        print("  cut node 1's link", flush=True)
        # Wait until a worker has failed (the timeout names the missing rank), then restore.
        t0 = time.time()
        while time.time() < t0 + 30 and not any("did not" in l.read_text(errors="replace") for l in logs):
            time.sleep(0.2)
        time.sleep(1)
        c.link(1, up=True)
        print(f"  restored it after {time.time() - t0:.1f} s", flush=True)
        codes = wait_all(procs, 120)
        text = logs[0].read_text(errors="replace") + logs[1].read_text(errors="replace")
        ok = expect(codes == [0, 0], f"after the restart both nodes must finish: exit codes {codes}")
        resumed = re.findall(r"Resumed from .*?step (\d+)", text)
        ok = expect(len(resumed) > 0, "no worker resumed from a checkpoint after the restart") and ok
        ok = expect("failed (exitcode: 1)" in text,
                    "torchrun did not report a failed worker (its restart is what this checks)") and ok
        if resumed:
            print(f"  resumed at step {resumed[0]}", flush=True)
        ok = same_training_weights(tmp, "ref", "ela") and ok
        if not ok:
            show_logs(logs, 5000)


# torchrun's elastic settings for the lost node (docs/clusters.md, "Losing a node for good"): how soon a
# silent node is dropped (c10d: keep_alive_interval x keep_alive_max_attempt; etcd: its fixed 10 s
# keep-alive TTL) and how long a rendezvous that has its minimum waits for more (last_call_timeout).
LOSE_CONF = {"c10d": ["last_call_timeout=2", "keep_alive_interval=1", "keep_alive_max_attempt=3"],
             "etcd": ["last_call_timeout=2"]}
LOSE_RATE_MBIT = 100  # a floor under each step's time, so the run outlasts the loss
# While node 2 is away and its agent comes back, every link runs at this rate: at 100 Mbit/s
# the two survivors trained their last 36 steps in less than the 8-15 s the returned agent
# takes to join, and the job ended at 2 nodes (seen in CI). At 20 Mbit/s a step's
# collectives take ~5 times as long (still far inside --timeout 4), so the return is
# seen with most steps left; the rendezvous' own messages are small. Numerics do not
# depend on the rate.
LOSE_AWAY_RATE_MBIT = 20
BATCH_LINE = re.compile(r"Batch (\d+) Loss")
THREE_RANKS_LINE = re.compile(r"\b3 ranks \(torchrun\)")


def world_segments(recs):
    """[(world size, first step, last step)] of a metrics file's step records, in step order."""
    segs = []
    for r in sorted(recs, key=lambda r: r["step"]):
        if "loss" not in r:
            continue
        if segs and segs[-1][0] == r["world_size"] and segs[-1][2] == r["step"] - 1:
            segs[-1][2] = r["step"]
        else:
            segs.append([r["world_size"], r["step"], r["step"]])
    return [tuple(s) for s in segs]


def check_lose(a, tmp, rdzv):
    """3 nodes under torchrun --nnodes 2:3; node 2 gone for good mid-run, later back."""
    steps = 40
    name = f"lose-{rdzv}"
    # c10d: a save every step and --global-batch-size (the same rows per step at 3 and 2 nodes);
    # etcd: background saves every 3 steps and the default batch rule (per-rank batch kept).
    if rdzv == "c10d":
        policy = ["--checkpoint-every", "1", "--global-batch-size", "12"]
    else:
        policy = ["--checkpoint-every", "3", "--async-checkpoint"]
    common = [*policy, "--checkpoint-dir", str(tmp / f"{name}.ckpt"), "--keep-last", "2", "--resume",
              "--timeout", "4"]
    with netcluster.Cluster(3, rate_mbit=LOSE_RATE_MBIT, tag="los") as c:
        endpoint = f"{c.addr(0)}:29400" if rdzv == "c10d" else start_etcd(c, tmp)
        if endpoint is None:
            return
        logs = [tmp / f"{name}.node{i}.log" for i in range(3)] + [tmp / f"{name}.node2-back.log"]

        def agent(i, log):
            argv = torchrun_argv("2:3", i, 1, rdzv, endpoint, f"{name}-{os.getpid()}", c.addr(i),
                                 train_args(a, tmp, name, steps, common), max_restarts=3,
                                 rdzv_conf=LOSE_CONF[rdzv])
            # torch 2.11's c10d rendezvous caches the first round's master address in every agent
            # that hosted or joined it (TCPStore sharing), so a node joining a later round waits for
            # keys nobody writes; without the sharing each round publishes them (docs/clusters.md).
            extra_env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if rdzv == "c10d" else None
            return c.popen(i, argv, env=env_for(extra_env), log=log)

        def text():
            return "".join(l.read_text(errors="replace") for l in logs if l.exists())

        def wait_for(pred, what, seconds):
            end = min(time.time() + seconds, DEADLINE - 20)
            while time.time() < end and procs[0].poll() is None:
                if pred():
                    return True
                time.sleep(0.1)
            expect(False, f"{name}: {what} (waited up to {seconds} s)")
            show_logs(logs, 4000)
            return False

        print(f"torchrun --nnodes 2:3 ({rdzv} rendezvous) on 3 nodes, {' '.join(policy)}", flush=True)
        procs = [agent(i, logs[i]) for i in range(3)]
        if not wait_for(lambda: len(BATCH_LINE.findall(text())) >= 4, "the 3-node job did not train", 90):
            return
        before = max(int(n) for n in BATCH_LINE.findall(text()))
        t_lost = time.time()
        c.power_off(2)
        print(f"  node 2 powered off after step {before}", flush=True)
        if not wait_for(lambda: re.search(r"\b2 ranks\b", text()) and
                        len(RESUMED_LINE.findall(text())) >= 1, "the job did not re-form at 2 nodes", 90):
            return
        resumed = int(RESUMED_LINE.findall(text())[0])
        t_shrunk = time.time() - t_lost
        print(f"  re-formed at 2 nodes {t_shrunk:.1f} s later, resumed from step {resumed} "
              f"({before + 1 - resumed} step(s) trained again)", flush=True)
        c.shape(LOSE_AWAY_RATE_MBIT)
        c.link(2, up=True)
        t_back = time.time()
        procs.append(agent(2, logs[3]))
        def grown(t):  # a second job start at 3 ranks (a resume at 2 is the job re-formed without a node)
            return len(THREE_RANKS_LINE.findall(t)) >= 2 and len(RESUMED_LINE.findall(t)) >= 2

        if not wait_for(lambda: grown(text()), "the job did not grow back to 3 nodes", 90):
            return
        c.shape(LOSE_RATE_MBIT)
        print(f"  node 2 back: grown to 3 nodes {time.time() - t_back:.1f} s after its agent started", flush=True)
        codes = wait_all([procs[0], procs[1], procs[3]], 120)
        ok = expect(codes == [0, 0, 0], f"{name}: the agents of nodes 0, 1 and the returned 2 must finish: exit "
                                        f"codes {codes}")
        segs = world_segments(records(tmp, name))
        print(f"  world size by steps (the metrics file): {segs}", flush=True)
        ok = expect([w for w, _, _ in segs] == [3, 2, 3] and segs[0][1] == 0 and segs[-1][2] == steps - 1,
                    f"{name}: steps 0..{steps - 1} must run at 3, then 2, then 3 ranks; got {segs}") and ok
        if not ok:
            show_logs(logs, 4000)
            return
        # The reference changes world size at the same steps on purpose: --stop-at-step, then --resume.
        ref = f"{name}-ref"
        for w, first, last in segs:
            stop = [] if last == steps - 1 else ["--stop-at-step", str(last + 1)]
            if not run_nodes(c, tmp, f"{ref}-{first}", [train_args(a, tmp, ref, steps, [
                    "--nproc-per-node", str(w), *policy, "--checkpoint-dir", str(tmp / f"{ref}.ckpt"), "--resume",
                    *stop])]):
                return
        same_training(tmp, ref, name)


def check_lose_c10d(a, tmp):
    check_lose(a, tmp, "c10d")


def check_lose_etcd(a, tmp):
    check_lose(a, tmp, "etcd")


def same_training_weights(tmp, ref, other):
    wa, wb = tmp / f"{ref}.hf" / "model.safetensors", tmp / f"{other}.hf" / "model.safetensors"
    ok = expect(wa.exists() and wb.exists() and wa.read_bytes() == wb.read_bytes(),
                f"{other}: the exported weights differ from the uninterrupted run's (or are missing)")
    if ok:
        print(f"  {other}'s exported weights == {ref}'s, byte for byte", flush=True)
    return ok


PROFILE = re.compile(r"Profile step (\d+): ([\d.]+) ms \(rank 0\).*communication ([\d.]+) ms on the lanes, "
                     r"exposed ([\d.]+) ms")


def traced(a, tmp, c, name):
    argvs = [train_args(a, tmp, name, 5, ["--nnodes", "2", "--node-rank", str(i), "--master-addr", c.addr(0),
                                          "--profile-steps", "2:4", "--profile-file", str(tmp / f"{name}.trace.json")])
             for i in range(2)]
    if not run_nodes(c, tmp, name, argvs):
        return None
    lines = PROFILE.findall((tmp / f"{name}.node0.log").read_text(errors="replace"))
    if not expect(len(lines) == 2, f"{name}: expected 2 'Profile step' lines, got {lines}"):
        return None
    step = sum(float(s) for _, s, _, _ in lines)
    exposed = sum(float(e) for _, _, _, e in lines)
    lanes = sum(float(l) for _, _, l, _ in lines)
    # The same from the merged Chrome trace: rank 0's training thread, comm spans, inside the steps.
    trace = json.loads((tmp / f"{name}.trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    steps = [e for e in events if e.get("ph") == "X" and e.get("pid") == 0 and e.get("cat") == "step"]
    main_comm = [e for e in events if e.get("ph") == "X" and e.get("pid") == 0 and e.get("cat") == "comm"
                 and names.get((0, e["tid"])) == "main"]
    covered = 0.0
    for s in steps:
        b, end = s["ts"], s["ts"] + s["dur"]
        spans = sorted((max(b, e["ts"]), min(end, e["ts"] + e["dur"])) for e in main_comm
                       if e["ts"] < end and e["ts"] + e["dur"] > b)
        cur = None
        for x, y in spans:
            if cur is None or x > cur[1]:
                if cur:
                    covered += cur[1] - cur[0]
                cur = [x, y]
            else:
                cur[1] = max(cur[1], y)
        if cur:
            covered += cur[1] - cur[0]
    trace_step = sum(s["dur"] for s in steps) / 1e3
    # Bytes rank 0 sent in the traced steps: each collective's logical buffer (the
    # metrics' counters), half of which goes to the other rank (2 ranks).
    sent = sum(r["allgather_bytes"] + r["reduce_scatter_bytes"] + r["allreduce_bytes"]
               for r in records(tmp, name) if r["step"] in (2, 3)) / 2
    print(f"  {name}: traced steps {step:.1f} ms, exposed {exposed:.1f} ms ({100 * exposed / step:.0f}%), "
          f"lanes {lanes:.1f} ms, {sent / 1e6:.2f} MB sent; from the trace: {covered / 1e3:.1f} of {trace_step:.1f} "
          f"ms waiting", flush=True)
    return step, exposed, covered / 1e3, trace_step, sent


def check_slowlink(a, tmp):
    with netcluster.Cluster(2, tag="slo") as c:
        fast = traced(a, tmp, c, "fast")
        # The smallest bucket: with a user's 256 KiB one, the bursts after idle moments pass
        # faster than the rate, and the floor below would not hold for this tiny model's steps.
        c.shape(100, bucket=netcluster.STRICT_BUCKET)
        print("  links shaped to 100 Mbit/s (tc tbf, both directions, one-segment bucket)", flush=True)
        slow = traced(a, tmp, c, "slow")
    if not fast or not slow:
        return
    # The shaper's floor: 100 Mbit/s cannot move rank 0's bytes faster (a check that
    # the link was shaped, not a timing: a loaded machine only makes steps longer).
    floor_ms = slow[4] / (100e6 / 8) * 1e3
    expect(slow[0] >= 0.9 * floor_ms, f"the traced steps took {slow[0]:.1f} ms, below the {floor_ms:.1f} ms that "
           f"{slow[4] / 1e6:.2f} MB need at 100 Mbit/s: the link was not shaped")
    ratio = slow[1] / slow[0]
    expect(ratio >= 0.5, f"at 100 Mbit/s the exposed communication is only {100 * ratio:.0f}% of the traced steps "
           "(expected >= 50%: the tiny model's ~3.6 MB of parameters move 3 times per step over a 12.5 MB/s link)")
    expect(slow[2] / slow[3] >= 0.5, f"the merged trace shows rank 0 waiting {slow[2]:.1f} of {slow[3]:.1f} ms "
           "at 100 Mbit/s (expected >= 50%)")
    expect(ratio > fast[1] / fast[0], f"exposed share at 100 Mbit/s ({100 * ratio:.0f}%) is not above the unshaped "
           f"link's ({100 * fast[1] / fast[0]:.0f}%)")


def check_discovery(a, tmp):
    hosts = tmp / "hosts"
    name = os.uname().nodename  # the namespaces share the host's UTS namespace
    hosts.write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n")
    env = env_for()
    env.pop("GLOO_SOCKET_IFNAME")
    with netcluster.Cluster(2, tag="dis") as c:
        # In the node's mount namespace (ip netns exec makes one) only: the host's /etc/hosts is untouched.
        wrap = ["sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
        argvs = [wrap + train_args(a, tmp, "dis", 2, ["--nnodes", "2", "--node-rank", str(i), "--master-addr",
                                                      c.addr(0)]) for i in range(2)]
        probe = subprocess.run(c.argv(1, [*wrap, "getent", "hosts", name]), capture_output=True, text=True)
        expect(probe.stdout.split()[:1] == ["127.0.1.1"],
               f"inside node 1 the host name '{name}' should resolve to 127.0.1.1: {probe.stdout!r} {probe.stderr!r}")
        if not run_nodes(c, tmp, "dis", argvs, env=env):
            return
        # Rank 0 logs its group's transport; rank 1 dialled the address rank 0 advertised (the run's success).
        text = (tmp / "dis.node0.log").read_text(errors="replace")
        line = next((l for l in text.splitlines() if "process group:" in l), "")
        if expect(f"address {c.addr(0)} (the interface that routes to MASTER_ADDR {c.addr(0)}" in line,
                  f"node 0: the process group should advertise {c.addr(0)} from the route to MASTER_ADDR, its log "
                  f"says: {line!r}"):
            print(f"  node 0: {line.strip()}", flush=True)


def check_headtohead(a, tmp):
    cfg = tmp / "llama-tiny.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                               "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 4,
                               "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 256,
                               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
                               "hidden_act": "silu"}))
    build = Path(a.train).resolve().parents[1]
    out = tmp / "h2h.json"
    bench = Path(a.source) / "bench" / "cluster" / "headtohead.py"
    argv = [sys.executable, str(bench), "--build", str(build), "--model", str(cfg), "--seq-len", "64",
            "--batch-size", "2", "--warmup", "1", "--steps", "2", "--timeout-s", str(int(left())),
            "--rows", "2x1-full-fp32-150,2x1-full-fp32-150+ag-int8+rs-bf16", "--json-out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=left())
    print(r.stdout[-3000:], flush=True)
    if not expect(r.returncode == 0 and out.exists(), f"headtohead.py exited {r.returncode}: {r.stderr[-3000:]}"):
        return
    rows = {row["row"]: row for row in json.loads(out.read_text())}
    plain, packed = rows.get("2x1-full-fp32-150"), rows.get("2x1-full-fp32-150+ag-int8+rs-bf16")
    if not expect(plain is not None and packed is not None, f"rows missing from the table: {sorted(rows)}"):
        return
    for row in (plain, packed):
        for key in ("tps_ours", "tps_theirs", "ratio", "step_ours", "step_theirs", "compute_ours", "compute_theirs"):
            expect(row[key] > 0, f"{row['row']}: {key} = {row[key]}")
        expect(row["exposed_ours"] >= 0 and row["exposed_theirs"] >= 0, f"{row['row']}: exposed communication "
               f"{row['exposed_ours']} / {row['exposed_theirs']}")
    expect(plain["loss0_rel"] < 1e-3, f"the first step's loss differs by {plain['loss0_rel']:.1e} between the sides")
    expect(packed["mb_ours"] < 0.5 * plain["mb_ours"], f"int8 all-gather + bf16 reduce-scatter moved "
           f"{packed['mb_ours']:.2f} MB per step, the native wire {plain['mb_ours']:.2f} MB (expected under half)")


def link_bytes(c, node):
    """Bytes through node `node`'s link so far, both directions (its eth0's counters)."""
    stats = "/sys/class/net/eth0/statistics"
    r = subprocess.run(c.argv(node, ["cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes"]), capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"reading node {node}'s link counters failed: {r.stderr.strip()}")
    return sum(int(x) for x in r.stdout.split())


def check_hpz(a, tmp):
    steps = 4
    crossed = {}
    with netcluster.Cluster(2, tag="hpz") as c:
        for wire in ("native", "int8"):
            for reshard in ("true", "2"):
                name = f"hpz-{wire}-{reshard}"
                print(f"2 nodes x 2 processes, --all-gather-wire {wire} --reshard-after-forward {reshard}", flush=True)
                before = link_bytes(c, 1)
                if not run_nodes(c, tmp, name, [train_args(a, tmp, name, steps, [
                        "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", str(i), "--master-addr", c.addr(0),
                        "--all-gather-wire", wire, "--reshard-after-forward", reshard]) for i in range(2)]):
                    return
                crossed[name] = link_bytes(c, 1) - before
            same_training(tmp, f"hpz-{wire}-true", f"hpz-{wire}-2")
    for wire in ("native", "int8"):
        full, hpz = crossed[f"hpz-{wire}-true"], crossed[f"hpz-{wire}-2"]
        print(f"  {wire} all-gather: node 1's link carried {full / 1e6:.2f} MB, with hpZ {hpz / 1e6:.2f} MB "
              f"({hpz / full:.2f})", flush=True)
    full, hpz = crossed["hpz-native-true"], crossed["hpz-native-2"]
    expect(hpz < 0.8 * full, f"with --reshard-after-forward 2 node 1's link carried {hpz / 1e6:.2f} MB, the default "
           f"{full / 1e6:.2f} MB: expected under 0.8 of it (backward's all-gathers inside the node)")


def check_cleanup(a, tmp):
    """The fixture leaves nothing behind: a test process killed with SIGKILL while its
    cluster runs a process (the watchdog reaps), and a dead run's namespaces (the next
    cluster reaps them)."""
    script = tmp / "victim.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import netcluster\n"
        "c = netcluster.Cluster(3, rate_mbit=100, tag='victim')\n"
        "c.popen(1, ['sleep', '300'])\n"
        "print(c.run_prefix, flush=True)\n"
        "time.sleep(300)\n")
    victim = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    prefix = victim.stdout.readline().strip()
    ours = lambda: [ns for ns in netcluster._namespaces() if prefix and ns.startswith(prefix)]  # noqa: E731
    expect(len(ours()) == 4, f"the victim's cluster should have 4 namespaces (3 nodes, the switch): {ours()}")
    sleepers = [p for p in netcluster._namespaces() if p.startswith(prefix)]
    pids = [pid for ns in sleepers for pid in netcluster._run(["ip", "netns", "pids", ns], check=False).stdout.split()]
    expect(len(pids) == 1, f"the victim's node 1 should run one process (sleep), got {pids}")
    victim.kill()  # SIGKILL: no clean-up code of its own runs
    victim.wait()
    end = time.time() + 15
    while time.time() < end and ours():
        time.sleep(0.1)
    expect(not ours(), f"SIGKILL of the test process left namespaces behind: {ours()}")
    def running(pid):  # a killed process may stay a zombie until its new parent reaps it
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    expect(not any(running(pid) for pid in pids),
           f"SIGKILL of the test process left its cluster's processes running: {pids}")
    # A dead run's leftovers (as if even the watchdog had been killed): the next cluster reaps them.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netcluster.PREFIX}{dead.pid}-0-stale-n0"
    netcluster._run(["ip", "netns", "add", stale])
    with netcluster.Cluster(1, tag="cln"):
        expect(stale not in netcluster._namespaces(), f"a new cluster did not reap the dead run's namespace {stale}")
    netcluster._run(["ip", "netns", "delete", stale], check=False)
    print(f"  SIGKILLed test: its 4 namespaces and 1 process gone; a dead run's namespace reaped", flush=True)


CHECKS = {"lose-c10d": check_lose_c10d, "lose-etcd": check_lose_etcd, "hpz": check_hpz, "headtohead": check_headtohead, "discovery": check_discovery, "cleanup": check_cleanup, "parity": check_parity, "linkcut": check_linkcut, "elastic": check_elastic, "slowlink": check_slowlink}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=sorted(CHECKS))
    ap.add_argument("--train", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    a.train = str(Path(a.train).resolve())
    t0 = time.time()
    global DEADLINE
    DEADLINE = t0 + BUDGET_S.get(a.check, 170)
    missing = netcluster.check_capabilities()
    if missing:
        print(f"FAIL: this host cannot build the emulated cluster: {missing}")
        return 1
    if shutil.which("torchrun") is None and a.check in ("parity", "elastic", "lose-c10d", "lose-etcd"):
        print("FAIL: torchrun not found on PATH (the project's Python environment: scripts/venv.sh)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix=f"fsdp-cluster-{a.check}."))
    # A signal from CTest (timeout) must still run the clean-up below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        CHECKS[a.check](a, tmp)
    except Exception as e:  # noqa: BLE001 — report, clean up, fail
        failures.append(f"{type(e).__name__}: {e}")
        print(f"  FAIL: {type(e).__name__}: {e}")
    finally:
        if os.environ.get("FSDP_KEEP_TEST_DIR") == "1":
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'PASS' if not failures else 'FAIL'}: {a.check}, {len(failures)} failure(s), {time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

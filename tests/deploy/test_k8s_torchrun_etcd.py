#!/usr/bin/env python3
"""Runs the generated PyTorchJob's container command for real, without a cluster.

    test_k8s_torchrun_etcd.py SOURCE_DIR FSDP_TRAIN

What a worker pod would do is done here with the manifests' own text:
  - etcd starts with the flags of the generated etcd Deployment (Debian's
    etcd-server; listen/advertise addresses moved to 127.0.0.1),
  - two "pods" run the PyTorchJob container's command verbatim (bash launcher
    script, torchrun with the etcd rendezvous, fsdp-train and its arguments)
    with the container's env plus the PET_* variables the Kubeflow operator
    derives from elasticPolicy; only the rendezvous host "etcd" is replaced by
    127.0.0.1, as cluster DNS would resolve it.
Passes when both pods exit 0, the rendezvous went through etcd (its run key
exists), fsdp-train saw 2 ranks launched by torchrun, and exactly one pod
(rank 0's) logged "Batch N Loss: X, Speed: Y samples/sec, lr: Z" for every
step. With an fsdp-train that has --checkpoint-dir, the checkpoint must land
on the "shared volume", and a second run, regenerated with a new rendezvous
id as the README says, must resume there: its Batch lines start where the
first run stopped.

Then the launcher script's SIGTERM path: one pod whose "fsdp-train" is a
stand-in that waits for SIGTERM, "saves" for 2 s and exits 0. SIGTERM goes
to the container's PID 1 (the bash launcher) as the kubelet sends it, and
then once more. Passes
when each worker got exactly one SIGTERM (fsdp-train stops without saving on
a second), the pod exits 0, and torchrun itself was never signalled (it would
SIGKILL the workers 30 s later) — with a control run showing that a bare
torchrun as PID 1 does get signalled, so that check is not vacuous.

Exit 0 pass, 1 fail, 77 skip when torchrun (the project's Python environment), etcd
(etcd-server) or python-etcd is not installed.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

SRC = Path(sys.argv[1]).resolve()
FSDP_TRAIN = str(Path(sys.argv[2]).resolve())
GENERATOR = SRC / "deploy" / "kubernetes" / "generate.py"
CORPUS = SRC / "data" / "fallback_corpus.jsonl"
STEPS = 3
SKIP = 77
# Every wait ends by this (seconds from the start), well inside CTest's TIMEOUT, so
# the test always gets to clean up; etcd also dies on its own after LIFETIME.
BUDGET = 180
LIFETIME = 230
DEADLINE = time.time() + BUDGET

failures = []
procs = []  # every process group started here, for cleanup
TMP = None  # the test's temp directory


def expect(cond, message):
    if not cond:
        failures.append(message)
        print(f"  FAIL: {message}")
    return cond


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start(cmd, env, log, cwd):
    p = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=cwd,
                         start_new_session=True)
    procs.append(p)
    return p


def stop_all():
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def preconditions():
    torchrun = shutil.which("torchrun")
    etcd = shutil.which("etcd")
    if not torchrun:
        return None, None, "torchrun not found on PATH (the project's Python environment has it: scripts/venv.sh)"
    if not etcd:
        return None, None, "etcd not found (Debian: etcd-server)"
    shebang = Path(torchrun).read_text(errors="replace").splitlines()[0]
    python = shebang[2:].strip().split()[0] if shebang.startswith("#!") else sys.executable
    if subprocess.run([python, "-c", "import etcd"], capture_output=True).returncode != 0:
        return None, None, f"torchrun's Python ({python}) cannot import etcd (python-etcd, in the project's Python environment: scripts/venv.sh)"
    return torchrun, etcd, None


def generate(tmp, args):
    out = tmp / f"manifests-{len(list(tmp.glob('manifests-*')))}"
    r = subprocess.run([sys.executable, str(GENERATOR), *args, "--output-dir", str(out)], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"generate.py failed: {r.stderr}")
    job = yaml.safe_load((out / "pytorchjob.yaml").read_text())
    etcd_docs = list(yaml.safe_load_all((out / "etcd.yaml").read_text()))
    return job, next(d for d in etcd_docs if d and d["kind"] == "Deployment")


def pod_env(job, container, rdzv_host):
    """The container's environment: its own env list, plus what the Kubeflow operator
    adds for an elastic PyTorchJob (pkg/controller.v1/pytorch/elastic.go, envvar.go)."""
    ep = job["spec"]["elasticPolicy"]
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["TMPDIR"] = TMP  # torchrun's log directories land in the test's temp dir
    env["PET_MONITOR_INTERVAL"] = "1"  # test speed: torchrun notices finished workers within 1 s, not 5
    env.update({e["name"]: e["value"] for e in container["env"]})
    env.update({
        "PYTHONUNBUFFERED": "0",
        "PET_RDZV_ENDPOINT": f"{rdzv_host}:{ep['rdzvPort']}",
        "PET_RDZV_BACKEND": ep["rdzvBackend"],
        "PET_NNODES": f"{ep['minReplicas']}:{ep['maxReplicas']}",
        "PET_MAX_RESTARTS": str(ep["maxRestarts"]),
        "PET_NPROC_PER_NODE": str(ep["nProcPerNode"]),
        "PET_RDZV_ID": ep["rdzvId"],
    })
    return env


def pod_command(job, container, rdzv_host):
    """The container command, verbatim but for the rendezvous host (cluster DNS)."""
    host = job["spec"]["elasticPolicy"]["rdzvHost"]
    return [re.sub(rf"^--rdzv_endpoint={re.escape(host)}:", f"--rdzv_endpoint={rdzv_host}:", a)
            for a in container["command"]]


def start_etcd(etcd, deployment, tmp, client_port):
    """etcd with the Deployment's flags; addresses moved to loopback, a private data dir."""
    (peer_port,) = free_ports(1)
    args = []
    for a in deployment["spec"]["template"]["spec"]["containers"][0]["command"][1:]:
        if a.startswith("--listen-client-urls=") or a.startswith("--advertise-client-urls="):
            a = re.sub(r"//[^:/]+:", "//127.0.0.1:", a)
        elif a.startswith("--data-dir="):
            a = f"--data-dir={tmp / 'etcd-data'}"
        args.append(a)
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--name="))
    peer = f"http://127.0.0.1:{peer_port}"
    args += [f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster={name}={peer}"]
    p = start(["timeout", "-k", "5", str(LIFETIME), etcd, *args], dict(os.environ), tmp / "etcd.log", tmp)
    deadline = time.time() + 20
    while time.time() < deadline:
        if p.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/health", timeout=1) as r:
                if json.load(r).get("health") == "true":
                    return p
        except OSError:
            time.sleep(0.2)
    print((tmp / "etcd.log").read_text()[-3000:])
    raise RuntimeError(f"etcd with the manifest's flags did not come up ({args})")


def wait_all(ps, timeout):
    deadline = min(time.time() + timeout, DEADLINE)
    for p in ps:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in ps]


BATCH = re.compile(r"^\[\w+\]:.*\[fsdp-train\] Batch (\d+) Loss: \d+\.\d+, Speed: \d+\.\d+ samples/sec, lr: \d+\.\d+ \| step \d+/\d+, \d+ tokens/s, grad norm \S+, peak mem .+, ETA \S+$",
                   re.M)


def run_pods(tmp, name, gen_args):
    """Generates a job, runs its pods to the end; returns (job, container, logs)."""
    job, _ = generate(tmp, gen_args)
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    replicas = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    cmd = pod_command(job, container, "127.0.0.1")
    print("  pod command: ... " + " ".join(cmd[cmd.index("torchrun"):]))
    pods = [start(cmd, pod_env(job, container, "127.0.0.1"), tmp / f"{name}-pod{i}.log", tmp) for i in range(replicas)]
    codes = wait_all(pods, 150)
    logs = [(tmp / f"{name}-pod{i}.log").read_text() for i in range(replicas)]
    for i, (code, log) in enumerate(zip(codes, logs)):
        if not expect(code == 0, f"{name}: pod {i} exited {code} (None: still running)"):
            print(f"----- {name} pod {i} log (tail)\n{log[-4000:]}")
    return job, container, logs


def check_batches(name, logs, expected_steps):
    """Exactly one pod (rank 0's) logs Batch lines, for exactly `expected_steps`."""
    steps = [[int(s) for s in BATCH.findall(log)] for log in logs]
    with_batches = [i for i, s in enumerate(steps) if s]
    expect(len(with_batches) == 1, f"{name}: expected exactly one pod (rank 0's) to log Batch lines, got pods {with_batches}")
    if with_batches:
        got = steps[with_batches[0]]
        expect(got == expected_steps, f"{name}: Batch lines for steps {got}, expected {expected_steps}")
        for line in re.findall(r"^.*\] (?:Batch \d+ Loss: |Resumed from |Saved checkpoint ).*$", logs[with_batches[0]], re.M):
            print(f"  pod {with_batches[0]}: {line}")
    expect(any(re.search(r", 2 ranks \(torchrun\),", log) for log in logs), f"{name}: fsdp-train did not report 2 ranks under torchrun")


def train_through_etcd(tmp, port, checkpoints):
    print("two pods: torchrun + etcd rendezvous + fsdp-train, tiny model, 2 ranks")
    ckpt_args = ["--mount-path", str(tmp / "fsx")] if checkpoints else ["--no-checkpoint"]
    if not checkpoints:
        print("  note: this fsdp-train has no --checkpoint-dir yet; generated with --no-checkpoint")
    common = ["--image", "local", "--job-name", "e2e", "--nodes", "2", "--gpus-per-node", "0", "--procs-per-node", "1",
              "--model", "tiny", "--data", str(CORPUS), "--binary", FSDP_TRAIN, "--etcd-port", str(port), *ckpt_args,
              # Both "pods" run on this machine: their metrics ports would collide (tests/observe covers them).
              "--metrics-port", "0"]
    rdzv_id = f"e2e-{os.getpid()}"
    _, container, logs = run_pods(tmp, "train", [*common, "--rdzv-id", rdzv_id, "--train-args",
                                                f"--max-steps {STEPS} --seq-len 64 --batch-size 2 --log-every 1"])
    check_batches("train", logs, list(range(STEPS)))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/keys/torchelastic/p2p/run_{rdzv_id}", timeout=5) as r:
            used = json.load(r).get("node", {}).get("dir", False)
    except OSError as e:
        used = False
        print(f"  etcd query: {e}")
    expect(used, f"no rendezvous state for run {rdzv_id} in etcd: the pods did not meet through it")
    if not checkpoints:
        return
    ckpt_dir = Path({e["name"]: e["value"] for e in container["env"]}["FSDP_CHECKPOINT_DIR"])
    expect(ckpt_dir.is_dir() and any(ckpt_dir.iterdir()), f"no checkpoint written to {ckpt_dir}")

    # Continue the job as the README says: regenerate (a new rendezvous id, the old
    # one is closed) with the same job name, hence the same checkpoint directory.
    print(f"two pods again, regenerated with a new rendezvous id: resume from the checkpoint, steps {STEPS}..{2 * STEPS - 1}")
    run_pods(tmp, "resume", [*common, "--rdzv-id", f"{rdzv_id}-2", "--train-args",
                             f"--max-steps {2 * STEPS} --seq-len 64 --batch-size 2 --log-every 1"])
    check_batches("resume", [(tmp / f"resume-pod{i}.log").read_text() for i in range(2)], list(range(STEPS, 2 * STEPS)))


# What torchrun 1.x/2.x logs when it gets SIGTERM and shuts its workers down.
TORCHRUN_SIGNALLED = re.compile(r"death signal|closing signal|Closing process")

STAND_IN = """#!/bin/bash
# Stands in for fsdp-train: on SIGTERM "saves a checkpoint" for 2 s (time for a
# second SIGTERM to show up: it would kill the real trainer) and exits 0.
r=$RANK
n=0
trap 'n=$((n + 1))' TERM
echo "stand-in rank $r: training (LOCAL_RANK=$LOCAL_RANK of $LOCAL_WORLD_SIZE)"
for ((i = 0; i < 600 && n == 0; i++)); do sleep 0.1; done
((n > 0)) || { echo "stand-in rank $r: no SIGTERM within 60 s"; exit 1; }
for ((i = 0; i < 20; i++)); do sleep 0.1; done
echo "stand-in rank $r: checkpoint saved after $n SIGTERM(s)"
exit 0
"""


def start_stand_in_pod(tmp, port, log, bare_torchrun):
    stand_in = tmp / "stand-in-trainer"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    tag = "control" if bare_torchrun else "term"
    job, _ = generate(tmp, [
        "--image", "local", "--job-name", f"e2e-{tag}", "--nodes", "1", "--gpus-per-node", "0",
        "--procs-per-node", "2", "--model", "tiny", "--binary", str(stand_in), "--etcd-port", str(port),
        "--rdzv-id", f"e2e-{tag}-{os.getpid()}", "--mount-path", str(tmp / "fsx")])
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    cmd = pod_command(job, container, "127.0.0.1")
    env = pod_env(job, container, "127.0.0.1")
    if bare_torchrun:
        cmd = cmd[cmd.index("torchrun"):]
        env["PYTHONUNBUFFERED"] = "1"  # what the launcher script would have set
    pod = start(cmd, env, log, tmp)
    deadline = min(time.time() + 60, DEADLINE)
    while time.time() < deadline and log.read_text().count(": training (") < 2 and pod.poll() is None:
        time.sleep(0.1)
    started = log.read_text().count(": training (") == 2
    if not expect(started, f"{tag}: the stand-in workers did not start"):
        print(log.read_text()[-3000:])
    return pod, container, started


def sigterm_reaches_workers(tmp, port):
    print("one pod, SIGTERM twice to PID 1 (the launcher script): each worker gets one SIGTERM, torchrun none")
    log = tmp / "term.log"
    pod, container, started = start_stand_in_pod(tmp, port, log, bare_torchrun=False)
    if not started:
        return
    os.kill(pod.pid, signal.SIGTERM)  # the kubelet signals the container's PID 1 only
    time.sleep(0.3)
    os.kill(pod.pid, signal.SIGTERM)  # a repeated SIGTERM must not reach the workers twice
    (code,) = wait_all([pod], 20)
    text = log.read_text()
    expect(code == 0, f"pod exited {code} after SIGTERM, expected 0 (None: still running after 20 s)")
    expect("fsdp-launch: SIGTERM" in text, "the launcher script did not report the SIGTERM")
    for r in (0, 1):
        expect(f"stand-in rank {r}: checkpoint saved after 1 SIGTERM(s)" in text,
               f"worker rank {r} did not get exactly one SIGTERM")
    expect(not TORCHRUN_SIGNALLED.search(text), "torchrun itself was signalled (it would SIGKILL the workers after 30 s)")
    print("  " + "\n  ".join(l for l in text.splitlines() if "SIGTERM" in l))
    ckpt_dir = {e["name"]: e["value"] for e in container["env"]}.get("FSDP_CHECKPOINT_DIR")
    expect(ckpt_dir and Path(ckpt_dir).is_dir(), f"the launcher script did not create FSDP_CHECKPOINT_DIR {ckpt_dir}")

    # Control: torchrun as PID 1 (no launcher script) does get the signal, and the
    # check above would have seen it.
    log = tmp / "term-control.log"
    pod, _, started = start_stand_in_pod(tmp, port, log, bare_torchrun=True)
    if not started:
        return
    os.kill(pod.pid, signal.SIGTERM)
    wait_all([pod], 40)
    expect(TORCHRUN_SIGNALLED.search(log.read_text()),
           "control: SIGTERM to a bare torchrun left no trace in its log, so the check above proves nothing")


def main():
    torchrun, etcd, why = preconditions()
    if why:
        print(f"SKIP: {why}")
        return SKIP
    global TMP
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-k8s-e2e."))
    TMP = str(tmp)
    t0 = time.time()
    try:
        (port,) = free_ports(1)
        _, deployment = generate(tmp, ["--image", "local", "--etcd-port", str(port)])
        start_etcd(etcd, deployment, tmp, port)
        help_text = subprocess.run([FSDP_TRAIN, "--help"], capture_output=True, text=True, timeout=60).stdout
        train_through_etcd(tmp, port, checkpoints="--checkpoint-dir" in help_text)
        sigterm_reaches_workers(tmp, port)
    except Exception as e:  # noqa: BLE001 — report, clean up, fail
        failures.append(f"{type(e).__name__}: {e}")
        print(f"  FAIL: {type(e).__name__}: {e}")
    finally:
        stop_all()
        if os.environ.get("FSDP_KEEP_TEST_DIR") == "1":
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failure(s), {time.time() - t0:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

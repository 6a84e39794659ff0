#!/usr/bin/env python3
"""Checks deploy/kubernetes/generate.py and the manifests it writes.

    test_k8s_manifests.py SOURCE_DIR [FSDP_TRAIN]

For several parameter sets the generator runs as a user would run it; each
file it writes is parsed (PyYAML) and validated:
  - against the Kubernetes API schema and API-server rules (k8s_validate.py:
    the official Kubernetes Python client's models for core/apps objects, the
    Kubeflow PyTorchJob v1 types for the custom resource; unknown fields and
    wrong types are errors), and
  - for what fsdp-train needs: Worker replicas == nodes, elasticPolicy
    consistent (etcd backend, min <= replicas <= max, nProcPerNode == GPUs per
    node, rdzvHost/rdzvPort == the etcd Service), the container command is
    torchrun with the same rendezvous settings and --nproc_per_node, then
    fsdp-train with exactly the requested arguments (and no --nproc-per-node),
    GPU/EFA requests == limits == the parameters, /dev/shm a memory volume,
    the checkpoint directory on the shared claim with --resume, the NCCL/EFA
    environment, the grace period, the node selector.
Bad parameters must exit 2 with a message naming the parameter and must not
write or touch any file. The validator itself is checked on broken manifests
(so a vacuous validator cannot pass), and the generator's model presets
against `fsdp-train --help`.

Exit 0 when everything holds, 1 otherwise (every failure is printed).
"""

import copy
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import k8s_validate
except ImportError as e:
    sys.exit(f"FAIL: {e} — pyyaml and kubernetes belong in the project's Python environment (scripts/venv.sh installs them) "
             f"for {sys.executable}")

SRC = Path(sys.argv[1]).resolve()
FSDP_TRAIN = sys.argv[2] if len(sys.argv) > 2 else None
GENERATOR = SRC / "deploy" / "kubernetes" / "generate.py"

failures = []
checks = 0


def expect(cond, message):
    global checks
    checks += 1
    if not cond:
        failures.append(message)
        print(f"  FAIL: {message}")


def run_generator(args, cwd):
    return subprocess.run([sys.executable, str(GENERATOR), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def flag_value(cmd, flag):
    """Value of --flag=VALUE in a torchrun argument list (None when absent)."""
    values = [a.split("=", 1)[1] for a in cmd if a.startswith(flag + "=")]
    return values[-1] if values else None


def check_job_set(name, args, p):
    """Runs the generator with `args`; `p` holds the parameters' expected effect."""
    print(f"case {name}: generate.py {shlex.join(args)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        r = run_generator([*args, "--output-dir", str(out)], tmp)
        expect(r.returncode == 0, f"{name}: generator exit {r.returncode}: {r.stderr.strip()}")
        if r.returncode != 0:
            return
        expected_files = {"pytorchjob.yaml", "etcd.yaml"} | ({"shared-pvc.yaml"} if p.get("pvc_size") else set())
        expect(set(os.listdir(out)) == expected_files, f"{name}: wrote {sorted(os.listdir(out))}, "
               f"expected {sorted(expected_files)} (no temporary files left)")
        docs = {}
        for f in sorted(expected_files & set(os.listdir(out))):
            text = (out / f).read_text()
            docs[f] = [d for d in yaml.safe_load_all(text) if d is not None]
            left = re.findall(r"\$\{[A-Z][A-Z0-9_]*\}", text)
            expect(not left, f"{name}: {f} has unfilled placeholders {left}")
            for d in docs[f]:
                for e in k8s_validate.validate(d):
                    expect(False, f"{name}: {f} {d.get('kind')}: {e}")
        # Same parameters, same output (apart from the timestamped default rendezvous id).
        if "--rdzv-id" in args:
            again = Path(tmp) / "again"
            run_generator([*args, "--output-dir", str(again)], tmp)
            for f in expected_files:
                expect((out / f).read_text() == (again / f).read_text(), f"{name}: {f} differs between two runs")

    (job,) = docs["pytorchjob.yaml"]
    service = next(d for d in docs["etcd.yaml"] if d["kind"] == "Service")
    deployment = next(d for d in docs["etcd.yaml"] if d["kind"] == "Deployment")
    ns = p.get("namespace", "default")
    for f, ds in docs.items():
        for d in ds:
            expect(d["metadata"].get("namespace") == ns, f"{name}: {f} {d['kind']} namespace "
                   f"{d['metadata'].get('namespace')} != {ns}")

    expect(job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob", f"{name}: not a kubeflow.org/v1 PyTorchJob")
    expect(job["metadata"]["name"] == p["job"], f"{name}: job name {job['metadata']['name']} != {p['job']}")
    spec = job["spec"]
    ep = spec["elasticPolicy"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    expect(set(spec["pytorchReplicaSpecs"]) == {"Worker"}, f"{name}: replica types {set(spec['pytorchReplicaSpecs'])}")
    expect(worker["replicas"] == p["nodes"], f"{name}: Worker.replicas {worker['replicas']} != nodes {p['nodes']}")
    expect(worker["restartPolicy"] == "OnFailure", f"{name}: Worker.restartPolicy {worker['restartPolicy']}")
    expect(ep["rdzvBackend"] == "etcd", f"{name}: rdzvBackend {ep['rdzvBackend']}")
    lo, hi = p.get("min", p["nodes"]), p.get("max", p["nodes"])
    expect((ep["minReplicas"], ep["maxReplicas"]) == (lo, hi), f"{name}: min/maxReplicas {ep['minReplicas']}/{ep['maxReplicas']} != {lo}/{hi}")
    expect(ep["minReplicas"] <= worker["replicas"] <= ep["maxReplicas"], f"{name}: replicas outside [minReplicas, maxReplicas]")
    expect(ep["nProcPerNode"] == p["procs"], f"{name}: nProcPerNode {ep['nProcPerNode']} != {p['procs']}")
    expect("nprocPerNode" not in spec, f"{name}: both nprocPerNode and elasticPolicy.nProcPerNode set")
    expect(ep["maxRestarts"] >= 0, f"{name}: maxRestarts {ep['maxRestarts']}")
    expect(service["metadata"]["name"] == ep["rdzvHost"], f"{name}: etcd Service {service['metadata']['name']} != rdzvHost {ep['rdzvHost']}")
    expect(ep["rdzvPort"] in [x["port"] for x in service["spec"]["ports"]], f"{name}: rdzvPort {ep['rdzvPort']} not a port of the etcd Service")
    if "rdzv_id" in p:
        expect(ep["rdzvId"] == p["rdzv_id"], f"{name}: rdzvId {ep.get('rdzvId')} != {p['rdzv_id']}")
    else:
        expect(re.fullmatch(re.escape(p["job"]) + r"-\d{8}-\d{6}", ep.get("rdzvId", "")),
               f"{name}: default rdzvId {ep.get('rdzvId')} is not JOB-timestamp")

    # etcd: the Service reaches the Deployment's pods, on a port etcd listens on, with the v2 API on.
    dep_labels = deployment["spec"]["template"]["metadata"]["labels"]
    expect(all(dep_labels.get(k) == v for k, v in service["spec"]["selector"].items()), f"{name}: etcd Service selector does not select the etcd pods")
    etcd_c = deployment["spec"]["template"]["spec"]["containers"][0]
    target = service["spec"]["ports"][0]["targetPort"]
    cport = next((x["containerPort"] for x in etcd_c["ports"] if target in (x.get("name"), x["containerPort"])), None)
    expect(cport == ep["rdzvPort"], f"{name}: etcd Service targetPort {target} is not etcd's client port {ep['rdzvPort']}")
    expect("--enable-v2=true" in etcd_c["command"], f"{name}: etcd without --enable-v2 (torch's etcd rendezvous uses the v2 API)")
    expect(f"--listen-client-urls=http://0.0.0.0:{ep['rdzvPort']}" in etcd_c["command"], f"{name}: etcd does not listen on {ep['rdzvPort']}")
    tag = re.search(r":v?(\d+)\.(\d+)", etcd_c["image"].rsplit("/", 1)[-1])
    expect(tag and (int(tag.group(1)), int(tag.group(2))) <= (3, 5), f"{name}: etcd image {etcd_c['image']} is not <= 3.5 (3.6 dropped the v2 API)")

    pod = worker["template"]["spec"]
    (c,) = pod["containers"]
    expect(c["name"] == "pytorch", f"{name}: container name {c['name']}")
    expect(c["image"] == p["image"], f"{name}: image {c['image']} != {p['image']}")
    cmd = c["command"]
    expect(cmd[:2] == ["bash", "-c"] and "torchrun" in cmd, f"{name}: command is not bash -c SCRIPT ... torchrun: {cmd[:3]}")
    t = cmd.index("torchrun")
    flags_end = next(i for i in range(t + 1, len(cmd)) if not cmd[i].startswith("--"))
    trun, binary, train = cmd[t + 1:flags_end], cmd[flags_end], cmd[flags_end + 1:]
    nproc = flag_value(trun, "--nproc_per_node") or flag_value(trun, "--nproc-per-node")
    expect(nproc == str(p["procs"]), f"{name}: torchrun --nproc_per_node {nproc} != {p['procs']}")
    expect(flag_value(trun, "--nnodes") == f"{lo}:{hi}", f"{name}: torchrun --nnodes {flag_value(trun, '--nnodes')} != {lo}:{hi}")
    expect(flag_value(trun, "--rdzv_backend") == "etcd", f"{name}: torchrun --rdzv_backend")
    expect(flag_value(trun, "--rdzv_endpoint") == f"{ep['rdzvHost']}:{ep['rdzvPort']}", f"{name}: torchrun --rdzv_endpoint {flag_value(trun, '--rdzv_endpoint')} != rdzvHost:rdzvPort")
    expect(flag_value(trun, "--rdzv_id") == ep["rdzvId"], f"{name}: torchrun --rdzv_id != elasticPolicy.rdzvId")
    expect(flag_value(trun, "--max_restarts") == str(ep["maxRestarts"]), f"{name}: torchrun --max_restarts != maxRestarts")
    expect("--no_python" in trun, f"{name}: torchrun without --no_python")
    expect(binary == p.get("binary", "fsdp-train"), f"{name}: runs {binary}")
    expect(not any(a.startswith("--nproc-per-node") for a in train), f"{name}: fsdp-train got --nproc-per-node (torchrun's job)")
    expected_train = ["--model", p["model"], "--data", p["data"], "--device", p["device"]]
    if p.get("global_batch"):
        expected_train += ["--global-batch-size", str(p["global_batch"])]
    ckpt = p.get("checkpoint_dir")
    if ckpt:
        expected_train += ["--checkpoint-dir", ckpt, "--checkpoint-every", str(p.get("every", 100)),
                           "--keep-last", str(p.get("keep", 3)), "--resume"]
    metrics_port = p.get("metrics_port", 9400)
    if metrics_port:
        expected_train += ["--metrics-port", str(metrics_port), "--metrics-host", "0.0.0.0", "--metrics-every-rank"]
    expected_train += p.get("extra", [])
    expect(train == expected_train, f"{name}: fsdp-train arguments\n    {train}\n  expected\n    {expected_train}")

    # Prometheus: the pods are annotated for scraping on the port fsdp-train serves, which the container declares.
    annotations = worker["template"]["metadata"].get("annotations") or {}
    ports = {x.get("name"): x["containerPort"] for x in c.get("ports") or []}
    if metrics_port:
        expect(annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port),
                               "prometheus.io/path": "/metrics"}, f"{name}: scrape annotations {annotations}")
        expect(ports == {"metrics": metrics_port}, f"{name}: container ports {ports} != metrics {metrics_port}")
    else:
        expect(not annotations and not ports, f"{name}: --metrics-port 0 but annotations {annotations} ports {ports}")

    # Resources: GPUs and EFA requested == limited == the parameters, absent when 0.
    res = c.get("resources") or {}
    for key, want in (("nvidia.com/gpu", p["gpus"]), ("vpc.amazonaws.com/efa", p["efa"])):
        got_req, got_lim = (res.get("requests") or {}).get(key), (res.get("limits") or {}).get(key)
        if want:
            expect(got_req == got_lim == want, f"{name}: {key} requests {got_req} limits {got_lim} != {want}")
        else:
            expect(got_req is None and got_lim is None, f"{name}: {key} requested on a node without it")

    # Volumes: /dev/shm in memory; the shared claim mounted where data and checkpoints live.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    shm = volumes.get(mounts.get("/dev/shm"), {})
    expect(shm.get("emptyDir", {}).get("medium") == "Memory", f"{name}: /dev/shm is not an emptyDir with medium Memory")
    if p.get("shm"):
        expect(shm["emptyDir"].get("sizeLimit") == p["shm"], f"{name}: /dev/shm sizeLimit {shm['emptyDir'].get('sizeLimit')}")
    mount = p.get("mount", "/fsx")
    shared = volumes.get(mounts.get(mount), {})
    expect(shared.get("persistentVolumeClaim", {}).get("claimName") == p.get("pvc", "fsdp-shared"),
           f"{name}: claim {p.get('pvc', 'fsdp-shared')} not mounted at {mount}")
    if ckpt:
        expect(ckpt.startswith(mount + "/"), f"{name}: checkpoint dir {ckpt} not on the claim at {mount}")

    env = {e["name"]: e["value"] for e in c["env"]}
    expect(env.get("NCCL_DEBUG") == p.get("nccl_debug", "INFO"), f"{name}: NCCL_DEBUG {env.get('NCCL_DEBUG')}")
    expect(env.get("NCCL_SOCKET_IFNAME", "").startswith("^lo"), f"{name}: NCCL_SOCKET_IFNAME {env.get('NCCL_SOCKET_IFNAME')}")
    expect(env.get("LOGLEVEL") == "INFO", f"{name}: LOGLEVEL")
    efa_env = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
    for k, v in efa_env.items():
        expect(env.get(k) == (v if p["efa"] else None), f"{name}: {k}={env.get(k)} with {p['efa']} EFA interfaces")
    expect(env.get("FSDP_CHECKPOINT_DIR") == ckpt, f"{name}: FSDP_CHECKPOINT_DIR {env.get('FSDP_CHECKPOINT_DIR')} != {ckpt}")
    for k, v in p.get("env", {}).items():
        expect(env.get(k) == v, f"{name}: env {k}={env.get(k)!r}, expected {v!r}")

    expect(pod["terminationGracePeriodSeconds"] == p.get("grace", 900), f"{name}: terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']}")
    expect(pod["terminationGracePeriodSeconds"] >= 30, f"{name}: grace period too short for a checkpoint")
    it = p.get("instance_type")
    expect(pod.get("nodeSelector", {}).get("node.kubernetes.io/instance-type") == it,
           f"{name}: nodeSelector {pod.get('nodeSelector')} != instance type {it}")
    expect(bool(pod.get("tolerations")) == bool(p["gpus"]), f"{name}: GPU toleration present iff GPUs")
    if p.get("pvc_size"):
        (pvc,) = docs["shared-pvc.yaml"]
        expect(pvc["metadata"]["name"] == p.get("pvc", "fsdp-shared"), f"{name}: claim name")
        expect(pvc["spec"]["accessModes"] == ["ReadWriteMany"], f"{name}: claim not ReadWriteMany")
        expect(pvc["spec"]["resources"]["requests"]["storage"] == p["pvc_size"], f"{name}: claim size")
        expect(pvc["spec"].get("storageClassName") == p.get("storage_class"), f"{name}: storage class")


IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp-cpp:0.1.0"
CASES = [
    ("defaults (2 x p5.48xlarge)", ["--image", IMAGE],
     dict(job="fsdp-llama", image=IMAGE, nodes=2, procs=8, gpus=8, efa=32, instance_type="p5.48xlarge",
          model="llama3.1-8b", data="/fsx/data/corpus.jsonl", device="cuda",
          checkpoint_dir="/fsx/checkpoints/fsdp-llama")),
    ("elastic 16 nodes, 4 GPUs, no EFA, own claim and mount",
     ["--image", IMAGE, "--job-name", "llama70b-ft", "--namespace", "ml-team", "--nodes", "16", "--min-nodes", "8",
      "--max-nodes", "32", "--gpus-per-node", "4", "--efa-per-node", "0", "--instance-type", "g5.12xlarge",
      "--model", "llama3.1-70b", "--data", "/data/tokens", "--pvc", "fsx-claim", "--mount-path", "/data",
      "--checkpoint-every", "250", "--keep-last", "2", "--grace-seconds", "1800", "--shm-size", "128Gi",
      "--max-restarts", "50", "--rdzv-id", "llama70b-ft-1", "--etcd-service", "rdzv", "--etcd-port", "12379",
      "--nccl-debug", "WARN", "--create-pvc", "2400Gi", "--storage-class", "fsx-sc",
      "--train-args", "--sharding hybrid --max-steps 20000 --lr 1.5e-4 --metrics-file '/data/metrics run.jsonl'",
      "--env", "HF_HOME=/data/hf", "--env", "NCCL_ALGO=Ring", "--metrics-port", "19090"],
     dict(job="llama70b-ft", image=IMAGE, namespace="ml-team", nodes=16, min=8, max=32, procs=4, gpus=4, efa=0,
          instance_type="g5.12xlarge", model="llama3.1-70b", data="/data/tokens", device="cuda", pvc="fsx-claim",
          mount="/data", checkpoint_dir="/data/checkpoints/llama70b-ft", every=250, keep=2, grace=1800,
          shm="128Gi", rdzv_id="llama70b-ft-1", nccl_debug="WARN", pvc_size="2400Gi", storage_class="fsx-sc",
          extra=["--sharding", "hybrid", "--max-steps", "20000", "--lr", "1.5e-4", "--metrics-file",
                 "/data/metrics run.jsonl"],
          env={"HF_HOME": "/data/hf", "NCCL_ALGO": "Ring"}, metrics_port=19090)),
    ("one CPU node, tiny model, no checkpoints, odd argument strings",
     ["--image", "fsdp-cpp:cpu", "--job-name", "cpu-smoke", "--nodes", "1", "--gpus-per-node", "0",
      "--procs-per-node", "2", "--model", "tiny", "--data", "/fsx/corpus: yes.jsonl", "--no-checkpoint",
      "--binary", "/opt/fsdp/bin/fsdp-train", "--rdzv-id", "cpu-smoke-1", "--metrics-port", "0",
      "--train-args", "--max-steps 10 --text-field 'on' --seed 0x10 --lr 1e-3 --tokenizer \"a # b\" --log-every 1"],
     dict(job="cpu-smoke", image="fsdp-cpp:cpu", nodes=1, procs=2, gpus=0, efa=0, instance_type=None, metrics_port=0,
          model="tiny", data="/fsx/corpus: yes.jsonl", device="cpu", binary="/opt/fsdp/bin/fsdp-train",
          rdzv_id="cpu-smoke-1",
          extra=["--max-steps", "10", "--text-field", "on", "--seed", "0x10", "--lr", "1e-3", "--tokenizer",
                 "a # b", "--log-every", "1"])),
    ("elastic 2..3 nodes keeping a global batch of 96 rows (16 or 24 ranks)",
     ["--image", IMAGE, "--job-name", "keep-batch", "--nodes", "3", "--min-nodes", "2", "--max-nodes", "3",
      "--global-batch-size", "96", "--rdzv-id", "keep-batch-1"],
     dict(job="keep-batch", image=IMAGE, nodes=3, min=2, max=3, procs=8, gpus=8, efa=32,
          instance_type="p5.48xlarge", model="llama3.1-8b", data="/fsx/data/corpus.jsonl", device="cuda",
          checkpoint_dir="/fsx/checkpoints/keep-batch", rdzv_id="keep-batch-1", global_batch=96)),
    ("HF config path, 1 GPU node with 8 EFA, no node selector",
     ["--image", IMAGE, "--job-name", "m7", "--nodes", "1", "--gpus-per-node", "1", "--efa-per-node", "8",
      "--instance-type", "", "--model", "/fsx/models/mistral-7b/config.json", "--rdzv-id", "m7"],
     dict(job="m7", image=IMAGE, nodes=1, procs=1, gpus=1, efa=8, instance_type=None,
          model="/fsx/models/mistral-7b/config.json", data="/fsx/data/corpus.jsonl", device="cuda",
          checkpoint_dir="/fsx/checkpoints/m7", rdzv_id="m7")),
]

# (case, arguments, text the error must contain): exit 2, nothing written.
BAD = [
    ("zero nodes", ["--nodes", "0"], "--nodes"),
    ("negative nodes", ["--nodes", "-3"], "--nodes"),
    ("nodes not a number", ["--nodes", "two"], "--nodes"),
    ("fractional GPUs", ["--gpus-per-node", "1.5"], "--gpus-per-node"),
    ("negative EFA", ["--efa-per-node", "-1"], "--efa-per-node"),
    ("uppercase job name", ["--job-name", "Llama_Job"], "--job-name"),
    ("job name starting with a digit", ["--job-name", "7b-run"], "DNS-1035"),
    ("job name of 64 characters", ["--job-name", "a" * 64], "--job-name"),
    ("job name too long for worker names", ["--job-name", "a" * 55, "--nodes", "100"], "63"),
    ("bad namespace", ["--namespace", "ML_team"], "--namespace"),
    ("min above nodes", ["--nodes", "2", "--min-nodes", "3"], "--min-nodes"),
    ("a global batch that one pod count of the range does not split",
     ["--nodes", "3", "--min-nodes", "2", "--max-nodes", "3", "--global-batch-size", "32"], "the 24 ranks of 3 pods"),
    ("a global batch and --grad-accum both", ["--global-batch-size", "64", "--train-args", "--grad-accum 2"],
     "give one or the other"),
    ("max below nodes", ["--nodes", "4", "--max-nodes", "2"], "--max-nodes"),
    ("procs != GPUs", ["--gpus-per-node", "8", "--procs-per-node", "4"], "--procs-per-node"),
    ("cuda without GPUs", ["--gpus-per-node", "0", "--device", "cuda"], "--device"),
    ("cpu with GPUs", ["--gpus-per-node", "8", "--device", "cpu"], "--device"),
    ("EFA without GPUs", ["--gpus-per-node", "0", "--efa-per-node", "4"], "--efa-per-node"),
    ("unknown model", ["--model", "gpt-5"], "--model"),
    ("--nproc-per-node in train args", ["--train-args", "--max-steps 5 --nproc-per-node 8"], "--nproc-per-node"),
    ("unbalanced quote in train args", ["--train-args", "--metrics-file 'a.jsonl"], "--train-args"),
    ("port out of range", ["--etcd-port", "70000"], "--etcd-port"),
    ("metrics port out of range", ["--metrics-port", "65536"], "--metrics-port"),
    ("metrics ports past 65535", ["--metrics-port", "65530"], "--metrics-port"),
    ("metrics port in train args", ["--train-args", "--metrics-port 9000"], "--metrics-port"),
    ("grace period too short", ["--grace-seconds", "5"], "--grace-seconds"),
    ("checkpoint dir off the claim", ["--checkpoint-dir", "/tmp/ckpt"], "--checkpoint-dir"),
    ("relative mount path", ["--mount-path", "fsx"], "--mount-path"),
    ("bad claim name", ["--pvc", "FSx Claim"], "--pvc"),
    ("bad quantity", ["--shm-size", "lots"], "--shm-size"),
    ("bad env", ["--env", "NOVALUE"], "--env"),
    ("env set by the template", ["--env", "NCCL_DEBUG=WARN"], "--nccl-debug"),
    ("image with a space", ["--image", "fsdp cpp"], "--image"),
    ("bad etcd service name", ["--etcd-service", "etcd.svc"], "--etcd-service"),
    ("bad rendezvous id", ["--rdzv-id", "a/b"], "--rdzv-id"),
    ("bad instance type", ["--instance-type", "p5 48xlarge"], "--instance-type"),
]


def check_bad_parameters():
    print("bad parameters: exit 2, a message naming the parameter, no file written or changed")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        sentinel = "# an earlier manifest\n"
        (out / "pytorchjob.yaml").write_text(sentinel)
        for name, args, needle in BAD:
            full = ["--image", IMAGE, "--output-dir", str(out), *args]
            if "--image" in args:
                full = ["--output-dir", str(out), *args]
            r = run_generator(full, tmp)
            msg = (r.stderr.strip().splitlines() or [""])[-1]
            expect(r.returncode == 2, f"bad parameters ({name}): exit {r.returncode}, expected 2; stderr: {msg}")
            expect(needle in r.stderr, f"bad parameters ({name}): message does not mention '{needle}': {msg}")
            expect("Traceback" not in r.stderr, f"bad parameters ({name}): Python traceback instead of a message")
            print(f"  {name}: {msg}")
        expect(sorted(os.listdir(out)) == ["pytorchjob.yaml"], f"bad parameters left files: {sorted(os.listdir(out))}")
        expect((out / "pytorchjob.yaml").read_text() == sentinel, "bad parameters changed an existing manifest")
        r = run_generator(["--nodes", "2"], tmp)
        expect(r.returncode == 2 and "--image" in r.stderr, f"missing --image: exit {r.returncode}: {r.stderr.strip()}")
        # A good run replaces the earlier file whole, leaving no temporary file.
        r = run_generator(["--image", IMAGE, "--output-dir", str(out)], tmp)
        expect(r.returncode == 0 and (out / "pytorchjob.yaml").read_text() != sentinel,
               "a valid run did not replace the earlier manifest")
        expect(sorted(os.listdir(out)) == ["etcd.yaml", "pytorchjob.yaml"], f"leftover files: {sorted(os.listdir(out))}")


def check_validator_catches_mistakes():
    """Breaks a good manifest in the ways people do; the validator must object to each."""
    print("validator: each deliberate mistake is reported")
    with tempfile.TemporaryDirectory() as tmp:
        r = run_generator(["--image", IMAGE, "--rdzv-id", "v1", "--stdout"], tmp)
        expect(r.returncode == 0, f"--stdout run failed: {r.stderr}")
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = [d["kind"] for d in docs]
    expect(kinds == ["PyTorchJob", "Service", "Deployment"], f"--stdout printed {kinds}")
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    expect(k8s_validate.validate(job) == [] and k8s_validate.validate(dep) == [], "the unmodified manifests do not validate")

    def pod(j):
        return j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]

    def container(j):
        return pod(j)["containers"][0]

    mutations = [
        ("env value as a number", lambda j: container(j)["env"].append({"name": "X", "value": 1}), "expected a string"),
        ("misspelt field", lambda j: container(j).__setitem__("volumeMount", []), "unknown field 'volumeMount'"),
        ("misspelt CRD field", lambda j: j["spec"]["elasticPolicy"].__setitem__("rdzvHosts", "etcd"), "unknown field 'rdzvHosts'"),
        ("container without name", lambda j: container(j).pop("name"), "required field 'name'"),
        ("no container named pytorch", lambda j: container(j).__setitem__("name", "trainer"), "named 'pytorch'"),
        ("GPU limit != request", lambda j: container(j)["resources"]["limits"].__setitem__("nvidia.com/gpu", 4), "requests == limits"),
        ("mount of a missing volume", lambda j: container(j)["volumeMounts"].append({"name": "nope", "mountPath": "/x"}), "not in the pod's volumes"),
        ("replicas as a string", lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("replicas", "2"), "expected an integer"),
        ("unknown rendezvous backend", lambda j: j["spec"]["elasticPolicy"].__setitem__("rdzvBackend", "zookeeper"), "not one of"),
        ("min > max", lambda j: j["spec"]["elasticPolicy"].__setitem__("minReplicas", 9), "minReplicas 9 > maxReplicas"),
        ("bad job name", lambda j: j["metadata"].__setitem__("name", "Fsdp_Job"), "DNS-1035"),
        ("bad quantity", lambda j: pod(j)["volumes"][0]["emptyDir"].__setitem__("sizeLimit", "big"), "not a quantity"),
        ("volume with two sources", lambda j: pod(j)["volumes"][0].__setitem__("hostPath", {"path": "/dev/shm"}), "exactly one volume source"),
        ("duplicate env", lambda j: container(j)["env"].append(dict(container(j)["env"][0])), "duplicate variable"),
        ("bad restart policy", lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].__setitem__("restartPolicy", "Sometimes"), "not one of"),
        ("both nproc fields", lambda j: j["spec"].__setitem__("nprocPerNode", "8"), "exclusive"),
    ]
    for name, mutate, needle in mutations:
        broken = copy.deepcopy(job)
        mutate(broken)
        errors = k8s_validate.validate(broken)
        expect(any(needle in e for e in errors), f"validator missed: {name} (errors: {errors})")
    broken = copy.deepcopy(dep)
    broken["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "other"
    expect(any("matchLabels" in e for e in k8s_validate.validate(broken)), "validator missed: Deployment selector mismatch")
    broken = copy.deepcopy(dep)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = "metrics"
    expect(any("no container port named" in e for e in k8s_validate.validate(broken)), "validator missed: probe on an unknown port")


def check_presets_match_fsdp_train():
    if not FSDP_TRAIN:
        print("presets: no fsdp-train given, skipped")
        return
    help_text = subprocess.run([FSDP_TRAIN, "--help"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"--model TEXT\S*\s+Model: a preset \(([^)]*)\)", help_text)
    expect(m is not None, "cannot find the preset list in fsdp-train --help")
    if m:
        presets = {x.strip() for x in m.group(1).split(",")}
        spec = __import__("importlib.util").util.spec_from_file_location("generate", GENERATOR)
        gen = __import__("importlib.util").util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        expect(presets == set(gen.MODEL_PRESETS),
               f"generate.py MODEL_PRESETS {sorted(gen.MODEL_PRESETS)} != fsdp-train's {sorted(presets)}")
        print(f"presets: generate.py and fsdp-train agree on {len(presets)} presets")


def main():
    for name, args, p in CASES:
        check_job_set(name, args, p)
    check_bad_parameters()
    check_validator_catches_mistakes()
    check_presets_match_fsdp_train()
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

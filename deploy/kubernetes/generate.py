#!/usr/bin/env python3
"""Writes the Kubernetes manifests that run fsdp-train as a Kubeflow PyTorchJob.

    deploy/kubernetes/generate.py --image REGISTRY/fsdp-cpp:TAG --nodes 4 --model llama3.1-8b
    kubectl apply -f fsdp-llama/etcd.yaml -f fsdp-llama/pytorchjob.yaml

Writes into --output-dir (default ./JOB_NAME):
  pytorchjob.yaml   the PyTorchJob (templates/pytorchjob.yaml.in)
  etcd.yaml         etcd Deployment + Service for the rendezvous (templates/etcd.yaml.in)
  shared-pvc.yaml   only with --create-pvc: the ReadWriteMany claim (templates/shared-pvc.yaml.in)

Every parameter is checked before anything is written (exit 2 with one line naming the
parameter, the value and what is accepted); each file is written to a temporary file
beside it and renamed into place, so an existing manifest is never left half-written.

Needs Python 3 and PyYAML only (Debian: python3-yaml), to check that every rendered
file parses back to exactly the intended values.

Why Python and not envsubst: the parameters need checking (Kubernetes name rules,
integers, cross-field rules), trainer arguments need YAML quoting that survives any
character, and optional blocks (EFA, node selector) come and go with the parameters.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"

# fsdp-train's --model presets (tests/deploy checks this against `fsdp-train --help`).
MODEL_PRESETS = (
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.2-1b", "llama3.2-3b", "mistral-7b", "mathstral-7b", "qwen2.5-0.5b",
    "qwen3-0.6b", "mixtral-8x7b", "tiny", "small", "tiny-mixtral",
    "t5-small", "t5-base", "t5-large", "t5-3b", "t5-11b", "flan-t5-small", "flan-t5-base", "flan-t5-xl",
    "t5-tiny", "t5-tiny-v1.1",
)

# Placeholders in templates: ${NAME}. A line ending in "#@ COND" is kept only when
# COND holds. A line "- ${LIST}" becomes one item per element of a list value.
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
CONDITION = re.compile(r"\s+#@ ([a-z_]+)\s*$")
WHOLE_VALUE = re.compile(r"^(\s*(?:- |[A-Za-z0-9_./-]+: ))\$\{([A-Z][A-Z0-9_]*)\}\s*(#.*)?$")
LIST_LINE = re.compile(r"^(\s*)- \$\{([A-Z][A-Z0-9_]*)\}\s*$")
PLAIN_SAFE = re.compile(r"[A-Za-z0-9._/-][A-Za-z0-9._:/-]*")

# Every check matches the whole value (re.fullmatch): '$' would also match before a trailing
# newline, and "64Gi\n" would pass as a quantity (issue 39).
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RDZV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# The operator names each worker's pod and Service JOB-worker-INDEX: a DNS-1035 label.
WORKER_SUFFIX = "-worker-"


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line: 'generate.py: error: ...' (not the 20-line usage first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text):
    """`text` with every line break and control character shown as an escape: an error is one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def integer(name, lo, hi=None):
    """argparse type: an integer in [lo, hi]."""
    def parse(text):
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'")
        value = int(text)
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    parse.__name__ = name
    return parse


def parse_args(argv):
    p = Parser(
        prog="generate.py",
        description="Write a Kubeflow PyTorchJob (plus etcd for its rendezvous) that runs fsdp-train.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    job = p.add_argument_group("job")
    job.add_argument("--job-name", default="fsdp-llama",
                     help="PyTorchJob name (DNS-1035 label: a-z, 0-9, '-', starts with a letter)")
    job.add_argument("--namespace", default="default", help="namespace of every object")
    job.add_argument("--image", required=True,
                     help="container image holding fsdp-train, torchrun (PyTorch) and python-etcd")
    job.add_argument("--image-pull-policy", default="Always", choices=("Always", "IfNotPresent", "Never"))
    job.add_argument("--binary", default="fsdp-train", help="fsdp-train inside the image (PATH or absolute)")
    job.add_argument("--output-dir", help="where to write the manifests (default: ./JOB_NAME)")
    job.add_argument("--stdout", action="store_true", help="print the manifests instead of writing files")

    nodes = p.add_argument_group("nodes")
    nodes.add_argument("--nodes", type=integer("nodes", 1, 10000), default=2, help="worker pods (one per node)")
    nodes.add_argument("--min-nodes", type=integer("min-nodes", 1, 10000),
                       help="elastic lower bound (default: --nodes)")
    nodes.add_argument("--max-nodes", type=integer("max-nodes", 1, 10000),
                       help="elastic upper bound (default: --nodes)")
    nodes.add_argument("--gpus-per-node", type=integer("gpus-per-node", 0, 64), default=8,
                       help="nvidia.com/gpu per pod; 0 for a CPU job")
    nodes.add_argument("--procs-per-node", type=integer("procs-per-node", 1, 1024),
                       help="fsdp-train processes per pod (default and, with GPUs, required: --gpus-per-node)")
    nodes.add_argument("--efa-per-node", type=integer("efa-per-node", 0, 64),
                       help="vpc.amazonaws.com/efa per pod (default: 32 with GPUs, else 0); 0 drops the EFA settings")
    nodes.add_argument("--instance-type",
                       help="nodeSelector node.kubernetes.io/instance-type (default: p5.48xlarge with GPUs; '' for none)")
    nodes.add_argument("--shm-size", default="", help="size limit of the /dev/shm memory volume, e.g. 64Gi ('' none)")
    nodes.add_argument("--grace-seconds", type=integer("grace-seconds", 30, 86400), default=900,
                       help="terminationGracePeriodSeconds: time to finish the step and save a checkpoint on SIGTERM")
    nodes.add_argument("--max-restarts", type=integer("max-restarts", 0, 100000), default=10,
                       help="torchrun worker-group restarts before the pod fails")

    train = p.add_argument_group("training")
    train.add_argument("--model", default="llama3.1-8b",
                       help="preset (" + ", ".join(MODEL_PRESETS) + ") or a path in the image/volume to a HF config.json or its directory")
    train.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda with GPUs, else cpu")
    train.add_argument("--data", help="training data path (default: MOUNT_PATH/data/corpus.jsonl)")
    train.add_argument("--global-batch-size", type=integer("global-batch-size", 0), default=0,
                       help="rows per optimizer step at every pod count of the elastic range (fsdp-train "
                            "--global-batch-size; a multiple of the ranks at each count); 0: --batch-size x "
                            "--grad-accum x ranks, which changes with the pod count")
    train.add_argument("--train-args", default="",
                       help="more fsdp-train flags, shell-quoted, appended last (they override), e.g. \"--max-steps 2000 --lr 1e-4\"")
    train.add_argument("--metrics-port", type=integer("metrics-port", 0, 65535), default=9400,
                       help="fsdp-train --metrics-port on every pod (its local rank 0; local rank r on the port + r) "
                            "with the prometheus.io/scrape annotations for Prometheus' pod discovery; 0: none")
    train.add_argument("--nccl-debug", default="INFO", choices=("VERSION", "WARN", "INFO", "TRACE"),
                       help="NCCL_DEBUG")
    train.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       help="extra container environment variable (repeatable)")

    store = p.add_argument_group("shared volume and checkpoints")
    store.add_argument("--pvc", default="fsdp-shared",
                       help="ReadWriteMany PersistentVolumeClaim mounted in every pod (data, checkpoints)")
    store.add_argument("--mount-path", default="/fsx", help="where the claim is mounted")
    store.add_argument("--create-pvc", metavar="SIZE", default="",
                       help="also write shared-pvc.yaml requesting SIZE (e.g. 1200Gi); default: use an existing claim")
    store.add_argument("--storage-class", default="", help="storageClassName for --create-pvc ('' cluster default)")
    store.add_argument("--checkpoint-dir", help="default: MOUNT_PATH/checkpoints/JOB_NAME")
    store.add_argument("--checkpoint-every", type=integer("checkpoint-every", 1), default=100,
                       help="steps between checkpoints")
    store.add_argument("--keep-last", type=integer("keep-last", 1), default=3, help="checkpoints kept")
    store.add_argument("--no-checkpoint", action="store_true",
                       help="pass no checkpoint flags (and no --resume) to fsdp-train")

    rdzv = p.add_argument_group("rendezvous")
    rdzv.add_argument("--etcd-service", default="etcd", help="etcd Service name = elasticPolicy.rdzvHost")
    rdzv.add_argument("--etcd-port", type=integer("etcd-port", 1, 65535), default=2379,
                      help="etcd client port = elasticPolicy.rdzvPort")
    rdzv.add_argument("--etcd-image", default="quay.io/coreos/etcd:v3.5.17",
                      help="etcd image; must serve the v2 API (etcd <= 3.5)")
    rdzv.add_argument("--rdzv-id", help="rendezvous id (default: JOB_NAME-UTC timestamp, unique per generation)")
    return p, p.parse_args(attach_flag_values(argv, ("--train-args",)))


def attach_flag_values(argv, flags):
    """`--train-args '--metrics-port=1'` as `--train-args=--metrics-port=1`: argparse takes a value that starts
    with '-' for an option of its own ("expected one argument"), and fsdp-train's flags all do."""
    argv = list(argv if argv is not None else sys.argv[1:])
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def check(cond, message):
    if not cond:
        raise UsageError(message)


def resolve(a):
    """Fills derived defaults and checks every parameter; returns the template values."""
    check(len(a.job_name) <= 63 and DNS1035_LABEL.fullmatch(a.job_name),
          f"--job-name '{a.job_name}' is not a DNS-1035 label: 1-63 characters a-z, 0-9 and '-', "
          "starting with a letter and ending with a letter or digit (Kubeflow requires it)")
    check(len(a.namespace) <= 63 and DNS1123_LABEL.fullmatch(a.namespace),
          f"--namespace '{a.namespace}' is not a DNS-1123 label: 1-63 characters a-z, 0-9 and '-', "
          "starting and ending with a letter or digit")
    check(len(a.etcd_service) <= 63 and DNS1035_LABEL.fullmatch(a.etcd_service),
          f"--etcd-service '{a.etcd_service}' is not a DNS-1035 label (Service names are): "
          "1-63 characters a-z, 0-9 and '-', starting with a letter")
    check(len(a.pvc) <= 253 and DNS1123_SUBDOMAIN.fullmatch(a.pvc),
          f"--pvc '{a.pvc}' is not a valid claim name (DNS-1123 subdomain: a-z, 0-9, '-' and '.')")
    for flag, image in (("--image", a.image), ("--etcd-image", a.etcd_image)):
        check(image and not re.search(r"\s", image), f"{flag} '{image}' must be a non-empty image reference without spaces")
    check(a.binary and not re.search(r"\s", a.binary), f"--binary '{a.binary}' must be a path without spaces")

    if a.device is None:
        a.device = "cuda" if a.gpus_per_node > 0 else "cpu"
    if a.gpus_per_node > 0:
        check(a.device == "cuda", f"--device cpu with --gpus-per-node {a.gpus_per_node} reserves GPUs no process "
              "uses — set --gpus-per-node 0 for a CPU job")
        if a.procs_per_node is None:
            a.procs_per_node = a.gpus_per_node
        check(a.procs_per_node == a.gpus_per_node,
              f"--procs-per-node {a.procs_per_node} differs from --gpus-per-node {a.gpus_per_node}: "
              "fsdp-train runs one process per GPU")
    else:
        check(a.device == "cpu", "--device cuda needs GPUs — set --gpus-per-node (e.g. 8)")
        if a.procs_per_node is None:
            a.procs_per_node = 1
    if a.efa_per_node is None:
        a.efa_per_node = 32 if a.gpus_per_node > 0 else 0
    check(a.efa_per_node == 0 or a.gpus_per_node > 0,
          f"--efa-per-node {a.efa_per_node} without GPUs: EFA is used by NCCL only — set --efa-per-node 0")
    if a.instance_type is None:
        a.instance_type = "p5.48xlarge" if a.gpus_per_node > 0 else ""
    check(len(a.instance_type) <= 63 and LABEL_VALUE.fullmatch(a.instance_type),
          f"--instance-type '{a.instance_type}' is not a valid label value (e.g. p5.48xlarge, or '' for no nodeSelector)")

    a.min_nodes = a.nodes if a.min_nodes is None else a.min_nodes
    a.max_nodes = a.nodes if a.max_nodes is None else a.max_nodes
    check(a.min_nodes <= a.nodes <= a.max_nodes,
          f"need --min-nodes <= --nodes <= --max-nodes, got {a.min_nodes} <= {a.nodes} <= {a.max_nodes}")
    longest = f"{a.job_name}{WORKER_SUFFIX}{a.max_nodes - 1}"
    check(len(longest) <= 63,
          f"--job-name '{a.job_name}' is too long: the operator names worker pods and Services like "
          f"'{longest}' ({len(longest)} characters), which must fit in 63")

    for flag, path in (("--mount-path", a.mount_path),):
        check(path.startswith("/") and not re.search(r"\s", path) and path != "/",
              f"{flag} '{path}' must be an absolute path without spaces (not /)")
    a.mount_path = a.mount_path.rstrip("/")
    if a.data is None:
        a.data = f"{a.mount_path}/data/corpus.jsonl"
    check(a.data.strip() != "", "--data must not be empty")
    check(a.model in MODEL_PRESETS or "/" in a.model,
          f"--model '{a.model}' is neither a preset ({', '.join(MODEL_PRESETS)}) nor a path to a HF config.json "
          "or its directory")

    if a.checkpoint_dir is None:
        a.checkpoint_dir = f"{a.mount_path}/checkpoints/{a.job_name}"
    if not a.no_checkpoint:
        ckpt = os.path.normpath(a.checkpoint_dir)
        check(a.checkpoint_dir.startswith("/") and (ckpt + "/").startswith(a.mount_path + "/") and ckpt != a.mount_path,
              f"--checkpoint-dir '{a.checkpoint_dir}' is not inside --mount-path {a.mount_path}: checkpoints "
              "elsewhere are lost with the pod and --resume could not find them")
        a.checkpoint_dir = ckpt

    for flag, size in (("--shm-size", a.shm_size), ("--create-pvc", a.create_pvc)):
        check(size == "" or QUANTITY.fullmatch(size), f"{flag} '{size}' is not a Kubernetes quantity like 64Gi or 1200Gi")
    check(a.storage_class == "" or DNS1123_SUBDOMAIN.fullmatch(a.storage_class),
          f"--storage-class '{a.storage_class}' is not a valid name")
    check(not a.storage_class or a.create_pvc, "--storage-class only applies with --create-pvc SIZE")

    if a.rdzv_id is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        a.rdzv_id = f"{a.job_name}-{stamp}"
    check(RDZV_ID.fullmatch(a.rdzv_id), f"--rdzv-id '{a.rdzv_id}' must be 1-128 characters A-Z, a-z, 0-9, '.', '_', '-'")

    try:
        extra = shlex.split(a.train_args)
    except ValueError as e:
        raise UsageError(f"--train-args '{a.train_args}' cannot be split like a shell would: {e}")
    for arg in extra:
        check(not arg.startswith("--nproc-per-node"),
              f"--train-args has '{arg}': torchrun starts the processes — use --procs-per-node / --gpus-per-node")

    env = []
    generated_env = {"LOGLEVEL", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA",
                     "FI_EFA_FORK_SAFE", "FSDP_CHECKPOINT_DIR"}
    seen = set()
    for item in a.env:
        name, sep, value = item.partition("=")
        check(sep and ENV_NAME.fullmatch(name), f"--env '{item}' is not NAME=VALUE with NAME like [A-Za-z_][A-Za-z0-9_]*")
        check(name not in generated_env, f"--env {name} is set by the template; "
              + ("use --nccl-debug" if name == "NCCL_DEBUG" else "edit templates/pytorchjob.yaml.in to change it"))
        check(name not in seen, f"--env {name} given twice")
        seen.add(name)
        env.append({"name": name, "value": value})

    train_args = ["--model", a.model, "--data", a.data, "--device", a.device]
    if a.global_batch_size:
        # Every world size the elastic range allows must split the batch into whole micro-steps.
        for n in range(a.min_nodes, a.max_nodes + 1):
            ranks = n * a.procs_per_node
            check(a.global_batch_size % ranks == 0,
                  f"--global-batch-size {a.global_batch_size} is not a multiple of the {ranks} ranks of {n} pods "
                  f"x {a.procs_per_node} processes (--min-nodes {a.min_nodes} .. --max-nodes {a.max_nodes}): "
                  f"choose a multiple of every rank count in the range")
        check(not any(arg.startswith("--global-batch-size") or arg.startswith("--grad-accum") for arg in extra),
              "--train-args sets --global-batch-size or --grad-accum: with the generator's --global-batch-size, "
              "fsdp-train derives --grad-accum at each pod count; give one or the other")
        train_args += ["--global-batch-size", str(a.global_batch_size)]
    if not a.no_checkpoint:
        train_args += ["--checkpoint-dir", a.checkpoint_dir, "--checkpoint-every", str(a.checkpoint_every),
                       "--keep-last", str(a.keep_last), "--resume"]
    if a.metrics_port:
        check(a.metrics_port + a.procs_per_node - 1 <= 65535,
              f"--metrics-port {a.metrics_port}: the pod's {a.procs_per_node} processes serve on "
              f"{a.metrics_port}..{a.metrics_port + a.procs_per_node - 1}, past 65535 — choose a lower port")
        check(a.metrics_port != a.etcd_port, f"--metrics-port {a.metrics_port} is --etcd-port's; choose another")
        train_args += ["--metrics-port", str(a.metrics_port), "--metrics-host", "0.0.0.0", "--metrics-every-rank"]
    for arg in extra:
        check(not arg.startswith("--metrics-port") or not a.metrics_port,
              f"--train-args has '{arg}': the pods' metrics port is the generator's --metrics-port (it also "
              "writes the scrape annotations)")
    train_args += extra

    values = {
        "JOB_NAME": a.job_name, "NAMESPACE": a.namespace, "IMAGE": a.image,
        "IMAGE_PULL_POLICY": a.image_pull_policy, "BINARY": a.binary,
        "NODES": a.nodes, "MIN_NODES": a.min_nodes, "MAX_NODES": a.max_nodes,
        "GPUS_PER_NODE": a.gpus_per_node, "PROCS_PER_NODE": a.procs_per_node, "EFA_PER_NODE": a.efa_per_node,
        "INSTANCE_TYPE": a.instance_type, "SHM_SIZE": a.shm_size, "GRACE_SECONDS": a.grace_seconds,
        "MAX_RESTARTS": a.max_restarts, "NCCL_DEBUG": a.nccl_debug,
        "TRAIN_ARGS": train_args, "EXTRA_ENV": env,
        "PVC": a.pvc, "MOUNT_PATH": a.mount_path, "CHECKPOINT_DIR": a.checkpoint_dir,
        "PVC_SIZE": a.create_pvc, "STORAGE_CLASS": a.storage_class,
        "ETCD_SERVICE": a.etcd_service, "ETCD_PORT": a.etcd_port, "ETCD_IMAGE": a.etcd_image,
        "RDZV_ID": a.rdzv_id, "METRICS_PORT": a.metrics_port, "METRICS_PORT_TEXT": str(a.metrics_port),
    }
    conditions = {
        "gpu": a.gpus_per_node > 0, "efa": a.efa_per_node > 0,
        "accel": a.gpus_per_node > 0 or a.efa_per_node > 0,
        "instance_type": a.instance_type != "", "shm_size": a.shm_size != "",
        "checkpoint": not a.no_checkpoint, "storage_class": a.storage_class != "",
        "metrics": a.metrics_port != 0,
    }
    return values, conditions


# Strings written without quotes: only those every YAML parser (PyYAML, Go's
# sigs.k8s.io/yaml, YAML 1.1 and 1.2) reads back as the same string. Anything
# starting with a digit (1e-4, 1:20, 0x1f) or spelling a YAML 1.1 boolean or null
# is quoted.
PLAIN_STRING = re.compile(r"(?:[A-Za-z/][A-Za-z0-9._/:-]*|--?[A-Za-z][A-Za-z0-9._/:=-]*)")
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf"}


def scalar(value):
    """A YAML scalar that parses back to exactly `value` (quoted: JSON is YAML)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"unsupported template value {value!r}")
    if isinstance(value, int):
        return str(value)
    if PLAIN_STRING.fullmatch(value) and value.lower() not in YAML_WORDS and not value.endswith(":"):
        return value
    return json.dumps(value)


def shell_word(arg):
    """`arg` quoted for a shell and safe on one line of a YAML comment: shlex.quote, or bash's
    $'...' with escapes when it holds a line break or another unprintable character (a CR, NEL
    U+0085 or LINE SEPARATOR U+2028 ends a YAML comment line: the rest would be parsed as YAML)."""
    if all(c.isprintable() for c in arg):
        return shlex.quote(arg)
    out = []
    for c in arg:
        if c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif c == "\r":
            out.append("\\r")
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "$'" + "".join(out) + "'"


def render(template_name, values, conditions):
    text = (TEMPLATES / template_name).read_text()
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{template_name}:{lineno}"
        m = CONDITION.search(line)
        if m:
            if m.group(1) not in conditions:
                raise KeyError(f"{where}: unknown condition '{m.group(1)}'")
            if not conditions[m.group(1)]:
                continue
            line = line[:m.start()]
        names = PLACEHOLDER.findall(line)
        for name in names:
            if name not in values:
                raise KeyError(f"{where}: unknown placeholder ${{{name}}}")
        if not names:
            out.append(line)
        elif line.lstrip().startswith("#"):
            text = PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), line)
            if not all(c.isprintable() for c in text):
                raise ValueError(f"{where}: a comment would hold an unprintable character: {text!r}")
            out.append(text)
        elif (m := LIST_LINE.match(line)) and isinstance(values[m.group(2)], list):
            indent = m.group(1)
            for v in values[m.group(2)]:
                if isinstance(v, dict):  # a mapping item: "- k: v" then "  k: v"
                    for i, (k, x) in enumerate(v.items()):
                        out.append(f"{indent}{'- ' if i == 0 else '  '}{k}: {scalar(x)}")
                else:
                    out.append(f"{indent}- {scalar(v)}")
        elif m := WHOLE_VALUE.match(line):
            out.append(m.group(1) + scalar(values[m.group(2)]) + (f"  {m.group(3)}" if m.group(3) else ""))
        else:
            # Inside a larger plain scalar: only values that need no quoting.
            def inline(match):
                v = values[match.group(1)]
                if not isinstance(v, int) and not PLAIN_SAFE.fullmatch(v):
                    raise ValueError(f"{where}: ${{{match.group(1)}}}={v!r} cannot be embedded unquoted")
                return str(v)
            out.append(PLACEHOLDER.sub(inline, line))
    return "\n".join(out) + "\n"


def self_check(documents, values):
    """The rendered YAML must parse back to the intended values: a quoting or template
    mistake fails here, before anything is written."""
    def expect(what, got, want):
        if got != want:
            raise RuntimeError(f"internal error: rendered {what} reads back as {got!r}, expected {want!r}")

    # Nothing but the intended objects: a value that escaped its line would add a key or a document.
    want_docs = {"pytorchjob.yaml": ["PyTorchJob"], "etcd.yaml": ["Service", "Deployment"],
                 "shared-pvc.yaml": ["PersistentVolumeClaim"]}
    for name, docs in documents.items():
        expect(f"{name} documents", [d.get("kind") if isinstance(d, dict) else d for d in docs], want_docs[name])
        for d in docs:
            expect(f"{name} top-level keys of {d.get('kind')}", sorted(d), sorted({"apiVersion", "kind", "metadata", "spec"}))
    job = documents["pytorchjob.yaml"][0]
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    cmd = container["command"]
    start = cmd.index("torchrun") + 1
    binary = next(i for i in range(start, len(cmd)) if not cmd[i].startswith("--"))
    expect("fsdp-train binary", cmd[binary], values["BINARY"])
    expect("fsdp-train arguments", cmd[binary + 1:], values["TRAIN_ARGS"])
    expect("job name", job["metadata"]["name"], values["JOB_NAME"])
    expect("image", container["image"], values["IMAGE"])
    env = {e["name"]: e["value"] for e in container["env"]}
    for e in values["EXTRA_ENV"]:
        expect(f"env {e['name']}", env.get(e["name"]), e["value"])
    expect("rdzvHost", job["spec"]["elasticPolicy"]["rdzvHost"], values["ETCD_SERVICE"])
    service = next(d for d in documents["etcd.yaml"] if d["kind"] == "Service")
    expect("etcd port", service["spec"]["ports"][0]["port"], values["ETCD_PORT"])
    if values["METRICS_PORT"]:
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
        expect("scrape port", (pod["metadata"].get("annotations") or {}).get("prometheus.io/port"),
               str(values["METRICS_PORT"]))
        expect("metrics containerPort", (container.get("ports") or [{}])[0].get("containerPort"), values["METRICS_PORT"])
    if "shared-pvc.yaml" in documents:
        expect("claim name", documents["shared-pvc.yaml"][0]["metadata"]["name"], values["PVC"])


def write_atomically(path, text):
    """Writes `text` to a temporary file beside `path`, then renames it over `path`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def fail(code, message):
    """One line on stderr, never a traceback (issue 39)."""
    sys.stderr.write(f"generate.py: error: {one_line(message)}\n")
    return code


def generate(argv):
    # Arguments that are not text (bytes that are not UTF-8 reach Python as surrogates) cannot be
    # written into a manifest: refused by position and value.
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"argument {i + 1} {arg.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8")
    parser, a = parse_args(argv)
    values, conditions = resolve(a)
    try:
        import yaml
    except ImportError:
        return fail(1, "needs PyYAML (Debian: apt-get install python3-yaml)")

    # The command line that produced the content (where it was written does not matter).
    recorded, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--output-dir":
            skip = True
        elif not (arg.startswith("--output-dir=") or arg == "--stdout"):
            recorded.append(arg)
    values["GENERATED_BY"] = "generated by: generate.py " + " ".join(shell_word(a) for a in recorded)
    files = {"pytorchjob.yaml": "pytorchjob.yaml.in", "etcd.yaml": "etcd.yaml.in"}
    if a.create_pvc:
        files["shared-pvc.yaml"] = "shared-pvc.yaml.in"
    rendered = {name: render(template, values, conditions) for name, template in files.items()}
    try:
        documents = {name: [d for d in yaml.safe_load_all(text) if d is not None] for name, text in rendered.items()}
    except yaml.YAMLError as e:
        raise RuntimeError(f"internal error: a rendered manifest is not YAML ({e})")
    self_check(documents, values)

    if a.stdout:
        sys.stdout.write("---\n".join(rendered.values()))
        return 0
    out_dir = Path(a.output_dir if a.output_dir else a.job_name)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise UsageError(f"--output-dir {out_dir}: {e.strerror or e} (a file is in the way) — give a directory")
    except OSError as e:
        return fail(1, f"--output-dir {out_dir}: cannot create it ({e.strerror or e})")
    for name, text in rendered.items():
        try:
            write_atomically(out_dir / name, text)
        except IsADirectoryError:
            raise UsageError(f"--output-dir {out_dir}: {name} there is a directory — remove it or give another "
                             "--output-dir")
        except OSError as e:
            return fail(1, f"--output-dir {out_dir}: cannot write {name} ({e.strerror or e})")
        print(out_dir / name)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        return generate(argv)
    except UsageError as e:
        return fail(2, e)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:  # a template or quoting mistake: ours
        return fail(1, f"{e} — please report it")
    except KeyboardInterrupt:
        return fail(130, "interrupted")


if __name__ == "__main__":
    sys.exit(main())

"""Shared by the PyTorch FSDP2 peer (fsdp2_peer.py), its parity test (fsdp2_parity.py)
and the CPU head-to-head (bench/cpu/headtohead.py): the tiny Hugging Face model, the token
file, fsdp-train's learning-rate schedule, the split of a global batch among ranks,
processes that are bounded in time and always cleaned up, and the processor's name
for the benchmarks' records.

Imports only the standard library and numpy at module level: the drivers stay light,
the ranks import torch themselves.
"""
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import numpy as np


class PeerError(Exception):
    """A failure with a message that says what, the values and how to fix it."""


# --- fsdp-train's learning-rate schedule (src/optim/lr_schedule.cpp, LrSchedule::at) ---

def lr_at(step, lr, min_lr, warmup_steps, max_steps):
    """Linear warmup to lr (step 0 uses lr/warmup), cosine decay to min_lr at max_steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    span = max(1, max_steps - warmup_steps)
    progress = (step - warmup_steps) / span
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# --- data ---

def token_dtype(vocab_size):
    """fsdp-train's --token-dtype for ids of this vocabulary: u16 up to 65,536 ids, else u32."""
    if vocab_size > 2**32:
        raise PeerError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    return "u16" if vocab_size <= 65536 else "u32"


def write_token_file(path, n_tokens, vocab_size, seed):
    """Raw little-endian ids (fsdp-train --data-format bin --token-dtype token_dtype(vocab_size)):
    a learnable stream — a fixed random successor for each token, followed 3 times in 4,
    else a uniformly random token — so that the loss falls visibly within a few steps."""
    dtype = "<u2" if token_dtype(vocab_size) == "u16" else "<u4"
    rng = np.random.default_rng(seed)
    successor = rng.integers(0, vocab_size, size=vocab_size)
    follow = rng.random(n_tokens) < 0.75
    noise = rng.integers(0, vocab_size, size=n_tokens)
    out = np.empty(n_tokens, dtype=dtype)
    t = int(noise[0])
    for i in range(n_tokens):
        t = int(successor[t]) if follow[i] else int(noise[i])
        out[i] = t
    out.tofile(path)
    return path


def split_global_batch(global_rows, world_size, grad_accum, batch_size):
    """Note [Global batch rule] (include/fsdp/data/sampler.h): rank r's micro-step a of a
    step is global rows (a*W + r)*B .. +B. global_rows: (S, G, T+1) -> (S, A, W, B, T+1)."""
    s, g, row = global_rows.shape
    if g != batch_size * world_size * grad_accum:
        raise PeerError(f"global batch of {g} rows is not B {batch_size} x W {world_size} x A {grad_accum}")
    # Row index (a*W + r)*B + b is exactly the C-order flattening of (a, r, b).
    return global_rows.reshape(s, grad_accum, world_size, batch_size, row)


def load_batches(prefix, world_size, grad_accum, batch_size):
    """Reads peer_batches' <prefix>.global.npy, splits it among ranks with
    split_global_batch and checks the split against <prefix>.ranks.npy (what each rank
    of fsdp-train reads through BatchSampler::get). Returns (S, A, W, B, T+1) int64."""
    global_rows = np.load(prefix + ".global.npy")
    per_rank = np.load(prefix + ".ranks.npy")
    split = split_global_batch(global_rows, world_size, grad_accum, batch_size)
    if split.shape != per_rank.shape:
        raise PeerError(f"peer_batches wrote per-rank batches of shape {per_rank.shape}, the split of the global "
                        f"batch has {split.shape}: were both written with the same --world-size/--grad-accum?")
    bad = np.argwhere((split != per_rank).any(axis=-1))
    if len(bad):
        s, a, r, b = (int(v) for v in bad[0])
        raise PeerError(f"the peer's split of the global batch differs from fsdp-train's rank batches at {len(bad)} "
                        f"rows, first step {s} micro-step {a} rank {r} row {b}: the rule in sampler.h "
                        "(j = (a*W + r)*B + b) and split_global_batch disagree")
    return split


# --- the tiny model ---

def tiny_llama_config_dict(vocab_size=512):
    """A 2-layer Llama with grouped-query attention (4 heads, 2 KV heads) and plain RoPE
    (theta 10000), untied embeddings."""
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False, initializer_range=0.02)


def save_hf_model(out_dir, config_dict, seed):
    """transformers' LlamaForCausalLM with its own random initialization under `seed`,
    written by save_pretrained (config.json + model.safetensors, float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config_dict))
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "config.json")) as f:
        written = json.load(f)
    return written


# --- processes ---

def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller binds it soon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_of(pid):
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out = [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def descendants(pid):
    """Every live descendant of pid (fsdp-train's launcher forks its workers into their own
    process groups, so killing the launcher's group alone would not reach them)."""
    found, todo = [], [pid]
    while todo:
        for c in _children_of(todo.pop()):
            found.append(c)
            todo.append(c)
    return found


def kill_tree(proc):
    """SIGKILL a Popen started with start_new_session=True, its group and every descendant
    (and their groups), then reap it."""
    if proc.poll() is None:
        victims = descendants(proc.pid)
        for pid in [proc.pid] + victims:
            for kill in (lambda p: os.killpg(p, signal.SIGKILL), lambda p: os.kill(p, signal.SIGKILL)):
                try:
                    kill(pid)
                except (ProcessLookupError, PermissionError):
                    pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class ProcessSet:
    """Processes started together and stopped together: each in its own session, output to
    a log file; `wait` gives up at a deadline; leaving the `with` block kills whatever is
    left (on success, failure or an exception)."""

    def __init__(self):
        self.procs = []  # (name, Popen, log path)

    def start(self, name, argv, env, log_path, cwd=None):
        log = open(log_path, "wb")
        try:
            p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=cwd)
        finally:
            log.close()
        self.procs.append((name, p, log_path))
        return p

    def wait(self, timeout_s, poll_s=0.05, on_poll=None, ok_codes=(0,)):
        """Waits until every process has exited or one failed (an exit code, or -signal, not in
        ok_codes), at most timeout_s seconds; on_poll() runs at every poll. Returns
        {name: (returncode, rusage)} (rusage from wait4: ru_maxrss is that process's peak
        resident set in KiB). Raises PeerError naming the first failure or the timeout."""
        deadline = time.monotonic() + timeout_s
        done = {}
        while len(done) < len(self.procs):
            progressed = False
            for name, p, log_path in self.procs:
                if name in done:
                    continue
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == 0:
                    continue
                progressed = True
                p.returncode = os.waitstatus_to_exitcode(status)
                done[name] = (p.returncode, ru)
                if p.returncode not in ok_codes:
                    raise PeerError(f"{name} exited with status {p.returncode}; the end of its log "
                                    f"{log_path}:\n{tail(log_path)}")
            if on_poll is not None:
                on_poll()
            if not progressed:
                if time.monotonic() > deadline:
                    late = [n for n, _, _ in self.procs if n not in done]
                    raise PeerError(f"{', '.join(late)} did not finish within {timeout_s:.0f} s (killed); the end "
                                    f"of {late[0]}'s log:\n{tail(self._log(late[0]))}")
                time.sleep(poll_s)
        return done

    def _log(self, name):
        return next(lp for n, _, lp in self.procs if n == name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for _, p, _ in self.procs:
            kill_tree(p)
        return False


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def read_metrics(path):
    """fsdp-train's --metrics-file (or the peer's, same keys): the training lines, by step."""
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                j = json.loads(line)
                if "loss" in j and "step" in j:
                    rows[j["step"]] = j
    return [rows[k] for k in sorted(rows)]


def processor():
    """The processor's model name (lscpu's "Model name"), for a benchmark's record."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown processor"


def venv_python():
    """The interpreter running this script: the project's environment (FSDP_PYTHON)."""
    return os.environ.get("FSDP_PYTHON") or sys.executable

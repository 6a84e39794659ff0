"""Inputs the hostile cases start from, and the tools that damage them.

build() makes, once per campaign, in one fixtures directory:
  tiny.json        the `tiny` preset's Hugging Face config.json (fsdp-inspect --write-hf-config)
  hf/              a tiny model exported by fsdp-train --export-hf (config.json, model.safetensors)
  ck/              sharded checkpoints step_00000001 and step_00000002 of a tiny run
  tokenizer.json   a hand-written character-level BPE (printable ASCII, <unk>, a few merges)
  tokens.bin       little-endian uint16 token ids below 256, enough for every case
  adapter/         a PEFT LoRA adapter (rank 4) of the tiny model, exported by fsdp-train
  t5.json          the `t5-tiny` preset's config.json
  ck_tok/          step_00000001 of a run with a tokenizer.json whose directory is gone since
                   (its copy travels in the checkpoint: CK_TOK_TOKENIZER)
  dcp_st/          ck's newest checkpoint converted at 2 processes to a PyTorch distributed
                   checkpoint in safetensors files (every tensor in two chunks)
  ck_dcp/          step_00000001 and step_00000002 of a 2-process run saving DCP checkpoints (safetensors)
Cases copy what they damage into their own directory; the fixtures themselves stay intact.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import struct
import subprocess
from pathlib import Path

from harness import Env, base_environment

TINY = ["--model", "tiny", "--seq-len", "16", "--batch-size", "2", "--log-every", "1"]


class FixtureError(RuntimeError):
    pass


def _run(argv: list, what: str) -> None:
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
                       env=base_environment({}))
    if p.returncode != 0:
        raise FixtureError(f"fixture {what}: {' '.join(argv)} exited {p.returncode}:\n{p.stderr[-2000:]}")


def tokenizer_json(extra_vocab: dict | None = None) -> dict:
    vocab = {"<unk>": 0}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    merges = [["t", "h"], ["th", "e"], ["i", "n"], ["e", "r"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab.update(extra_vocab or {})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": len(vocab), "content": "</s>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def u16_tokens(n: int, seed: int = 7, high: int = 256) -> bytes:
    rng = random.Random(seed)
    return struct.pack(f"<{n}H", *(rng.randrange(high) for _ in range(n)))


def build(env: Env) -> None:
    fx = env.fx
    if fx.exists():
        shutil.rmtree(fx)
    fx.mkdir(parents=True)
    _run([env.inspect, "--model", "tiny", "--write-hf-config", str(fx / "tiny.json")], "tiny.json")
    _run([env.train, *TINY, "--data", env.corpus, "--max-steps", "1", "--export-hf", str(fx / "hf")], "hf/")
    _run([env.train, *TINY, "--data", env.corpus, "--max-steps", "2", "--checkpoint-dir", str(fx / "ck"),
          "--checkpoint-every", "1"], "ck/")
    _run([env.train, *TINY, "--data", env.corpus, "--max-steps", "1", "--lora-rank", "4", "--export-hf",
          str(fx / "adapter")], "adapter/")
    for need in ("hf/config.json", "hf/model.safetensors", "ck/step_00000001/manifest.json",
                 "ck/step_00000002/manifest.json", "adapter/adapter_config.json"):
        if not (fx / need).is_file():
            raise FixtureError(f"fixture {need} was not written")
    (fx / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (fx / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (fx / "tokens.bin").write_bytes(u16_tokens(20000))
    build_fourth(env)


CK_TOK_TOKENIZER = json.dumps(tokenizer_json({"carried": 120})).encode()


def build_fourth(env: Env) -> None:
    """The fourth campaign's fixtures (issue 50): t5.json, ck_tok/, dcp_st/, ck_dcp/."""
    fx = env.fx
    _run([env.inspect, "--model", "t5-tiny", "--write-hf-config", str(fx / "t5.json")], "t5.json")
    tok = fx / "tok_gone"
    tok.mkdir()
    (tok / "tokenizer.json").write_bytes(CK_TOK_TOKENIZER)
    (tok / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    _run([env.train, *TINY, "--data", env.corpus, "--max-steps", "1", "--tokenizer", str(tok / "tokenizer.json"),
          "--checkpoint-dir", str(fx / "ck_tok"), "--checkpoint-every", "1"], "ck_tok/")
    shutil.rmtree(tok)
    _run([env.train, "convert", "--checkpoint-dir", str(fx / "ck"), "--export-dcp", str(fx / "dcp_st"),
          "--dcp-format", "safetensors", "--nproc-per-node", "2"], "dcp_st/")
    _run([env.train, *TINY, "--data", env.corpus, "--max-steps", "2", "--nproc-per-node", "2",
          "--checkpoint-dir", str(fx / "ck_dcp"), "--checkpoint-every", "1", "--checkpoint-format", "dcp",
          "--dcp-format", "safetensors"], "ck_dcp/")
    for need in ("t5.json", "ck_tok/step_00000001/carried/tokenizer.json", "dcp_st/config.json",
                 "ck_dcp/step_00000002/manifest.json"):
        if not (fx / need).exists():
            raise FixtureError(f"fixture {need} was not written")


# --- damaging tools -------------------------------------------------------------------

def tiny_config(env_or_fx, **changes) -> dict:
    fx = env_or_fx.fx if hasattr(env_or_fx, "fx") else env_or_fx
    cfg = json.loads((fx / "tiny.json").read_text())
    for k, v in changes.items():
        if v is DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


DELETE = object()


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def safetensors_bytes(header: dict, data: bytes, header_len: int | None = None) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


def first_tensor(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def gzip_bytes(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def flip_byte(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset % len(b)] ^= 0xFF
    path.write_bytes(bytes(b))


def truncate(path: Path, keep: float) -> None:
    b = path.read_bytes()
    path.write_bytes(b[: int(len(b) * keep)])

"""The fourth campaign's findings (issue 50), one case or more each, with the command the issue
gives: a checkpoint is untrusted input (it never names a file of this machine or a config key
outside the model's schema, never crashes or exhausts the loader, never loads a gap as zeros),
nothing is deleted or replaced through a link, an export never names its own source, and the
option table's loose ends. Expectations follow issue 16's rules (cases.py). Findings 4, 6 and 21
(a pickle's expansion, its memo's limit, an overflow in an item's strides) are the C++ tests'
(tests/checkpoint/test_pickle.cpp, test_dcp.cpp) and the fuzz targets' seeds.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import fixtures as fxt
from cases import FAIL, INSPECT, OK, TRAIN, USAGE, E, _ck, _not_said, _says
from harness import Case, Ctx, Result
from cases_third import GEN, _unchanged_link

CONVERT = ["train", "convert"]
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- the user's, never to be exported\n"


# --- tools ----------------------------------------------------------------------------------

def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as manifest.crc32c holds it."""
    table = _crc32c.table
    if not table:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_crc32c.table = []


def _rewrite_manifest(step: Path, edit) -> None:
    """Edits step/manifest.json and writes the checksum anyone can recompute (it is no signature)."""
    m = json.loads((step / "manifest.json").read_text())
    edit(m)
    text = json.dumps(m, indent=1) + "\n"
    (step / "manifest.json").write_text(text)
    (step / "manifest.crc32c").write_text(f"{_crc32c(text.encode()):08x}\n")


def _edit_st_header(path: Path, edit) -> None:
    header, data = fxt.read_safetensors(path)
    edit(header)
    path.write_bytes(fxt.safetensors_bytes(header, data))


def _state_file(dcp: Path) -> Path:
    """The DCP safetensors file whose header carries the owners' metadata (fsdp_cpp.state)."""
    for p in sorted(dcp.glob("*.safetensors")):
        header, _ = fxt.read_safetensors(p)
        if "fsdp_cpp.state" in header.get("__metadata__", {}):
            return p
    raise RuntimeError(f"no fsdp_cpp.state in {dcp}")


def _edit_dcp_state(edit):
    """setup: {d}/dcp, a copy of the DCP (safetensors) fixture, its owners' metadata edited."""
    def setup(ctx: Ctx) -> None:
        dcp = fxt.copy_tree(ctx.fx / "dcp_st", ctx.path("dcp"))
        p = _state_file(dcp)

        def change(header):
            meta = header["__metadata__"]
            meta["fsdp_cpp.state"] = edit(ctx, json.loads(meta["fsdp_cpp.state"]), meta["fsdp_cpp.state"])
        _edit_st_header(p, change)
    return setup


def _split_tensor(dcp: Path) -> tuple[str, list]:
    """A tensor saved in two chunks along rows, and [(file, saved_offsets)] of its chunks."""
    chunks = {}
    for p in sorted(dcp.glob("*.safetensors")):
        header, _ = fxt.read_safetensors(p)
        info = json.loads(header.get("__metadata__", {}).get("DCP_SHARDING_INFO", "{}"))
        for name, v in info.items():
            if name in header and len(header[name]["shape"]) == 2:
                chunks.setdefault(name, []).append((p, v["saved_offsets"], header[name]["shape"]))
    for name, cs in sorted(chunks.items()):
        if len(cs) == 2 and cs[0][1][1] == cs[1][1][1] == 0 and cs[0][2][0] > 1:
            return name, sorted(cs, key=lambda c: c[1][0])
    raise RuntimeError(f"no tensor of {dcp} is saved in two row chunks")


def _overlap_with_gap(ctx: Ctx, dcp: Path) -> None:
    """The first row chunk of a tensor moved down one row: row 0 is in no chunk and the row where
    the chunks meet is in both — the tensor's extent and element count unchanged (finding 5; the
    safetensors format has no .metadata, so a tensor's size is where its chunks end)."""
    name, (first, second) = _split_tensor(dcp)

    def change(header):
        meta = header["__metadata__"]
        info = json.loads(meta["DCP_SHARDING_INFO"])
        info[name]["saved_offsets"] = [1, 0]
        meta["DCP_SHARDING_INFO"] = json.dumps(info)
    _edit_st_header(first[0], change)


def _dcp(damage=None, fixture="dcp_st", to="dcp"):
    def setup(ctx: Ctx) -> None:
        d = fxt.copy_tree(ctx.fx / fixture, ctx.path(to))
        if damage:
            damage(ctx, d)
    return setup


def _nan_weights(ctx: Ctx, dcp: Path) -> None:
    """The first float32 tensor of the DCP's first file holds a NaN (finding 16)."""
    p = sorted(dcp.glob("*.safetensors"))[0]
    header, data = fxt.read_safetensors(p)
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    ctx.nan_tensor, ctx.nan_file = name, p.name
    begin = header[name]["data_offsets"][0]
    data = data[:begin] + struct.pack("<f", float("nan")) + data[begin + 4:]
    p.write_bytes(fxt.safetensors_bytes(header, data))


def _names_nan_tensor(ctx: Ctx, r: Result) -> list:
    """Refused naming the tensor and its file, not found steps later as a NaN loss or gradient norm."""
    if ctx.nan_tensor not in r.stderr or ctx.nan_file not in r.stderr:
        return [("unclear", f"the error does not name tensor {ctx.nan_tensor} and file {ctx.nan_file}")]
    return []


def _no_secret_exported(out: str):
    def check(ctx: Ctx, r: Result) -> list:
        d = ctx.path(out)
        leaked = [str(p.relative_to(ctx.d)) for p in d.rglob("*") if p.is_file() and SECRET in p.read_bytes()] \
            if d.is_dir() else []
        return [("lost data", f"the user's private file was exported as {', '.join(leaked)}")] if leaked else []
    return check


def _config_json_lacks(out: str, *keys):
    def check(ctx: Ctx, r: Result) -> list:
        p = ctx.path(out) / "config.json"
        if not p.is_file():
            return []
        cfg = json.loads(p.read_text())
        bad = [k for k in keys if k in cfg]
        return [("wrong exit", f"config.json took {bad} from the checkpoint")] if bad else []
    return check


def _exported_file(out: str, name: str, content: bytes):
    def check(ctx: Ctx, r: Result) -> list:
        p = ctx.path(out) / name
        if not p.is_file() or p.read_bytes() != content:
            return [("wrong exit", f"the export has no {name} as the run's (from the checkpoint's copy)")]
        return []
    return check


def _all(*checks):
    def check(ctx: Ctx, r: Result) -> list:
        return [b for c in checks for b in c(ctx, r)]
    return check


def _plant_secret(ctx: Ctx) -> Path:
    return ctx.plant("home/.ssh/id_rsa", SECRET)


# --- finding 1: a checkpoint names local files and config keys ------------------------------------

def export_record_cases() -> list:
    c = "fourth-record"
    convert = CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-hf", "{d}/out"]

    def our_record(files, config=None):
        """step_00000002's export record names files (and config keys) of its choosing."""
        def damage(ctx: Ctx, ck: Path) -> None:
            secret = str(_plant_secret(ctx))

            def edit(m):
                rec = m["state"]["trainer"].setdefault("hf_export", {})
                rec["extra_files"] = json.loads(json.dumps(files).replace("SECRET", secret))
                if config is not None:
                    rec["extra_config"] = config
            _rewrite_manifest(ck / "step_00000002", edit)
        return _ck(damage)

    def dcp_record(files, config=None):
        def edit(ctx, state, _text):
            secret = str(_plant_secret(ctx))
            rec = state["trainer"].setdefault("hf_export", {})
            rec["extra_files"] = json.loads(json.dumps(files).replace("SECRET", secret))
            if config is not None:
                rec["extra_config"] = config
            return json.dumps(state)
        return _edit_dcp_state(edit)

    dcp_convert = CONVERT + ["--checkpoint-dir", "{d}/dcp", "--export-hf", "{d}/out"]
    remote = {"auto_map": {"AutoModelForCausalLM": "evil.Model"}, "model_type": "evil", "vocab_size": 7}
    return [
        # A path in the record (the form earlier versions wrote): never read; the export says it has no copy.
        Case(c, "ours-path-to-private-file", convert, OK, setup=our_record([["SECRET", "tokenizer.json"]]),
             check=_all(_no_secret_exported("out"), _says("carries no copy"))),
        # A path where a name belongs: damage (the previous checkpoint is converted instead).
        Case(c, "ours-path-as-name", convert, OK, setup=our_record(["SECRET"]),
             check=_all(_no_secret_exported("out"), _says("step_00000002"))),
        Case(c, "ours-config-keys", convert, OK, setup=our_record([], remote),
             check=_all(_config_json_lacks("out", "auto_map"), _says("auto_map"))),
        Case(c, "dcp-path-to-private-file", dcp_convert, OK, setup=dcp_record([["SECRET", "tokenizer.json"]]),
             check=_all(_no_secret_exported("out"), _says("carries no copy"))),
        Case(c, "dcp-config-keys", dcp_convert, FAIL, setup=dcp_record([], remote), names=("fsdp_cpp.state",),
             check=_config_json_lacks("out", "auto_map")),
        # A file linked into the checkpoint's carried copies: a link is never followed out of it.
        Case(c, "carried-file-is-a-link", CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-hf", "{d}/out"], FAIL,
             setup=_ck_tok(lambda ctx, ck: ((ck / "step_00000001/carried/tokenizer.json").unlink(),
                                            os.symlink(_plant_secret(ctx), ck / "step_00000001/carried/tokenizer.json"))),
             check=_no_secret_exported("out"), names=("tokenizer.json",)),
        # The run's tokenizer files travel in the checkpoint: converted after the originals are gone.
        Case(c, "carried-files-exported", CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-hf", "{d}/out"], OK,
             setup=_ck_tok(), check=_exported_file("out", "tokenizer.json", fxt.CK_TOK_TOKENIZER)),
    ]


def _ck_tok(damage=None):
    """{d}/ck: the checkpoint of a run whose tokenizer directory is gone (fixtures: ck_tok)."""
    def setup(ctx: Ctx) -> None:
        ck = fxt.copy_tree(ctx.fx / "ck_tok", ctx.path("ck"))
        if damage:
            damage(ctx, ck)
    return setup


# --- finding 2, 15: links ------------------------------------------------------------------------

def _linked_base(ctx: Ctx) -> None:
    """other/step_00000001 is a checkpoint of the user's; ck/step_00000001 links to it."""
    fxt.copy_tree(ctx.fx / "ck" / "step_00000001", ctx.path("other/step_00000001"))
    ctx.protect("other")
    ctx.path("ck").mkdir()
    os.symlink(ctx.path("other/step_00000001"), ctx.path("ck/step_00000001"))


def link_cases() -> list:
    c = "fourth-links"
    keep = TRAIN + ["--checkpoint-dir", "{d}/ck", "--resume", "--checkpoint-every", "1", "--keep-last", "1",
                    "--max-steps", "3"]
    return [
        Case(c, "keep-last-through-linked-step", keep, OK, setup=_linked_base, timeout=60),
        Case(c, "keep-last-through-linked-step-async", keep + ["--async-checkpoint"], OK, setup=_linked_base,
             timeout=60),
        Case(c, "export-dcp-to-link", CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-dcp", "{d}/out"], USAGE,
             setup=lambda ctx: (_ck()(ctx), ctx.path("real").mkdir(), os.symlink(ctx.path("real"), ctx.path("out"))),
             names=("--export-dcp",), check=_unchanged_link("out", "{d}/real")),
    ]


# --- finding 3, 5, 16, 17, 18: DCP readers and writer -------------------------------------------------

DEEP = "[" * 1_000_000 + "]" * 1_000_000


def _deep_in(text: str, key: str) -> str:
    """JSON `text` with the value of `key` (its first occurrence) nested a million levels deep: a copy of
    such a value recursed off the stack (SIGSEGV), where a deep document that is not an object did not."""
    m = re.search(f'"{key}":\\s*', text)
    assert m, f"no {key} in {text[:200]}"
    return text[:m.end()] + DEEP + ', "was": ' + text[m.end():]


def dcp_cases() -> list:
    c = "fourth-dcp"
    convert = CONVERT + ["--checkpoint-dir", "{d}/dcp", "--export-hf", "{d}/out"]
    init_from = TRAIN + ["--init-from", "{d}/dcp"]
    resume = TRAIN + ["--checkpoint-dir", "{d}/ck", "--resume", "--max-steps", "3"]

    def deep_sharding_info(ctx: Ctx, dcp: Path) -> None:
        p = sorted(dcp.glob("*.safetensors"))[0]
        _edit_st_header(p, lambda h: h["__metadata__"].__setitem__(
            "DCP_SHARDING_INFO", _deep_in(json.dumps(json.loads(h["__metadata__"]["DCP_SHARDING_INFO"])),
                                          "saved_offsets")))

    def step2_dcp(damage):
        """{d}/ck of a run saving DCP checkpoints; its step_00000002 damaged: a resume falls back.
        The manifest is made to match the damaged files' sizes: only the damage itself can be found."""
        def setup(ctx: Ctx) -> None:
            ck = fxt.copy_tree(ctx.fx / "ck_dcp", ctx.path("ck"))
            step = ck / "step_00000002"
            damage(ctx, step)

            def sizes(m):
                for f in m["dcp"]["files"]:
                    f["size"] = (step / f["name"]).stat().st_size
            _rewrite_manifest(step, sizes)
        return setup

    def deep_state(ctx, step):
        p = _state_file(step)
        _edit_st_header(p, lambda h: h["__metadata__"].__setitem__(
            "fsdp_cpp.state", _deep_in(json.dumps(json.loads(h["__metadata__"]["fsdp_cpp.state"])), "trainer")))

    def step_not_a_number(ctx, state, _text):
        state["trainer"]["step"] = "seven"
        return json.dumps(state)

    return [
        Case(c, "state-nested-a-million-deep", convert, FAIL, timeout=60,
             setup=_edit_dcp_state(lambda ctx, s, t: _deep_in(t, "trainer")), names=("fsdp_cpp.state",)),
        Case(c, "sharding-info-nested-a-million-deep", convert, FAIL, timeout=60,
             setup=_dcp(deep_sharding_info), names=("DCP_SHARDING_INFO",)),
        Case(c, "resume-falls-back-from-deep-state", resume, OK, setup=step2_dcp(deep_state), timeout=60,
             check=_says("is damaged")),
        Case(c, "trainer-step-not-a-number", convert, FAIL, setup=_edit_dcp_state(step_not_a_number),
             names=("fsdp_cpp.state",), check=_not_said("json.exception")),
        # Chunks that overlap and leave a gap, element counts equal: damage, through every reader.
        Case(c, "overlap-and-gap-init-from", init_from, FAIL, setup=_dcp(_overlap_with_gap),
             names=("overlap", "gap")),
        Case(c, "overlap-and-gap-convert", convert, FAIL, setup=_dcp(_overlap_with_gap), names=("overlap", "gap")),
        Case(c, "overlap-and-gap-resume", resume, OK, timeout=60,
             setup=step2_dcp(lambda ctx, step: _overlap_with_gap(ctx, step)), check=_says("exactly once")),
        Case(c, "nan-weights-init-from", init_from, E(1, 2), setup=_dcp(_nan_weights), names=("NaN",),
             check=_names_nan_tensor),
    ] + [
        # The disk full mid-archive (the limits where the zip writer's position was left behind).
        Case(c, f"full-disk-during-save-{limit}", CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-dcp", "{d}/out"],
             FAIL, setup=_ck(), file_size_limit=limit, names=("disk is full",), check=_not_said("unexpected pos"))
        for limit in (3000, 100000)
    ]


# --- finding 7: an export never names its own source ---------------------------------------------

def source_cases() -> list:
    c = "fourth-source"

    def hf_protected(ctx: Ctx) -> None:
        fxt.copy_tree(ctx.fx / "hf", ctx.path("hf"))
        ctx.protect("hf")
    return [
        Case(c, "convert-export-over-init-from",
             CONVERT + ["--init-from", "{d}/hf", "--export-hf", "{d}/hf", "--export-dtype", "bfloat16"], USAGE,
             setup=hf_protected, names=("--export-hf",)),
        Case(c, "convert-export-over-init-from-by-another-path",
             CONVERT + ["--init-from", "{d}/hf", "--export-hf", "{d}/./hf/", "--export-dtype", "bfloat16"], USAGE,
             setup=hf_protected, names=("--export-hf",)),
        Case(c, "train-export-over-init-from", TRAIN + ["--init-from", "{d}/hf", "--export-hf", "{d}/hf"], USAGE,
             setup=hf_protected, names=("--export-hf",)),
        Case(c, "convert-export-checkpoint-into-source",
             CONVERT + ["--checkpoint-dir", "{d}/ck", "--export-checkpoint", "{d}/ck"], USAGE,
             setup=_ck(protect=("ck",)), names=("--export-checkpoint",)),
    ]


# --- findings 8-14, 19, 20: the option table's loose ends ---------------------------------------------

def option_cases() -> list:
    c = "fourth-options"
    pc = TRAIN + ["--print-config"]
    t5 = ["train", "--model", "t5-tiny", "--data", "{corpus}", "--seq-len", "16", "--batch-size", "2",
          "--max-steps", "1"]
    estimate = INSPECT + ["--estimate", "--cluster", "h100"]

    def t5_buckets(n):
        def setup(ctx: Ctx) -> None:
            cfg = json.loads((ctx.fx / "t5.json").read_text())
            cfg["relative_attention_num_buckets"] = n
            ctx.write("t5/config.json", json.dumps(cfg))
        return setup

    def inspect_config(ctx: Ctx) -> None:
        ctx.write("run.toml", 'model = "llama3.1-8b"\nmixed-precision = "bf16"\nlr = 0.0003\n')

    return [
        # 8: --config was ignored by fsdp-inspect (the defaults planned instead of the file's model).
        Case(c, "inspect-config-file", ["inspect", "--config", "{d}/run.toml"], OK, setup=inspect_config,
             check=_all(_says("8030261248"), _says("--lr (from --config)"))),
        # 9: --print-config printed configurations a run refuses.
        Case(c, "print-config-nnodes-0", pc + ["--nnodes", "0"], USAGE, names=("--nnodes",)),
        Case(c, "print-config-node-rank-5-of-2", pc + ["--nnodes", "2", "--node-rank", "5", "--master-addr", "h"],
             USAGE, names=("--node-rank",)),
        Case(c, "print-config-no-master-addr", pc + ["--nnodes", "2"], USAGE, names=("--master-addr",)),
        Case(c, "print-config-master-port-0", pc + ["--master-port", "0"], USAGE, names=("--master-port",)),
        Case(c, "print-config-master-port-70000", pc + ["--master-port", "70000"], USAGE, names=("--master-port",)),
        Case(c, "print-config-nproc-0", pc + ["--nproc-per-node", "0"], USAGE, names=("--nproc-per-node",)),
        Case(c, "print-config-nproc-100000", pc + ["--nproc-per-node", "100000"], USAGE, names=("--nproc-per-node",)),
        Case(c, "print-config-t5-torchtitan", t5 + ["--print-config", "--checkpoint-dir", "{d}/ck",
                                                    "--checkpoint-format", "dcp", "--dcp-layout", "torchtitan"],
             USAGE, names=("--dcp-layout",)),
        # 10: flags that would do nothing.
        Case(c, "export-dcp-on-training-run", TRAIN + ["--export-dcp", "{d}/out"], USAGE, names=("--export-dcp",)),
        Case(c, "export-checkpoint-on-training-run", TRAIN + ["--export-checkpoint", "{d}/out"], USAGE,
             names=("--export-checkpoint",)),
        Case(c, "async-checkpoint-without-dir", TRAIN + ["--async-checkpoint"], USAGE, names=("--async-checkpoint",)),
        Case(c, "checkpoint-format-dcp-without-dir", TRAIN + ["--checkpoint-format", "dcp"], USAGE,
             names=("--checkpoint-format",)),
        Case(c, "dcp-layout-without-dcp", TRAIN + ["--dcp-layout", "torchtitan"], USAGE, names=("--dcp-layout",)),
        # 11: the byte-size parser.
        Case(c, "size-past-2^63", TRAIN + ["--export-hf", "{d}/out", "--export-shard-size", "99999999999999999999"],
             USAGE, names=("--export-shard-size",), check=_not_said("no limit")),
        Case(c, "size-400-digits", TRAIN + ["--export-hf", "{d}/out", "--export-shard-size", "9" * 400], USAGE,
             names=("--export-shard-size",), check=_not_said("stod")),
        Case(c, "size-below-a-byte", TRAIN + ["--export-hf", "{d}/out", "--export-shard-size", "0.0000001"], USAGE,
             names=("--export-shard-size",)),
        Case(c, "staging-limit-past-2^63",
             TRAIN + ["--checkpoint-dir", "{d}/ck", "--async-checkpoint", "--checkpoint-staging-limit",
                      "99999999999999999999"], USAGE, names=("--checkpoint-staging-limit",),
             check=_all(_not_said("-9223372036854775808"), _not_said("no limit"))),
        # 12: fsdp-inspect took values fsdp-train refuses (unless --estimate).
        Case(c, "inspect-seq-len-0", INSPECT + ["--seq-len", "0"], USAGE, names=("--seq-len",)),
        Case(c, "inspect-seq-len-negative", INSPECT + ["--seq-len", "-1"], USAGE, names=("--seq-len",)),
        Case(c, "inspect-batch-size-0", INSPECT + ["--batch-size", "0"], USAGE, names=("--batch-size",)),
        Case(c, "inspect-grad-accum-0", INSPECT + ["--grad-accum", "0"], USAGE, names=("--grad-accum",)),
        Case(c, "inspect-init-from-missing", INSPECT + ["--init-from", "{d}/no-such-model"], USAGE,
             names=("--init-from",)),
        Case(c, "inspect-lora-targets-empty", INSPECT + ["--lora-targets", ""], USAGE, names=("--lora-targets",)),
        Case(c, "inspect-estimate-still-checks", estimate + ["--seq-len", "0"], USAGE, names=("--seq-len",)),
        # 13: T5 buckets below 4 passed the config check and failed inside LibTorch.
        Case(c, "t5-buckets-2", INSPECT[:1] + ["--model", "{d}/t5/config.json"], USAGE, setup=t5_buckets(2),
             names=("relative_attention_num_buckets",)),
        Case(c, "t5-buckets-3", t5[:2] + ["{d}/t5/config.json"] + t5[3:], USAGE, setup=t5_buckets(3),
             names=("relative_attention_num_buckets",)),
        # 14: --target-len was not bounded before allocation.
        Case(c, "target-len-2^31", t5 + ["--target-len", "2147483648"], USAGE, names=("--target-len",)),
        Case(c, "target-len-2^63-1", t5 + ["--target-len", "9223372036854775807"], USAGE, names=("--target-len",),
             check=_not_said("overflowed")),
        # 19: refused by every worker instead of once, before starting.
        Case(c, "int8-reduce-scatter-fp16-refused-once",
             TRAIN + ["--nproc-per-node", "2", "--reduce-scatter-wire", "int8", "--reduce-dtype", "fp16"], USAGE,
             names=("--reduce-scatter-wire", "--reduce-dtype"), check=_not_said("rank 1 exited"), weight=3,
             timeout=60),
        # 20: the calibration refused a T5 after saying it was calibrating.
        Case(c, "calibrate-t5", ["inspect", "--model", "t5-tiny", "--estimate", "--calibrate", "{d}/c.json"], USAGE,
             names=("--calibrate",), check=_not_said("calibrating")),
    ]


def deploy_cases() -> list:
    c = "fourth-deploy"
    out = ["--output-dir", "{d}/out"]
    return [
        # Still open from the third campaign: a value starting with '-' was argparse's "expected one argument";
        # now the generator's own check speaks (the pods' metrics port is its --metrics-port).
        Case(c, "train-args-value-with-a-dash", GEN + ["--train-args", "--metrics-port=1"] + out, USAGE,
             names=("--metrics-port",), check=_not_said("expected one argument")),
        Case(c, "train-args-value-with-a-dash-accepted", GEN + ["--train-args", "--max-steps 5"] + out, OK,
             check=lambda ctx, r: [] if "--max-steps" in ctx.path("out/pytorchjob.yaml").read_text()
             else [("wrong exit", "the manifest lacks --max-steps 5")]),
    ]


def all_cases() -> list:
    return export_record_cases() + link_cases() + dcp_cases() + source_cases() + option_cases() + deploy_cases()

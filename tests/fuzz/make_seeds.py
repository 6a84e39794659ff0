"""Writes the seed corpora of the fuzz targets into corpus/<target>/ (checked in); with
--regressions, the inputs of issue 50's findings into regressions/<target>/ (checked in).

Run with the project's Python environment (it trains two tiny tokenizers with the
`tokenizers` library); the output is deterministic, so re-running it changes nothing
unless this script changed. Seeds are small valid inputs plus a few near misses: the
fuzzer mutates them into the malformed files the parsers must refuse cleanly.
"""
import base64
import gzip
import json
import os
import shutil
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = ("The quick brown fox jumps over the lazy dog. It's 2024; 3.14159 costs $12!\n"
        "caf\u00e9 na\u00efve \u4f60\u597d \U0001F600 \u0915\u093c e\u0301\n") * 8


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def config(**kw):
    return json.dumps(kw, indent=2, sort_keys=True) + "\n"


def hf_config():
    base = dict(model_type="llama", hidden_size=128, intermediate_size=384, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=4, vocab_size=512, max_position_embeddings=1024,
                rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=256,
                eos_token_id=257, architectures=["LlamaForCausalLM"], torch_dtype="float32")
    out("hf_config", "llama_tiny.json", config(**base))
    out("hf_config", "llama31_rope_scaling_v4.json", config(**dict(
        base, rope_theta=500000.0, eos_token_id=[128001, 128008, 128009], pad_token_id=3,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192))))
    out("hf_config", "llama32_rope_parameters_v5.json", config(**dict(
        {k: v for k, v in base.items() if k != "rope_theta"}, tie_word_embeddings=True, head_dim=64,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192))))
    out("hf_config", "mistral_window.json", config(**dict(base, model_type="mistral", sliding_window=16)))
    out("hf_config", "qwen2_layer_types.json", config(**dict(
        base, model_type="qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=2,
        layer_types=["full_attention", "full_attention", "sliding_attention", "sliding_attention"])))
    out("hf_config", "qwen3_bias.json", config(**dict(base, model_type="qwen3", attention_bias=True, head_dim=32,
                                                          use_sliding_window=False, sliding_window=None)))
    out("hf_config", "bad_heads.json", config(**dict(base, num_attention_heads=3)))
    out("hf_config", "bad_type.json", config(**dict(base, vocab_size="512")))
    out("hf_config", "huge_sizes.json", config(**dict(base, vocab_size=10**12, hidden_size=2**40)))
    t5 = dict(model_type="t5", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=3, num_heads=4,
              vocab_size=512, relative_attention_num_buckets=32, relative_attention_max_distance=128,
              feed_forward_proj="relu", tie_word_embeddings=True, eos_token_id=1, pad_token_id=0,
              decoder_start_token_id=0, architectures=["T5ForConditionalGeneration"])
    out("hf_config", "t5_tiny.json", config(**t5))
    out("hf_config", "flan_t5_gated.json", config(**dict(t5, feed_forward_proj="gated-gelu", tie_word_embeddings=False)))
    out("hf_config", "t5_bad_proj.json", config(**dict(t5, feed_forward_proj="gated-tanh-relu")))


def safetensors_file(tensors, metadata=None, raw_header=None):
    header, data = {}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":"))
    h += " " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h.encode() + data, h, data


def safetensors():
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, 7)
    bf16 = bytes([0x80, 0x3F, 0x00, 0x40, 0x40, 0xC0, 0x00, 0x00])
    f16 = struct.pack("<4e", 1.0, -0.5, 65504.0, 0.0)
    tensors = [("model.embed_tokens.weight", "F32", [2, 3], f32), ("model.norm.weight", "BF16", [4], bf16),
               ("lm_head.weight", "F16", [2, 2], f16), ("ids", "I64", [2], struct.pack("<2q", 1, -1)),
               ("flag", "BOOL", [], b"\x01"), ("empty", "F64", [0, 5], b"")]
    whole, h, data = safetensors_file(tensors, {"format": "pt"})
    out("safetensors", "model.safetensors", whole)
    # The '{' form: header, NUL, data (the target adds the length).
    out("safetensors", "header_form", h.encode() + b"\0" + data)
    out("safetensors", "overlap", safetensors_file([], raw_header=json.dumps(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}))[0] + bytes(12))
    out("safetensors", "truncated", whole[:40])


def tiktoken():
    ranks = [bytes([b]) for b in range(256)]
    for merge in [b"th", b"he", b"the", b" t", b" the", b"in", b"an", b"er", b"on", b"  ", b"    ", b"\xc3\xa9"]:
        ranks.append(merge)
    lines = "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks))
    out("tokenizer", "tiktoken.model", lines)
    out("tokenizer", "tiktoken_crlf.model", lines.replace("\n", "\r\n"))


def hf_tokenizers():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    llama3_regex = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    # Llama 3 / Qwen style: byte-level BPE behind a Split regex, a BOS template.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3_regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", 0)])
    byte_level = tok.to_str()
    out("tokenizer", "bytelevel_bpe.json", byte_level)
    out("tokenizer", "bytelevel_bpe_with_config.json",
        byte_level + "\0" + json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                                        "add_bos_token": True}))
    # Llama 2 / TinyLlama style: SentencePiece-like BPE with byte fallback.
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    # As Llama 2's file: the <0xNN> byte pieces are vocabulary entries after the specials.
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    pieces = [t for t, _ in trained[:3]] + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in trained[3:]]
    j["model"]["vocab"] = {t: i for i, t in enumerate(pieces)}
    out("tokenizer", "spm_style_bpe.json",
        json.dumps(j, ensure_ascii=False) + "\0" + json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    out("tokenizer", "tiny_handwritten.json", json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 5, "content": "<eos>", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Digits", "individual_digits": True},
        "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4}, "merges": ["a b"]}}))


def manifest():
    sections = []
    size = 0
    for kind in ("param", "exp_avg", "exp_avg_sq"):
        sections.append({"unit": 0, "kind": kind, "dtype": "F32", "flat_begin": 0, "numel": 10, "offset": size})
        size += 40
    blocks = base64.b64encode(struct.pack("<2I", 0x12345678, 0x9abcdef0)).decode()
    m = {"format": "fsdp-cpp/sharded-checkpoint", "version": 1, "step": 20,
         "model_config": {"model_type": "llama", "hidden_size": 4},
         "world_size": 2, "shard_group_size": 2, "replicate_group_size": 1, "strategy": "FULL_SHARD",
         "optimizer": {"type": "AdamW", "step": 20, "options": {"lr": 0.001}},
         "trainer_state": {"step": 20, "seed": 1337},
         "units": [{"name": "root", "numel": 18, "padded_numel": 20, "shard_numel": 10,
                    "params": [{"name": "w", "shape": [3, 4], "flat_offset": 0, "numel": 12},
                               {"name": "b", "shape": [6], "flat_offset": 12, "numel": 6}]}],
         "checksum": {"algorithm": "crc32c", "block_size": 64},
         "files": [{"name": "shard-00000-of-00002.bin", "size": size, "crc32c": "0badf00d", "shard_index": 0,
                    "block_crc32c": blocks, "sections": sections}]}
    out("checkpoint_manifest", "manifest.json", json.dumps(m, indent=2))
    bf = json.loads(json.dumps(m))
    for s in bf["files"][0]["sections"]:
        s["dtype"] = "BF16"
    out("checkpoint_manifest", "manifest_bf16.json", json.dumps(bf))
    bad = json.loads(json.dumps(m))
    bad["files"][0]["sections"][2]["offset"] = 100
    out("checkpoint_manifest", "section_outside.json", json.dumps(bad))


def dcp():
    """A real PyTorch distributed checkpoint of a tiny model and optimizer (one process, no
    process group), its .metadata re-pickled with fixed ids so the seeds do not change, and
    items of its __0_0.distcp: a tensor chunk's torch.save archive and non-tensor values."""
    import io
    import pickle
    import tempfile
    import warnings
    import torch
    import torch.distributed.checkpoint as dcp_api
    from torch.distributed.checkpoint.state_dict import get_state_dict
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_api.save({"model": msd, "optimizer": osd}, checkpoint_id=d, no_dist=True)
        md = dcp_api.FileSystemReader(d).read_metadata()
        md.storage_meta.checkpoint_id = "/ckpt"
        md.storage_meta.save_id = "00000000-0000-4000-8000-000000000000"
        md.storage_meta.load_id = None
        out("dcp_metadata", "metadata_adamw", pickle.dumps(md, protocol=4))
        out("dcp_metadata", "metadata_protocol2", pickle.dumps(md, protocol=2))
        out("dcp_metadata", "metadata_protocol5", pickle.dumps(md, protocol=5))
        data = open(os.path.join(d, "__0_0.distcp"), "rb").read()
        for idx, info in md.storage_data.items():
            item = data[info.offset:info.offset + info.length]
            if idx.fqn == "model.0.weight":
                out("dcp_item", "tensor_chunk", item)
            elif idx.fqn == "optimizer.state.0.weight.step":
                out("dcp_item", "tensor_scalar", item)
            elif idx.fqn.endswith(".betas"):
                out("dcp_item", "value_tuple", item)
            elif idx.fqn.endswith(".params"):
                out("dcp_item", "value_list", item)
    # A near miss: a foreign class where a dataclass belongs.
    out("dcp_metadata", "foreign_class", pickle.dumps(io.BytesIO(b"x"), protocol=4))
    buf = io.BytesIO()
    torch.save(torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)[:, 1:], buf)  # not contiguous
    out("dcp_item", "tensor_strided_bf16", buf.getvalue())


def dataset():
    # Control byte: bits 0-1 format (auto, text, jsonl, bin), 2-3 name (.txt .jsonl .bin .json.gz),
    # 4 uint32, 5 BOS, 6 a directory split at NUL bytes (fuzz_dataset.cpp).
    def ctl(fmt, name, u32=False, bos=False, directory=False):
        return bytes([fmt | name << 2 | u32 << 4 | bos << 5 | directory << 6])
    jsonl = "".join(json.dumps({"text": line, "url": "x"}) + "\n" for line in TEXT.splitlines()[:4]) + "\n"
    out("dataset", "text_auto", ctl(0, 0) + TEXT.encode())
    out("dataset", "jsonl_auto_bos", ctl(0, 1, bos=True) + jsonl.encode())
    out("dataset", "jsonl_forced_crlf", ctl(2, 0) + jsonl.replace("\n", "\r\n").encode())
    out("dataset", "bin_u16", ctl(0, 2) + struct.pack("<8H", 1, 2, 3, 255, 256, 257, 0, 65535))
    out("dataset", "bin_u32", ctl(3, 0, u32=True) + struct.pack("<4I", 1, 70000, 2**31, 5))
    gz = gzip.compress(jsonl.encode(), mtime=0)
    out("dataset", "jsonl_gzip", ctl(0, 3) + gz)
    out("dataset", "gzip_members", ctl(1, 0) + gzip.compress(b"first ", mtime=0) + gzip.compress(b"second", mtime=0))
    out("dataset", "gzip_truncated", ctl(0, 3) + gz[: len(gz) // 2])
    out("dataset", "dir_jsonl", ctl(0, 1, directory=True) + jsonl.encode() + b"\0" + jsonl.encode())
    out("dataset", "dir_bin", ctl(0, 2, directory=True) + b"\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00")
    # (input, target) pairs: read as documents and as pairs (a .jsonl name).
    pairs = "".join(json.dumps({"input": "reverse: " + w, "target": w[::-1]}) + "\n" for w in ["abc", "hello", "x"])
    out("dataset", "pairs_jsonl", ctl(0, 1) + pairs.encode())
    out("dataset", "pairs_gzip_wide", ctl(0, 3, u32=True, bos=True) + gzip.compress(pairs.encode(), mtime=0))


def regression(target, name, data):
    d = os.path.join(HERE, "regressions", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def torch_save_archive(pkl):
    """A torch.save archive whose data.pkl is `pkl` (as a DCP item holds one), by PyTorch's own writer."""
    import io
    import torch
    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf)
    w.write_record("data.pkl", pkl, len(pkl))
    w.write_record("byteorder", b"little", 6)
    w.write_end_of_file()
    return buf.getvalue()


def regressions():
    """The fourth hostile campaign's findings (issue 50) as regression inputs, replayed by every run
    and mutated from: a pickle whose shared values expand to 2^60 leaves (124 bytes), a state item of
    JSON nested a million deep, a tensor whose sizes overflow 64 bits (2^40 x 2^40), and .metadata
    whose chunks overlap and leave a gap with the tensor's element count."""
    import io
    import pickle
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                       TensorProperties, TensorStorageMetadata)
    laughs = b"\x80\x02)" + b"2\x86" * 60 + b"."
    regression("dcp_item", "billion_laughs", torch_save_archive(laughs))
    regression("dcp_item", "state_deep_json",
               torch_save_archive(pickle.dumps("[" * 1_000_000 + "]" * 1_000_000, protocol=2)))
    class Storage:  # stands for the storage: written as torch.save's persistent id
        pass

    class Huge:  # torch._utils._rebuild_tensor_v2(storage, 0, (2^40, 2^40), (2^40, 1), False, None): row-major
        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, (Storage(), 0, (2**40, 2**40), (2**40, 1), False, None)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 0) if isinstance(obj, Storage) else None
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(Huge())
    storage = buf.getvalue()
    regression("dcp_item", "size_overflow_2e40", torch_save_archive(storage))
    props = TensorProperties(dtype=torch.float32)
    chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 3])),
              ChunkStorageMetadata(offsets=torch.Size([3, 0]), sizes=torch.Size([4, 3]))]  # rows 3 twice, 7 never
    md = Metadata(state_dict_metadata={"w": TensorStorageMetadata(props, torch.Size([8, 3]), chunks)},
                  storage_data={MetadataIndex("w", torch.Size([0, 0])): _StorageInfo("__0_0.distcp", 0, 100),
                                MetadataIndex("w", torch.Size([3, 0])): _StorageInfo("__0_0.distcp", 100, 100)})
    regression("dcp_metadata", "overlap_with_gap", pickle.dumps(md, protocol=4))


def main():
    if sys.argv[1:] == ["--regressions"]:
        regressions()
        return
    corpus = os.path.join(HERE, "corpus")
    shutil.rmtree(corpus, ignore_errors=True)
    hf_config()
    safetensors()
    tiktoken()
    hf_tokenizers()
    manifest()
    dcp()
    dataset()
    for target in sorted(os.listdir(corpus)):
        files = os.listdir(os.path.join(corpus, target))
        print(f"{target}: {len(files)} seeds, {max(os.path.getsize(os.path.join(corpus, target, f)) for f in files)} "
              "bytes at most")


if __name__ == "__main__":
    sys.exit(main())

"""A large run's PyTorch distributed checkpoint metadata, built and pickled by PyTorch itself.

The .metadata FSDP2 + torch.distributed.checkpoint would write for a Llama model with AdamW at W
ranks: every parameter and both moments sharded along dimension 0 in W chunks ("model.<name>",
"optim.state.<name>.exp_avg" / "exp_avg_sq"), each moment's step a scalar, its param group's
values, every chunk an item of rank r's __r_0.distcp — without the tensors (only the metadata is
written). Used by test_dcp_metadata_scale.py and bench/checkpoint/dcp_metadata.py.
"""

from __future__ import annotations

import io
import pickle
import pickletools

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)


def llama_params(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, vocab=128256):
    """(name, shape) of a Llama model in Hugging Face's names; the defaults are Llama 3.1 70B's."""
    kv = hidden // heads * kv_heads
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)), (p + "self_attn.k_proj.weight", (kv, hidden)),
                (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (intermediate, hidden)), (p + "mlp.up_proj.weight", (intermediate, hidden)),
                (p + "mlp.down_proj.weight", (hidden, intermediate)), (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    return out + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def build(world: int = 64, params=None) -> Metadata:
    params = llama_params() if params is None else params
    props = TensorProperties(dtype=torch.float32)
    sdm, planner, storage = {}, {}, {}
    offset = [0] * world  # bytes written so far into each rank's file

    def item(fqn, chunk_offsets, rank, nbytes, index):
        storage[MetadataIndex(fqn, torch.Size(chunk_offsets), index)] = _StorageInfo(f"__{rank}_0.distcp",
                                                                                     offset[rank], nbytes + 1024)
        offset[rank] += nbytes + 1024

    def sharded(fqn, shape, path):
        rows = -(-shape[0] // world)
        chunks = []
        for r in range(world):
            lo, hi = min(r * rows, shape[0]), min((r + 1) * rows, shape[0])
            if lo == hi:
                continue
            off, size = (lo,) + (0,) * (len(shape) - 1), (hi - lo,) + tuple(shape[1:])
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size)))
            item(fqn, off, r, 4 * (hi - lo) * (1 if len(shape) == 1 else shape[1]), len(chunks) - 1)
        sdm[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(shape), chunks=chunks)
        planner[fqn] = path

    for name, shape in params:
        sharded(f"model.{name}", shape, ("model", name))
        for kind in ("exp_avg", "exp_avg_sq"):
            sharded(f"optim.state.{name}.{kind}", shape, ("optim", "state", name, kind))
        step = f"optim.state.{name}.step"
        sdm[step] = TensorStorageMetadata(properties=props, size=torch.Size([]),
                                          chunks=[ChunkStorageMetadata(offsets=torch.Size([]), sizes=torch.Size([]))])
        planner[step] = ("optim", "state", name, "step")
        item(step, (), 0, 4, 0)
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "params"):
        fqn = f"optim.param_groups.0.{key}"
        sdm[fqn] = BytesStorageMetadata()
        planner[fqn] = ("optim", "param_groups", 0, key)
        storage[MetadataIndex(fqn)] = _StorageInfo("__0_0.distcp", offset[0], 64)
        offset[0] += 64
    return Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage,
                    storage_meta=StorageMeta(checkpoint_id="/ckpt", save_id="save", load_id="load"))


def dumps(md: Metadata) -> bytes:
    """As FileSystemWriter.finish writes .metadata: pickle.dump with the default protocol."""
    out = io.BytesIO()
    pickle.dump(md, out)
    return out.getvalue()


def memo_entries(data: bytes) -> int:
    """Memo entries the pickle makes (MEMOIZE, BINPUT, LONG_BINPUT)."""
    return sum(1 for op, _, _ in pickletools.genops(data) if op.name in ("MEMOIZE", "BINPUT", "LONG_BINPUT"))


def counts(md: Metadata) -> dict:
    tensors = {k: v for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    return {"tensors": len(tensors), "chunks": sum(len(v.chunks) for v in tensors.values()),
            "storage": len(md.storage_data), "values": len(md.state_dict_metadata) - len(tensors),
            "planner_data": len(md.planner_data)}

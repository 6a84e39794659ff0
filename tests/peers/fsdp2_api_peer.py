#!/usr/bin/env python3
"""One rank of the PyTorch FSDP2 side of the API peer test (tests/peers/api_parity.py): the
model of tests/peers/api_peer.cpp, sharded with torch.distributed.fsdp.fully_shard, trained
case by case with FSDP2's own options and methods; per step each rank writes the mean loss
over the ranks and every parameter's full gradient as JSON lines.

    fsdp2_api_peer.py --cases cases.json --init init.bin --data data.bin --out peer

Started W times with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (gloo, CPU).
"""
import argparse
import datetime
import faulthandler
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard,
                                    register_fsdp_forward_method)
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

D_IN, D, F, D_OUT, BLOCKS = 6, 8, 12, 5, 3


class Shift(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.zeros(D))

    def forward(self, h):
        return h + self.s


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.zeros(F, D))
        self.b1 = nn.Parameter(torch.zeros(F))
        self.w2 = nn.Parameter(torch.zeros(D, F))

    def forward(self, x):
        return x + torch.tanh(x @ self.w1.t() + self.b1) @ self.w2.t()

    def encode(self, x):
        return self.forward(x) * 0.5


class Net(nn.Module):
    def __init__(self, encode):
        super().__init__()
        self.w_in = nn.Parameter(torch.zeros(D, D_IN))
        self.shift = Shift()
        self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.w_out = nn.Parameter(torch.zeros(D_OUT, D))
        self.encode = encode

    def forward(self, x, y):
        h = self.shift(x @ self.w_in.t())
        for i, b in enumerate(self.blocks):
            h = b.encode(h) if self.encode and i == BLOCKS - 1 else b(h)
        return (h @ self.w_out.t() - y).pow(2).mean()


class HalvingReduceScatter(ReduceScatter):
    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group)
        output_tensor.mul_(0.5)
        return None


class CountingAllGather(AllGather):
    calls = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        CountingAllGather.calls += 1
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def reshard_of(v):
    return v if isinstance(v, bool) else int(v)


def build(case, init, mesh):
    model = Net(case.get("encode", False))
    off = 0
    with torch.no_grad():
        for _, p in model.named_parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(init[off:off + n].copy()).view(p.shape))
            off += n
    if off != init.size:
        raise SystemExit(f"the init file has {init.size} floats, the model {off}")
    named = dict(model.named_parameters())
    for n in case.get("frozen", []):
        named[n].requires_grad_(False)
    ignored = {named[n] for n in case.get("ignored", [])}
    units = case.get("units", {})
    default = reshard_of(case["reshard"]) if "reshard" in case else None

    def shard(module, name):
        u = units.get(name, {})
        kw = {"mesh": mesh, "ignored_params": ignored or None}
        r = reshard_of(u["reshard"]) if "reshard" in u else (default if name != "<root>" else None)
        if r is not None:
            kw["reshard_after_forward"] = r
        if "mp" in u:
            m = u["mp"]
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=DTYPES[m.get("param", "fp32")],
                                                   reduce_dtype=DTYPES[m.get("reduce", "fp32")],
                                                   output_dtype=DTYPES[m["output"]] if "output" in m else None,
                                                   cast_forward_inputs=m.get("cast_forward_inputs", True))
        if u.get("offload"):
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        fully_shard(module, **kw)

    shard(model.shift, "shift")
    for i, b in enumerate(model.blocks):
        shard(b, f"blocks.{i}")
    shard(model, "<root>")
    modules = {"<root>": model, "shift": model.shift, **{f"blocks.{i}": b for i, b in enumerate(model.blocks)}}
    for name, u in units.items():
        if "forward_prefetch" in u:
            modules[name].set_modules_to_forward_prefetch([modules[n] for n in u["forward_prefetch"]])
        if "backward_prefetch" in u:
            modules[name].set_modules_to_backward_prefetch([modules[n] for n in u["backward_prefetch"]])
    if case.get("encode"):
        register_fsdp_forward_method(model.blocks[BLOCKS - 1], "encode")
    return model, modules, ignored


def build_fsdp1(case, init, rank, W):
    """FSDP1 (FullyShardedDataParallel) for the cases FSDP2 has no spelling of."""
    import functools
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy
    model = Net(case.get("encode", False))
    off = 0
    with torch.no_grad():
        for _, p in model.named_parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(init[off:off + n].copy()).view(p.shape))
            off += n
        if case.get("sync_module_states"):
            for p in model.parameters():
                p.mul_(1.0 + rank)
    f1 = case["fsdp1"]
    kw = {"use_orig_params": True, "device_id": torch.device("cpu"),
          "sharding_strategy": getattr(ShardingStrategy, f1.get("strategy", "FULL_SHARD")),
          "backward_prefetch": {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST,
                                "none": None}[case.get("backward_prefetch", "pre")],
          "forward_prefetch": case.get("forward_prefetch", False),
          "limit_all_gathers": case.get("limit_all_gathers", 2) > 0,
          "sync_module_states": case.get("sync_module_states", False)}
    if "wrap_size" in case:
        kw["auto_wrap_policy"] = functools.partial(size_based_auto_wrap_policy, min_num_params=case["wrap_size"])
    else:
        kw["auto_wrap_policy"] = ModuleWrapPolicy({Shift, Block})
    if f1.get("strategy", "").startswith(("HYBRID", "_HYBRID")):
        hs = case["hybrid_shard_size"]
        kw["device_mesh"] = init_device_mesh("cpu", (W // hs, hs), mesh_dim_names=("replicate", "shard"))
    return FSDP(model, **kw), FSDP


def main():
    ap = argparse.ArgumentParser()
    for a in ("--cases", "--init", "--data", "--out"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, W = dist.get_rank(), dist.get_world_size()
    spec = json.load(open(a.cases))
    steps, B, A_max, data_ranks, lr = spec["steps"], spec["batch"], spec["max_micro"], spec["data_ranks"], spec["lr"]
    init = np.fromfile(a.init, dtype=np.float32)
    data = np.fromfile(a.data, dtype=np.float32).reshape(steps, A_max, data_ranks, B, D_IN + D_OUT)
    out = open(f"{a.out}.rank{rank}.jsonl", "w")
    for case in spec["cases"]:
        if "worlds" in case and W not in case["worlds"]:
            continue
        fsdp1 = None
        if "fsdp1" in case:
            model, fsdp1 = build_fsdp1(case, init, rank, W)
            modules, fsdp_modules = {"<root>": model}, []
        elif case.get("sharding", "full") == "hybrid":
            hs = case["hybrid_shard_size"]
            mesh = init_device_mesh("cpu", (W // hs, hs), mesh_dim_names=("replicate", "shard"))
            model, modules, ignored = build(case, init, mesh)
        else:
            mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("shard",))
            model, modules, ignored = build(case, init, mesh)
        if fsdp1 is None:
            fsdp_modules = list(modules.values())
        for m in fsdp_modules:
            if "divide_factor" in case:
                m.set_gradient_divide_factor(float(case["divide_factor"]))
            if case.get("force_sum"):
                m.set_force_sum_reduction_for_comms(True)
            if case.get("custom_comms"):
                m.set_custom_reduce_scatter(HalvingReduceScatter())
                m.set_custom_all_gather(CountingAllGather())
            if case.get("hook"):
                m.set_all_reduce_hook(lambda t: t.mul_(2.0))
        if "set_reshard_after_forward" in case:
            model.set_reshard_after_forward(case["set_reshard_after_forward"])
        for name in case.get("no_unshard_in_backward", []):
            modules[name].set_unshard_in_backward(False)
        CountingAllGather.calls = 0
        micro = case.get("micro", [{}])
        adamw = case.get("optimizer", "sgd") == "adamw"
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0) if adamw else None
        state_dicts = case.get("state_dicts", False)
        extra = state_dicts or case.get("summon_writeback", False)
        for step in range(steps + (1 if extra else 0)):
            loaded = {}
            if state_dicts and step == steps:
                full = StateDictOptions(full_state_dict=True, cpu_offload=True)
                sd = get_model_state_dict(model, options=full)
                osd = get_optimizer_state_dict(model, opt, options=full)
                loaded["trainable_keys"] = list(get_model_state_dict(
                    model, options=StateDictOptions(ignore_frozen_params=True)).keys())
                loaded["sd_full"] = {n: t.float().reshape(-1).tolist() for n, t in sd.items()} if rank == 0 else {}
                names = [n for n, _ in model.named_parameters()]
                if rank == 0:
                    loaded["osd_full"] = {n: {k: osd["state"][n][k].float().reshape(-1).tolist()
                                              for k in ("exp_avg", "exp_avg_sq")} for n in names if n in osd["state"]}
                # Non-strict, sharded: w_in left out is reported missing.
                parts = get_model_state_dict(model)
                without = {n: t for n, t in parts.items() if n != "w_in"}
                ik = set_model_state_dict(model, without, options=StateDictOptions(strict=False))
                loaded["missing"] = list(ik.missing_keys)
                scaled = {n: t * 0.5 for n, t in sd.items()} if rank == 0 else {}
                from0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
                set_model_state_dict(model, scaled, options=from0)
                set_optimizer_state_dict(model, opt, osd if rank == 0 else {}, options=from0)
            for p in model.parameters():
                p.grad = None
            local = 0.0
            for m, mb in enumerate(micro):
                if fsdp1 is not None:
                    rows = torch.from_numpy(data[min(step, steps - 1), m, rank].copy())
                    loss = model(rows[:, :D_IN], rows[:, D_IN:]) / len(micro)
                    loss.backward()
                    local += loss.item()
                    continue
                model.set_requires_gradient_sync(mb.get("sync", True))
                for name in mb.get("no_sync_units", []):
                    modules[name].set_requires_gradient_sync(False, recurse=False)
                model.set_requires_all_reduce(mb.get("all_reduce", True))
                model.set_reshard_after_backward(mb.get("reshard_after_backward", True))
                model.set_is_last_backward(mb.get("is_last_backward", True))
                if case.get("unshard_first"):
                    modules["blocks.0"].unshard(async_op=True)
                rows = torch.from_numpy(data[min(step, steps - 1), m, rank].copy())
                x, y = rows[:, :D_IN], rows[:, D_IN:]
                loss = model(x, y) / len(micro)
                loss.backward()
                local += loss.item()
            t = torch.tensor([local], dtype=torch.float64)
            dist.all_reduce(t)
            grads = {}
            if fsdp1 is not None:
                with fsdp1.summon_full_params(model, with_grads=True):
                    for name, p in model.named_parameters():
                        grads[name] = p.grad.float().reshape(-1).tolist()
            for name, p in ([] if fsdp1 is not None else model.named_parameters()):
                if not p.requires_grad:
                    continue
                g = p.grad
                if g is None:
                    g = torch.zeros_like(p.to_local() if hasattr(p, "to_local") else p)
                if hasattr(g, "full_tensor"):
                    g = g.full_tensor()
                grads[name] = g.float().reshape(-1).tolist()
            line = {"case": case["name"], "step": step, "loss": t.item() / W, "grads": grads, **loaded}
            if case.get("custom_comms"):
                line["all_gathers"] = CountingAllGather.calls
            if adamw:
                opt.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-lr)
            if case.get("summon_writeback") and step == steps - 1:
                with fsdp1.summon_full_params(model, writeback=True), torch.no_grad():
                    for p in model.parameters():
                        p.mul_(0.5)
            if case.get("summon") and step == steps - 1:
                # FSDP2's view of the full parameters: each module unsharded, read, resharded.
                for m in fsdp_modules:
                    m.unshard()
                line["params"] = {n: p.detach().float().reshape(-1).tolist() for n, p in model.named_parameters()}
                for m in fsdp_modules:
                    m.reshard()
            out.write(json.dumps(line) + "\n")
        del model, modules
    out.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    faulthandler.enable()
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # see fsdp2_peer.py: gloo's threads may outlive finalization

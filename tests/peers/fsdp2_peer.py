#!/usr/bin/env python3
"""One rank of the PyTorch FSDP2 peer: trains Hugging Face transformers' LlamaForCausalLM
with torch.distributed.fsdp.fully_shard on CPU/gloo the way fsdp-train trains its Llama,
so that the two can be compared step by step (tests/peers/fsdp2_parity.py) and timed
against each other (bench/cpu/headtohead.py).

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment
(rank 0 hosts the store), or without them as a single process.

What matches fsdp-train (and where it is in our code):
- Weights: --hf-dir (config.json + safetensors). The model is built on the meta device,
  sharded, then each rank copies only its shards' rows from the safetensors file (one
  tensor at a time), as fsdp-train --init-from does; RoPE's inv_freq buffer is recomputed.
- Units: fully_shard on each decoder layer, then on the root (--wrap block).
  --sharding full: the layers' reshard_after_forward=True; grad-op: False; hybrid: a 2-D
  DeviceMesh (replicate, shard) with shard groups of --hybrid-shard-size consecutive ranks.
  --reshard-after-forward N (> 1): the decoder layers' reshard_after_forward=N (FSDP2's int,
  ZeRO++'s hpZ), as fsdp-train --reshard-after-forward N. The root's call leaves
  reshard_after_forward out, as users write it: FSDP2's default (None) keeps the root's
  parameters after forward, since backward needs them first. Passing True there would
  gather the root (embedding and head, most of a small model) once more in every backward,
  which no user of the default pays.
- Activation checkpointing: --activation-checkpointing checkpoints every decoder layer with
  torch.utils.checkpoint, non-reentrant (fsdp-train --activation-checkpointing).
- Mixed precision: --mixed-precision bf16 = MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32): bf16 compute, fp32 gradient reduction and fp32 sharded parameters.
- Batches: --batches PREFIX, peer_batches' files; rank r's micro-step a is the global batch's
  rows (a*W + r)*B .. +B (Note [Global batch rule], checked against fsdp-train's own ranks).
- Loss: cross entropy over every target, mean over the rank's micro-batch in fp32 (logits
  cast to fp32, as LlamaForCausalLMImpl::loss), divided by grad-accum and summed over the
  micro-steps; gradient sync only on the last micro-step (set_requires_gradient_sync). The
  logged loss is the sum over ranks / W — the mean over the global batch.
- Clipping: torch.nn.utils.clip_grad_norm_ on the global norm (0 = off, the norm is still
  computed and logged), as FsdpModule::clip_grad_norm: coef = max/(norm + 1e-6) when < 1.
- Optimizer: torch.optim.AdamW on all parameters in one group (fsdp-train decays every
  parameter, norms and embeddings included), betas, eps, weight decay as given; the
  learning rate is set before every step from fsdp-train's schedule (peerlib.lr_at).

Rank 0 appends one JSON line per step to --metrics-file: step, loss, lr, grad_norm,
step_time_s (from before zero_grad to after the loss all-reduce, the span fsdp-train's
step_time_s covers), world_size.

DCP (issue 36, tests/peers/dcp_roundtrip.py): --save-dcp DIR saves the model and optimizer with
torch.distributed.checkpoint after --save-dcp-at steps (get_state_dict, then dcp.save of
{"model": ..., "optimizer": ...}); --load-dcp DIR loads one before training (dcp.load, then
set_state_dict) and trains from --start-step. --dcp-format safetensors saves and loads the model
alone through HuggingFaceStorageWriter(save_distributed=True) / HuggingFaceStorageReader;
--dcp-layout torchtitan saves as torchtitan's CheckpointManager lays a Llama out (its names,
q/k rows in Meta's interleaved order, flatten_optimizer_state_dict) from full tensors.

--profile-steps N: rank 0 runs steps [--profile-start, +N) under torch.profiler (CPU) and
writes the operator table (self CPU time) to --profile-out.
"""
import argparse
import datetime
import faulthandler
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="Hugging Face model directory (config.json + safetensors)")
    p.add_argument("--batches", required=True, help="peer_batches output prefix (<prefix>.global.npy, .ranks.npy)")
    p.add_argument("--sharding", choices=["full", "grad-op", "hybrid"], default="full")
    p.add_argument("--hybrid-shard-size", type=int, default=0, help="hybrid: ranks per shard group")
    p.add_argument("--reshard-after-forward", type=int, default=0,
                   help="N > 1: the layers' reshard_after_forward=N (hpZ); 0: the strategy's bool")
    p.add_argument("--mixed-precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="checkpoint every decoder layer (non-reentrant torch.utils.checkpoint, early stop)")
    p.add_argument("--batch-size", type=int, required=True, help="B, per rank and micro-step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr", type=float, default=3e-5)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0, help="end of the cosine decay (default: --steps)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave PyTorch's default)")
    p.add_argument("--metrics-file", default="")
    p.add_argument("--profile-steps", type=int, default=0)
    p.add_argument("--profile-start", type=int, default=1)
    p.add_argument("--profile-out", default="")
    p.add_argument("--timeout-s", type=float, default=120, help="collective timeout")
    p.add_argument("--save-dcp", default="", help="save a DCP checkpoint into this directory")
    p.add_argument("--save-dcp-at", type=int, default=0, help="... after this many steps")
    p.add_argument("--load-dcp", default="", help="load a DCP checkpoint before training")
    p.add_argument("--start-step", type=int, default=0, help="the first step to train (after --load-dcp)")
    p.add_argument("--dcp-format", choices=["torch_save", "safetensors"], default="torch_save")
    p.add_argument("--dcp-layout", choices=["torch", "torchtitan"], default="torch")
    return p.parse_args(argv)


# --- torchtitan's Llama layout (torchtitan/models/llama3: names; q/k rows in Meta's order) ---

TITAN_LAYER = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
               "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
               "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
               "mlp.up_proj.weight": "feed_forward.w3.weight", "input_layernorm.weight": "attention_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight"}


def titan_name(hf):
    top = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".", 3)  # model, layers, N, rest
    return f"layers.{parts[2]}.{TITAN_LAYER[parts[3]]}"


def to_meta_rows(w, heads):
    """Hugging Face's rotate_half rows of q/k per head -> Meta's interleaved pairs (the inverse
    of transformers' convert_llama_weights_to_hf permute)."""
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def from_meta_rows(w, heads):
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def titan_heads(hf, config):
    if hf.endswith("self_attn.q_proj.weight"):
        return config.num_attention_heads
    if hf.endswith("self_attn.k_proj.weight"):
        return config.num_key_value_heads
    return 0


def save_dcp(a, model, opt, config, step, torch, dcp, rank):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, get_state_dict)
    if a.dcp_format == "safetensors":
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        dcp.save(get_model_state_dict(model), storage_writer=HuggingFaceStorageWriter(a.save_dcp, save_distributed=True))
        return
    if a.dcp_layout == "torch":
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=a.save_dcp)
        return
    # torchtitan: full (replicated) tensors renamed and permuted; dcp.save writes each once.
    full = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    msd = get_model_state_dict(model, options=full)
    osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                       flatten_optimizer_state_dict=True))
    def convert(hf, t):
        heads = titan_heads(hf, config)
        return to_meta_rows(t, heads) if heads and t.dim() == 2 else t
    model_sd = {titan_name(k): convert(k, v) for k, v in msd.items()}
    opt_sd = {}
    for k, v in osd.items():
        kind, rest = k.split(".", 1)  # state.<fqn>.<x> or param_groups.<fqn>.<x>
        fqn, x = rest.rsplit(".", 1)
        opt_sd[f"{kind}.{titan_name(fqn)}.{x}"] = convert(fqn, v) if torch.is_tensor(v) else v
    dcp.save({"model": model_sd, "optimizer": opt_sd,
              "train_state": {"step": torch.tensor(step, dtype=torch.int32)}}, checkpoint_id=a.save_dcp)


def load_dcp(a, model, opt, config, torch, dcp):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
    if a.dcp_format == "safetensors":
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        msd = get_model_state_dict(model)
        dcp.load(msd, storage_reader=HuggingFaceStorageReader(a.load_dcp))
        set_model_state_dict(model, msd)
        return
    if a.dcp_layout != "torch":
        raise peerlib.PeerError("--load-dcp reads the torch layout only")
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optimizer": osd}, checkpoint_id=a.load_dcp)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)


def load_sharded_weights(model, hf_dir, torch, distribute_tensor):
    """Copies each rank's shards from the safetensors file(s): one full tensor in memory at
    a time, each rank keeping only its rows (no communication)."""
    from safetensors import safe_open
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            where = json.load(f)["weight_map"]
    else:
        single = os.path.join(hf_dir, "model.safetensors")
        if not os.path.exists(single):
            raise peerlib.PeerError(f"--hf-dir {hf_dir} has neither model.safetensors nor "
                                    "model.safetensors.index.json (write it with save_pretrained)")
        where = None
    params = dict(model.named_parameters())
    files = {}
    try:
        for name, p in params.items():
            fname = os.path.join(hf_dir, where[name]) if where else single
            if where is not None and name not in where:
                raise peerlib.PeerError(f"{hf_dir}: no tensor '{name}' in its safetensors index")
            if fname not in files:
                files[fname] = safe_open(fname, framework="pt")
            if name not in files[fname].keys():
                raise peerlib.PeerError(f"{fname}: no tensor '{name}' (has {len(files[fname].keys())} others)")
            full = files[fname].get_tensor(name).to(torch.float32)
            if tuple(full.shape) != tuple(p.shape):
                raise peerlib.PeerError(f"{fname}: '{name}' has shape {tuple(full.shape)}, the model's is "
                                        f"{tuple(p.shape)}")
            local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
            with torch.no_grad():
                p.to_local().copy_(local)
            del full, local
    finally:
        files.clear()


def main(argv=None):
    a = parse_args(argv)
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import distribute_tensor
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(peerlib.free_port())
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    W, A, B = world, a.grad_accum, a.batch_size

    batches = peerlib.load_batches(a.batches, W, A, B)  # (S, A, W, B, T+1)
    if batches.shape[0] < a.steps:
        raise peerlib.PeerError(f"--batches {a.batches} holds {batches.shape[0]} steps, --steps is {a.steps}")
    T = batches.shape[-1] - 1
    mine = torch.from_numpy(np.ascontiguousarray(batches[:, :, rank]))  # (S, A, B, T+1)

    if a.sharding == "hybrid":
        hs = a.hybrid_shard_size
        if hs < 1 or W % hs != 0:
            raise peerlib.PeerError(f"--hybrid-shard-size {hs} must divide the world size {W}")
        mesh = init_device_mesh("cpu", (W // hs, hs), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("shard",))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if a.mixed_precision == "bf16" else MixedPrecisionPolicy())
    reshard = a.sharding != "grad-op"
    layer_reshard = a.reshard_after_forward if a.reshard_after_forward > 1 else reshard

    config = LlamaConfig.from_pretrained(a.hf_dir)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if a.activation_checkpointing:
        # transformers' own: each decoder layer's call through torch.utils.checkpoint
        # (use_reentrant=False, whose early stop ends the recompute once everything forward
        # saved is saved again). Names stay the model's, unlike checkpoint_wrapper's.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=layer_reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # FSDP2's default for the root (docstring)
    model.to_empty(device="cpu")
    model.model.rotary_emb = LlamaRotaryEmbedding(config=config)  # its buffers were meta
    load_sharded_weights(model, a.hf_dir, torch, distribute_tensor)
    model.train()
    V = config.vocab_size

    max_steps = a.max_steps or a.steps
    opt = torch.optim.AdamW(model.parameters(), lr=peerlib.lr_at(0, a.lr, a.min_lr, a.warmup_steps, max_steps),
                            betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)
    if a.load_dcp:
        import torch.distributed.checkpoint as dcp
        load_dcp(a, model, opt, config, torch, dcp)
    metrics = open(a.metrics_file, "a") if (rank == 0 and a.metrics_file) else None
    prof = None
    for step in range(a.start_step, a.steps):
        if a.save_dcp and step == a.save_dcp_at:
            import torch.distributed.checkpoint as dcp
            save_dcp(a, model, opt, config, step, torch, dcp, rank)
        if rank == 0 and a.profile_steps > 0 and step == a.profile_start:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        t0 = time.perf_counter()
        lr = peerlib.lr_at(step, a.lr, a.min_lr, a.warmup_steps, max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        local = 0.0
        for micro in range(A):
            rows = mine[step, micro]
            x, y = rows[:, :T], rows[:, 1:]
            model.set_requires_gradient_sync(micro == A - 1)
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1)) / A
            loss.backward()
            local += loss.item()
        if a.clip_grad > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        opt.step()
        t = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(t)
        loss_mean = t.item() / W
        step_time = time.perf_counter() - t0
        if prof is not None and step == a.profile_start + a.profile_steps - 1:
            prof.__exit__(None, None, None)
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
            with open(a.profile_out or "fsdp2_profile.txt", "w") as f:
                f.write(f"FSDP2 peer, rank 0 of {W}, steps {a.profile_start}..{step}, "
                        f"{torch.get_num_threads()} threads\n{table}\n")
            prof = None
        if metrics is not None:
            metrics.write(json.dumps({"step": step, "loss": loss_mean, "lr": lr, "grad_norm": float(norm),
                                      "step_time_s": step_time, "world_size": W}) + "\n")
            metrics.flush()
    if a.save_dcp and a.save_dcp_at == a.steps:
        import torch.distributed.checkpoint as dcp
        save_dcp(a, model, opt, config, a.steps, torch, dcp, rank)
    if metrics is not None:
        metrics.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # A SIGABRT ("terminate called without an active exception") is printed with every
    # thread's Python stack, so a crash says where it happened.
    faulthandler.enable()
    try:
        status = main()
        # Leave without interpreter finalization: PyTorch's Gloo worker threads can still
        # hold tensors then and abort the process after the run has finished and its metrics
        # are written (pytorch/pytorch#179291); everything of ours is flushed and closed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    except peerlib.PeerError as e:
        print(f"fsdp2_peer.py: error: {e}", file=sys.stderr)
        sys.exit(2)

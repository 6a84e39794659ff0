#!/usr/bin/env python3
"""PyTorch baselines for bench/gpu/run.sh: Hugging Face LlamaForCausalLM under
PyTorch FSDP, set up the way the published FSDP fine-tuning recipes do it.

  --impl fsdp1: torch.distributed.fsdp.FullyShardedDataParallel, FULL_SHARD,
                transformer_auto_wrap_policy on LlamaDecoderLayer, bf16
                MixedPrecision (param and reduce dtype; buffers stay fp32, as
                fsdp-train's), limit_all_gathers, activation checkpointing by
                apply_activation_checkpointing (non-reentrant checkpoint_wrapper
                on each decoder layer). At world size 1 FSDP1 replaces
                FULL_SHARD by NO_SHARD: the row's "sharding" says what ran.
  --impl fsdp2: fully_shard on each decoder layer and on the root, with
                MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16).
  --impl fsdp2-compile: the same, each decoder layer first compiled alone
                (torch.compile(layer, fullgraph=True), the compiled module put
                in the layer's place), as torchtitan does: after the
                activation-checkpointing wrapper, before fully_shard, so
                FSDP2's hooks run eagerly around the compiled layer. Every
                layer reuses one compiled graph; a fallback to eager (the
                recompile limit) is an error, not a quiet eager row. The
                warm-up steps absorb the compilation: "compile_s" is their
                time beyond as many measured steps. Where it cannot compile
                (no Triton on the GPU, no C++ compiler for inductor on the
                CPU, or the compiler fails) the result line says why:
                {"skipped": reason}, exit status 0.
Both: torch.optim.AdamW with fused=True (the fused kernel, as fsdp-train's
default AdamW: the same implementation class on both sides), the gradient
norm clipped to --clip-grad (FSDP1: FullyShardedDataParallel.clip_grad_norm_;
FSDP2: torch.nn.utils.clip_grad_norm_ over the DTensor parameters; 0: off), the
model's own loss (labels = input ids), attention through SDPA. On the CPU
(run.sh --dry-run) both run on gloo; FSDP1 is given the CPU as its device
(without device_id it refuses a machine without an accelerator).

Fair to both sides: the model is built on the device it trains on (fp32
parameters, as fsdp-train's masters); the peak memory counts from after the
setup (model, wrapping, optimizer), as fsdp-train's does; a step's outputs
(logits) are dropped before the next step, so only the loss survives it.

Runs in one process (world size 1) unless started by torchrun. Tokens come
from --tokens (raw little-endian uint32 ids, the file run.sh writes for
fsdp-train too), read in the same order. Prints one JSON line:
  {"impl", "sharding", "tokens_per_s", "step_time_s", "peak_mem_bytes", "losses", ...}
tokens_per_s and step_time_s cover the --steps measured steps after --warmup;
peak_mem_bytes is torch.cuda.max_memory_allocated() from the end of the setup
to the end of the run (CPU: the process's peak resident set). fsdp2-compile adds
"compile_s" and "graphs" (the frames dynamo compiled: 1, every layer's), or,
where it could not compile, prints {"row", "kind", "ckpt", "impl", "torch",
"skipped": why} and nothing measured.
"""
import argparse
import array
import faulthandler
import functools
import json
import os
import resource
import socket
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["fsdp1", "fsdp2", "fsdp2-compile"], required=True)
    p.add_argument("--config", required=True, help="Hugging Face config.json of the model")
    p.add_argument("--tokens", required=True, help="raw little-endian uint32 token ids")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=1, help="per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--clip-grad", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--row", default="", help="row name for run.sh's table")
    return p.parse_args()


def fail(msg):
    print(f"hf_fsdp.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cannot_compile(torch, device):
    """Why inductor cannot compile for `device` on this machine, or None."""
    if device == "cuda":
        from torch.utils._triton import has_triton
        return None if has_triton() else "Triton does not import (inductor's GPU backend needs it)"
    from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()  # the compiler inductor will run: $CXX, else g++
    except Exception as e:  # InvalidCxxCompiler; any other failure of the search says the same
        return f"no C++ compiler for inductor's CPU backend ({type(e).__name__}: {str(e).strip().splitlines()[0][:120]})"
    return None


def compile_errors(torch):
    """The exceptions that mean "this machine could not compile": dynamo's and inductor's own
    (BackendCompilerFailed wraps a failed C++ or Triton build; Unsupported is a graph break under
    fullgraph) and the recompile limit."""
    import torch._dynamo.exc as dynamo_exc
    return (dynamo_exc.TorchDynamoException, dynamo_exc.FailOnRecompileLimitHit)


def main():
    a = parse_args()
    try:
        import torch
        import torch.distributed as dist
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    except ImportError as e:
        fail(f"{e}: this baseline needs PyTorch 2.x and Hugging Face transformers (present on the GPU machine)")
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda but torch.cuda.is_available() is False")
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    local_rank = int(os.environ["LOCAL_RANK"])
    if a.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    row = {"row": a.row or a.impl, "kind": "llama", "ckpt": a.activation_checkpointing, "impl": a.impl,
           "torch": torch.__version__}
    skipped = cannot_compile(torch, a.device) if a.impl == "fsdp2-compile" else None
    if skipped:
        finish(dist, rank, {**row, "skipped": skipped})
        return

    with open(a.config) as f:
        cfg_dict = json.load(f)
    config = LlamaConfig(**cfg_dict)
    config.use_cache = False
    try:
        config._attn_implementation = "sdpa"
    except AttributeError:
        pass
    torch.manual_seed(0)
    with torch.device(device):  # built where it trains: no host copy, no move
        model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    bf16 = torch.bfloat16 if a.precision == "bf16" else torch.float32

    if a.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, LlamaDecoderLayer))

    if a.impl == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        model = FSDP(model,
                     auto_wrap_policy=policy,
                     sharding_strategy=ShardingStrategy.FULL_SHARD,
                     mixed_precision=MixedPrecision(param_dtype=bf16, reduce_dtype=bf16),
                     device_id=device,  # the CPU too: FSDP1 then runs on gloo
                     limit_all_gathers=True,
                     use_orig_params=False)
        sharding = model.sharding_strategy.name  # NO_SHARD at world size 1: FSDP1 switches by itself
    else:
        if a.impl == "fsdp2-compile":
            import torch._dynamo
            # One graph serves every layer (the same code, the parameters are inputs); should a
            # layer need its own, past the limit dynamo would run it eagerly without a word.
            torch._dynamo.config.fail_on_recompile_limit_hit = True
            for i, layer in enumerate(model.model.layers):
                model.model.layers[i] = torch.compile(layer, fullgraph=True)
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # PyTorch >= 2.6
        except ImportError:
            try:
                from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # 2.4, 2.5
            except ImportError:
                fail(f"FSDP2 (fully_shard) is not in PyTorch {torch.__version__}; it needs 2.4 or later")
        mp = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        sharding = "FULL_SHARD"  # fully_shard shards at any world size

    if a.activation_checkpointing:  # the wrapping took: every decoder layer is checkpointed
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
        wrapped = sum(1 for m in model.modules() if isinstance(m, CheckpointWrapper))
        if wrapped != config.num_hidden_layers:
            fail(f"activation checkpointing wrapped {wrapped} modules, not the {config.num_hidden_layers} decoder layers")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, fused=True)
    if a.impl == "fsdp1":
        clip = model.clip_grad_norm_  # the norm over every rank's shards
    else:
        def clip(max_norm):
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    tokens = array.array("I")
    with open(a.tokens, "rb") as f:
        tokens.frombytes(f.read())
    if sys.byteorder != "little":
        tokens.byteswap()
    window = a.seq_len
    per_step = a.batch_size * world
    need = (a.warmup + a.steps) * per_step * window
    if len(tokens) < need:
        fail(f"--tokens {a.tokens} holds {len(tokens)} tokens, the run needs {need}; write a larger file")
    data = torch.tensor(tokens[:need], dtype=torch.long).view(a.warmup + a.steps, world, a.batch_size, window)

    if a.device == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)  # the peak from here: the setup is not counted
    losses, times = [], []
    # Compilation happens inside the first steps (the backward's at the first backward): a
    # compile error there is this machine's, and the row says so instead of failing.
    errors = compile_errors(torch) if a.impl == "fsdp2-compile" else ()
    try:
        for step in range(a.warmup + a.steps):
            if a.device == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            x = data[step, rank].to(device, non_blocking=True)
            loss = model(input_ids=x, labels=x).loss  # the logits die here, not at the next step
            loss.backward()
            if a.clip_grad > 0:
                clip(a.clip_grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss = loss.detach().float()
            dist.all_reduce(loss)
            losses.append(loss.item() / world)  # .item() waits for the step
            if a.device == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    except errors as e:
        first = (str(e).strip().splitlines() or [""])[0]
        finish(dist, rank, {**row, "skipped": f"torch.compile failed in step {len(times)}: {type(e).__name__}: {first}"[:300]})
        return
    seconds = sum(times[a.warmup:])
    if a.device == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        **row,
        "sharding": sharding,
        "note": "" if sharding == "FULL_SHARD" else f"FSDP1 ran {sharding} (it replaces FULL_SHARD at world size 1)",
        "parameters": n_params,
        "world_size": world,
        "seq_len": a.seq_len,
        "batch_size": a.batch_size,
        "activation_checkpointing": a.activation_checkpointing,
        "optimizer": "AdamW, fused",
        "clip_grad": a.clip_grad,
        "tokens_per_s": a.steps * per_step * window / seconds,
        "step_time_s": seconds / a.steps,
        "peak_mem_bytes": peak,
        "losses": losses,
    }
    if a.impl == "fsdp2-compile":
        from torch._dynamo.utils import counters
        # The warm-up's time beyond as many ordinary steps: what compiling cost.
        result["compile_s"] = max(0.0, sum(times[:a.warmup]) - a.warmup * seconds / a.steps)
        result["graphs"] = counters["stats"]["unique_graphs"]  # frames dynamo compiled
    finish(dist, rank, result)


def finish(dist, rank, result):
    """Prints the one result line (rank 0) and leaves the process group."""
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # An abort is printed with every thread's Python stack, so it says where it happened.
    faulthandler.enable()
    main()
    # Leave without interpreter finalization: PyTorch's Gloo worker threads can still
    # hold tensors then and abort the process ("terminate called without an active
    # exception") after the result line is out (pytorch/pytorch#179291). The same
    # exit as tests/peers/fsdp2_peer.py; everything of ours is flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

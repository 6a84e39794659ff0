"""The reference of bench/comm/run.sh: PyTorch's own gloo backend, measured like bench_comm.

    python bench/comm/torch_gloo.py [--nproc N] [--iters K] [--mib a,b,c]

Starts N processes on 127.0.0.1 (torch.multiprocessing), each in a torch.distributed
gloo group, and times all_gather_into_tensor, reduce_scatter_tensor and all_reduce
on fp32 buffers of the given sizes exactly as bench_comm does: one warm-up call, a
barrier, then K calls, the slowest rank's time per call; GB/s of the full logical
buffer (all-gather output, reduce-scatter input, all-reduce tensor). Rank 0 prints
    RESULT <op> <MiB> <seconds per call> <GB/s>
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def time_per_call(iters, fn):
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    local = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return local.item()


def worker(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    w = args.nproc
    if rank == 0:
        print(f"torch_gloo: torch {torch.__version__} gloo, {w} processes, fp32, {args.iters} calls per size",
              flush=True)
    for mib in args.mib:
        total = mib * (1 << 20) // 4 // w * w
        n = total // w
        gb = total * 4 / 1e9
        full = torch.randn(total)
        shard = torch.randn(n)
        out_shard = torch.empty(n)
        reduced = torch.randn(total)
        ag = time_per_call(args.iters, lambda: dist.all_gather_into_tensor(full, shard))
        rs = time_per_call(args.iters, lambda: dist.reduce_scatter_tensor(out_shard, full))
        ar = time_per_call(args.iters, lambda: dist.all_reduce(reduced))
        if rank == 0:
            for op, s in (("all_gather", ag), ("reduce_scatter", rs), ("all_reduce", ar)):
                print(f"RESULT {op} {mib} {s:.6f} {gb / s:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--mib", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    args = p.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()

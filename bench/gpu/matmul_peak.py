#!/usr/bin/env python3
"""The card's rates, measured in the calling benchmark's run: the best of
--repeats timed batches of n x n x n products (bf16 on CUDA, the MFU
denominator; fp32 on CPU for dry runs), and for the step-time model's roofline
(docs/estimate.md, "The GPU roofline") the memory bandwidth of an elementwise
sum (two tensors read, one written) and, with --attention, causal
scaled_dot_product_attention forward and backward at the run's shape, its
FLOPs counted as the model counts them (2 H Dh T per token forward, the causal
half; 2.5 x that backward). Prints {"tflops": ..., "memory_gbyte_per_s": ...,
"attention_tflops": ..., ...}."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
p.add_argument("--n", type=int, default=8192)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--iters", type=int, default=20)
p.add_argument("--memory-elements", type=int, default=1 << 28, help="elements of each tensor of the sum")
p.add_argument("--attention", metavar="B,H,HKV,T,DH", help="attention's shape (batch, heads, kv heads, seq, head dim)")
a = p.parse_args()

dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)


def best_of(fn):
    """The shortest of --repeats batches of --iters calls of fn, seconds per batch (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    sync()
    best = float("inf")
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        for _ in range(a.iters):
            fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


x = torch.randn(a.n, a.n, device=a.device, dtype=dtype)
y = torch.randn(a.n, a.n, device=a.device, dtype=dtype)
name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
out = {"device": name, "dtype": str(dtype).replace("torch.", ""), "n": a.n,
       "tflops": 2.0 * a.n ** 3 * a.iters / best_of(lambda: x @ y) / 1e12}
del x, y

u = torch.randn(a.memory_elements, device=a.device, dtype=dtype)
v = torch.randn_like(u)
w = torch.empty_like(u)
moved = 3 * u.numel() * u.element_size()
out["memory_gbyte_per_s"] = moved * a.iters / best_of(lambda: torch.add(u, v, out=w)) / 1e9
del u, v, w

if a.attention:
    B, H, HKV, T, DH = (int(s) for s in a.attention.split(","))
    q = torch.randn(B, H, T, DH, device=a.device, dtype=dtype, requires_grad=True)
    k = torch.randn(B, HKV, T, DH, device=a.device, dtype=dtype, requires_grad=True)
    val = torch.randn(B, HKV, T, DH, device=a.device, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, H, T, DH, device=a.device, dtype=dtype)

    def attention():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, val, is_causal=True, enable_gqa=HKV != H)
        o.backward(grad)

    flops = 3.5 * 2 * H * DH * T * B * T
    out["attention_tflops"] = flops * a.iters / best_of(attention) / 1e12
    out["attention_shape"] = a.attention
print(json.dumps(out))

#!/usr/bin/env python3
"""The card's rates, measured in the calling benchmark's run: the best of
--repeats timed batches of n x n x n products (bf16 on CUDA, the MFU
denominator; fp32 on CPU for dry runs), and for the step-time model's roofline
(docs/estimate.md, "The GPU roofline") the memory bandwidth of an elementwise
sum (two tensors read, one written) and, with --attention, causal
scaled_dot_product_attention forward and backward at the run's shape, its
FLOPs counted as the model counts them (2 H Dh T per token forward, the causal
half; 2.5 x that backward), on CUDA also with cuDNN's attention tried first
(fsdp-train --attention-backend cudnn: cuDNN, then flash);
and the FP8 product rate of --fp8-linear rowwise (src/models/fp8.cpp):
torch._scaled_mm of n x n x n e4m3 operands with rowwise fp32 scales and a
bf16 output, with and without fast accumulation (forward's product uses it,
backward's d x does not: fp8_tflops is the two rates' harmonic mean, the rate
of one of each). The CPU has no rowwise _scaled_mm: a dry run times what
fsdp-train runs there, fp8.cpp's emulation (dequantized operands, an fp32
product rounded to bf16), and says so (fp8_how). Prints {"tflops": ...,
"memory_gbyte_per_s": ..., "attention_tflops": ..., "fp8_tflops": ..., ...}."""
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


def fp8_rates():
    """fp8_tflops (and how it was measured) for --fp8-linear rowwise's products, or fp8_error."""
    e4m3 = torch.float8_e4m3fn
    xa = torch.randn(a.n, a.n, device=a.device).to(e4m3)
    wb = torch.randn(a.n, a.n, device=a.device).to(e4m3)  # (N, K) row-major: its transpose is column-major
    sa = torch.ones(a.n, 1, device=a.device)
    sb = torch.ones(1, a.n, device=a.device)
    flops = 2.0 * a.n ** 3 * a.iters
    if a.device == "cpu":
        # What fsdp-train runs on the CPU (fp8.cpp's CPU twin; the CPU has no rowwise _scaled_mm): the
        # dequantized operands' fp32 product, rounded to bf16.
        deq_a, deq_b = xa.float() * sa, wb.float() * sb.t()
        rate = flops / best_of(lambda: (deq_a @ deq_b.t()).to(torch.bfloat16)) / 1e12
        return {"fp8_tflops": rate, "fp8_how": f"emulated as fsdp-train runs FP8 on the CPU (fp8.cpp's twin), {a.n} x {a.n}: "
                                             "a dry run's number"}

    def scaled(fast):
        return lambda: torch._scaled_mm(xa, wb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)
    try:
        fast, exact = (flops / best_of(scaled(f)) / 1e12 for f in (True, False))
    except (RuntimeError, AttributeError) as e:
        return {"fp8_error": str(e).splitlines()[0][:200]}
    return {"fp8_tflops": 2 / (1 / fast + 1 / exact), "fp8_fast_accum_tflops": fast, "fp8_exact_accum_tflops": exact,
            "fp8_how": f"rowwise torch._scaled_mm of {a.n} x {a.n} e4m3, bf16 out; the harmonic mean of fast and "
                       "exact accumulation"}


out.update(fp8_rates())

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
    if a.device == "cuda":
        # fsdp-train --attention-backend cudnn's order (Note [Attention backend]): cuDNN first, flash behind it.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
                out["attention_cudnn_tflops"] = flops * a.iters / best_of(attention) / 1e12
        except (RuntimeError, TypeError) as e:
            out["attention_cudnn_error"] = str(e).splitlines()[0][:200]
print(json.dumps(out))

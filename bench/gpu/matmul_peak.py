#!/usr/bin/env python3
"""The card's dense matmul rate, measured in the calling benchmark's run: the
best of --repeats timed batches of n x n x n products (bf16 on CUDA, the
MFU denominator; fp32 on CPU for dry runs). Prints {"tflops": ..., ...}."""
import argparse
import json
import time

import torch

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
p.add_argument("--n", type=int, default=8192)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--iters", type=int, default=20)
a = p.parse_args()

dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
x = torch.randn(a.n, a.n, device=a.device, dtype=dtype)
y = torch.randn(a.n, a.n, device=a.device, dtype=dtype)
sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
for _ in range(3):
    x @ y
sync()
best = float("inf")
for _ in range(a.repeats):
    t0 = time.perf_counter()
    for _ in range(a.iters):
        x @ y
    sync()
    best = min(best, time.perf_counter() - t0)
name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
print(json.dumps({"device": name, "dtype": str(dtype).replace("torch.", ""), "n": a.n,
                  "tflops": 2.0 * a.n ** 3 * a.iters / best / 1e12}))

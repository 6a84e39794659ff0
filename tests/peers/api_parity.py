#!/usr/bin/env python3
"""FSDP2's options and methods, fsdp-cpp against PyTorch FSDP2 itself, case by case.

    api_parity.py --api-peer PATH [--worlds 2,4] [--cases NAME,...] [--keep DIR]

Both sides train the same small model (tests/peers/api_peer.cpp, fsdp2_api_peer.py: an
input matrix, a shift unit, three residual blocks, an output matrix and a squared loss;
units: the root, shift, blocks.0-2) from the same initial weights on the same batches, with
SGD, one case after another in one launch per side and world size (process start-up
dominates on this machine). Every case sets one of FSDP2's options or methods on both sides
as each spells it (CASES below). Per step it compares the mean loss over the ranks and every
parameter's full gradient on every rank: the worst relative difference (of a loss, or of a
gradient tensor's largest element) must be at most the case's tolerance (fp32: 1e-6; a bf16
unit's: see the case). Cases that change the numbers (a halving custom reduce-scatter, an
all-reduce hook that doubles, a divide factor that sums) are checked against the baseline as
well, so a hook that was silently not called fails. Exit 1 on a failure, 2 on bad usage;
every process is bounded in time and killed on the way out.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
D_IN, D, F, D_OUT, BLOCKS = 6, 8, 12, 5, 3
STEPS, BATCH, MAX_MICRO, DATA_RANKS, LR = 4, 3, 2, 4, 0.02

# name: (case, tolerance, expected relation to the baseline: None, or the factor its
# first step's gradients have against "baseline"'s)
CASES = [
    ({"name": "baseline"}, 1e-6, None),
    ({"name": "reshard_after_forward false", "reshard": False}, 1e-6, 1.0),
    ({"name": "reshard_after_forward 2 (hpZ)", "reshard": 2, "worlds": [4]}, 1e-6, 1.0),
    ({"name": "set_reshard_after_forward(False) after sharding", "set_reshard_after_forward": False}, 1e-6, 1.0),
    ({"name": "per-unit reshard, root resharded",
      "units": {"blocks.0": {"reshard": False}, "blocks.1": {"reshard": 2}, "<root>": {"reshard": True}},
      "worlds": [4]}, 1e-6, 1.0),
    ({"name": "hybrid 2 x 2", "sharding": "hybrid", "hybrid_shard_size": 2, "worlds": [4]}, 1e-6, 1.0),
    ({"name": "hybrid 2 x 2, reshard_after_forward false (_HYBRID_SHARD_ZERO2)", "sharding": "hybrid",
      "hybrid_shard_size": 2, "reshard": False, "worlds": [4]}, 1e-6, 1.0),
    ({"name": "per-unit mixed precision: blocks.1 bf16, output fp32",
      "units": {"blocks.1": {"mp": {"param": "bf16", "reduce": "fp32", "output": "fp32"}}}}, 1e-6, None),
    ({"name": "per-unit output_dtype and cast_forward_inputs false: blocks.1 bf16 out, blocks.2 takes it as is",
      "units": {"blocks.1": {"mp": {"param": "bf16", "reduce": "fp32", "output": "bf16"}},
                "blocks.2": {"mp": {"param": "bf16", "reduce": "fp32", "output": "fp32",
                                    "cast_forward_inputs": False}}}},
     1e-6, None),
    ({"name": "per-unit CPU offload (pin_memory false)", "units": {"blocks.0": {"offload": True}}}, 1e-6, 1.0),
    ({"name": "explicit prefetch lists",
      "units": {"blocks.0": {"forward_prefetch": ["blocks.1", "blocks.2"]},
                "blocks.2": {"backward_prefetch": ["blocks.1", "blocks.0"]}}}, 1e-6, 1.0),
    ({"name": "no_sync accumulation", "micro": [{"sync": False}, {}]}, 1e-6, None),
    ({"name": "set_requires_gradient_sync(False, recurse=False) on blocks.1",
      "micro": [{"no_sync_units": ["blocks.1"]}, {}]}, 1e-6, None),
    ({"name": "set_reshard_after_backward(False) while accumulating",
      "micro": [{"sync": False, "reshard_after_backward": False}, {}]}, 1e-6, None),
    ({"name": "set_is_last_backward(False) on the first micro-batch",
      "micro": [{"is_last_backward": False}, {}]}, 1e-6, None),
    ({"name": "set_requires_all_reduce(False) on the first micro-batch (HSDP)", "sharding": "hybrid",
      "hybrid_shard_size": 2, "micro": [{"all_reduce": False}, {}], "worlds": [4]}, 1e-6, None),
    ({"name": "set_unshard_in_backward(False) on shift", "no_unshard_in_backward": ["shift"]}, 1e-6, 1.0),
    ({"name": "gradient divide factor 1 with force-sum (a sum)", "divide_factor": 1.0, "force_sum": True},
     1e-6, "world"),
    ({"name": "force-sum reduction (the mean, divided after)", "force_sum": True}, 1e-6, 1.0),
    ({"name": "gradient divide factor 2 on HSDP 2 x 2 (shard mean, replica sum)", "sharding": "hybrid",
      "hybrid_shard_size": 2, "divide_factor": 2.0, "worlds": [4]}, 1e-6, 2.0),
    ({"name": "custom all-gather and reduce-scatter (halving)", "custom_comms": True}, 1e-6, 0.5),
    ({"name": "all-reduce hook (doubling)", "hook": True}, 1e-6, 2.0),
    ({"name": "all-reduce hook on HSDP (after the replica all-reduce)", "sharding": "hybrid",
      "hybrid_shard_size": 2, "hook": True, "worlds": [4]}, 1e-6, 2.0),
    ({"name": "ignored_params: blocks.1.w1", "ignored": ["blocks.1.w1"]}, 1e-6, None),
    ({"name": "register_fsdp_forward_method: blocks.2.encode", "encode": True}, 1e-6, None),
    ({"name": "unshard(async_op=True) before forward", "unshard_first": True}, 1e-6, 1.0),
    ({"name": "summon_full_params vs unshard()", "summon": True}, 1e-6, 1.0),
    ({"name": "FSDP1 NO_SHARD", "sharding": "none", "fsdp1": {"strategy": "NO_SHARD"}}, 1e-6, 1.0),
    ({"name": "FSDP1 _HYBRID_SHARD_ZERO2", "sharding": "hybrid", "hybrid_shard_size": 2, "reshard": False,
      "fsdp1": {"strategy": "_HYBRID_SHARD_ZERO2"}, "worlds": [4]}, 1e-6, 1.0),
    ({"name": "FSDP1 BACKWARD_POST, forward_prefetch, limit_all_gathers", "backward_prefetch": "post",
      "forward_prefetch": True, "limit_all_gathers": 1, "fsdp1": {}}, 1e-6, 1.0),
    ({"name": "FSDP1 size_based_auto_wrap_policy(150)", "wrap_size": 150, "fsdp1": {}}, 1e-6, 1.0),
    ({"name": "FSDP1 summon_full_params(writeback=True)", "summon_writeback": True, "fsdp1": {}}, 1e-6, 1.0),
    ({"name": "state dicts: full (cpu_offload, rank 0), sharded, optimizer, ignore_frozen, strict false, "
              "broadcast_from_rank0", "optimizer": "adamw", "frozen": ["blocks.0.b1"], "state_dicts": True},
     1e-6, None),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api-peer", required=True, help="the api_peer program (tests/peers)")
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--cases", default="", help="only these case names (comma-separated prefixes)")
    p.add_argument("--timeout-s", type=float, default=240, help="limit for each side's run")
    p.add_argument("--keep", default="")
    return p.parse_args()


def write_inputs(work):
    rng = np.random.default_rng(1234)
    shapes = [("w_in", (D, D_IN)), ("w_out", (D_OUT, D)), ("shift.s", (D,))]
    for i in range(BLOCKS):
        shapes += [(f"blocks.{i}.w1", (F, D)), (f"blocks.{i}.b1", (F,)), (f"blocks.{i}.w2", (D, F))]
    init = np.concatenate([(rng.standard_normal(int(np.prod(s))) * 0.4).astype(np.float32) for _, s in shapes])
    init.tofile(os.path.join(work, "init.bin"))
    data = rng.standard_normal((STEPS, MAX_MICRO, DATA_RANKS, BATCH, D_IN + D_OUT)).astype(np.float32)
    data.tofile(os.path.join(work, "data.bin"))
    return dict(shapes)


def run_side(a, work, world, name, argv_of):
    procs = peerlib.ProcessSet()
    port = peerlib.free_port()
    with procs:
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1")
            procs.start(f"{name} rank {r}", argv_of(r), env, os.path.join(work, f"{name}.w{world}.rank{r}.log"))
        procs.wait(a.timeout_s)


def read(prefix, rank):
    out = {}
    with open(f"{prefix}.rank{rank}.jsonl") as f:
        for line in f:
            j = json.loads(line)
            out[(j["case"], j["step"])] = j
    return out


_cache = {}


def read_cached(prefix, rank):
    if (prefix, rank) not in _cache:
        _cache[(prefix, rank)] = read(prefix, rank)
    return _cache[(prefix, rank)]


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.max(np.abs(b)) if b.size else 0.0, 1e-30)
    return float(np.max(np.abs(a - b)) / scale) if b.size else 0.0


def main():
    a = parse_args()
    worlds = [int(w) for w in a.worlds.split(",") if w]
    chosen = [c for c in CASES if not a.cases or any(c[0]["name"].startswith(p) for p in a.cases.split(","))]
    work = a.keep or tempfile.mkdtemp(prefix="fsdp-api-parity.")
    os.makedirs(work, exist_ok=True)
    failures = []
    try:
        write_inputs(work)
        spec = {"steps": STEPS, "batch": BATCH, "max_micro": MAX_MICRO, "data_ranks": DATA_RANKS, "lr": LR,
                "cases": [c for c, _, _ in chosen]}
        with open(os.path.join(work, "cases.json"), "w") as f:
            json.dump(spec, f)
        common = ["--cases", os.path.join(work, "cases.json"), "--init", os.path.join(work, "init.bin"),
                  "--data", os.path.join(work, "data.bin")]
        py = peerlib.venv_python()
        for W in worlds:
            ours, peer = os.path.join(work, f"ours.w{W}"), os.path.join(work, f"peer.w{W}")
            run_side(a, work, W, "ours", lambda r: [a.api_peer, *common, "--out", ours])
            run_side(a, work, W, "peer", lambda r: [py, os.path.join(HERE, "fsdp2_api_peer.py"), *common,
                                                    "--out", peer])
            print(f"world size {W}")
            for r in range(W):
                got, want = read(ours, r), read(peer, r)
                for case, tol, relation in chosen:
                    name = case["name"]
                    if "worlds" in case and W not in case["worlds"]:
                        continue
                    worst_loss = worst_grad = 0.0
                    worst_param = ""
                    extra = case.get("state_dicts") or case.get("summon_writeback")
                    for step in range(STEPS + (1 if extra else 0)):
                        g, w = got.get((name, step)), want.get((name, step))
                        if g is None or w is None:
                            failures.append(f"W={W} rank {r} {name} step {step}: missing on "
                                            f"{'our' if g is None else 'the peer'} side")
                            continue
                        worst_loss = max(worst_loss, abs(g["loss"] - w["loss"]) / max(abs(w["loss"]), 1e-30))
                        if set(g["grads"]) != set(w["grads"]):
                            failures.append(f"W={W} {name}: parameters differ: ours {sorted(g['grads'])}, "
                                            f"FSDP2 {sorted(w['grads'])}")
                            continue
                        for p in w["grads"]:
                            d = rel(g["grads"][p], w["grads"][p])
                            if d > worst_grad:
                                worst_grad, worst_param = d, p
                        for key in ("params", "sd_full"):
                            if key in w:
                                if set(g.get(key, {})) != set(w[key]):
                                    failures.append(f"W={W} rank {r} {name}: {key} names differ: ours "
                                                    f"{sorted(g.get(key, {}))}, FSDP2 {sorted(w[key])}")
                                    continue
                                for p in w[key]:
                                    worst_grad = max(worst_grad, rel(g[key][p], w[key][p]))
                        if "osd_full" in w:
                            for p in w["osd_full"]:
                                for k in ("exp_avg", "exp_avg_sq"):
                                    worst_grad = max(worst_grad, rel(g["osd_full"][p][k], w["osd_full"][p][k]))
                        for key in ("trainable_keys", "missing"):
                            if key in w and g.get(key) != w[key]:
                                failures.append(f"W={W} rank {r} {name}: {key} ours {g.get(key)}, FSDP2 {w[key]}")
                        if "sd_parts" in g and r == 0:
                            # Every rank's parts of each parameter, put together, are the full tensor.
                            for p, full in w.get("sd_full", {}).items():
                                whole = np.full(len(full), np.nan)
                                for rr in range(W):
                                    off, vals = read_cached(ours, rr)[(name, step)]["sd_parts"][p]
                                    whole[off:off + len(vals)] = vals
                                if np.isnan(whole).any():
                                    failures.append(f"W={W} {name}: the ranks' parts of {p} do not cover it")
                                    continue
                                worst_grad = max(worst_grad, rel(whole, full))
                        if "all_gathers" in w and g.get("all_gathers") != w["all_gathers"]:
                            failures.append(f"W={W} {name} step {step}: {g.get('all_gathers')} custom all-gathers, "
                                            f"FSDP2 {w['all_gathers']}")
                    if r == 0:
                        print(f"  {name:88s} loss {worst_loss:.1e}  gradients {worst_grad:.1e}"
                              + (f" ({worst_param})" if worst_param else ""))
                    if worst_loss > tol or worst_grad > tol:
                        failures.append(f"W={W} rank {r} {name}: loss {worst_loss:.2e}, gradients {worst_grad:.2e} "
                                        f"({worst_param}) > {tol:g}")
                    if relation is not None and r == 0:
                        base = want.get(("baseline", 0))
                        factor = float(W) if relation == "world" else relation
                        mine = got.get((name, 0))
                        if base and mine:
                            d = max(rel(np.asarray(mine["grads"][p]) / factor, base["grads"][p]) for p in base["grads"])
                            if d > 1e-5:
                                failures.append(f"W={W} {name}: step-0 gradients are not {factor:g} x the baseline's "
                                                f"(worst {d:.2e}): the option did not act")
    except peerlib.PeerError as e:
        print(f"api_parity.py: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    print("api parity:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

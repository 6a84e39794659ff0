#!/usr/bin/env python3
"""peft as the golden model for fsdp-cpp's LoRA (models/lora.h, checkpoint/peft.h).

A tiny random model is written by transformers' save_pretrained and an adapter by
peft's save_pretrained (LoraConfig r=4, lora_alpha=8, every projection targeted,
dropout 0), with lora_A and lora_B set to random values: with peft's B = 0 the
adapters would be invisible and A's gradient zero. Our side is hf_probe
(tests/hf/hf_probe.cpp) and the fsdp-train CLI. Shared helpers (families, the
token batch, comparison, failure list) come from test_transformers.py.

Parts (one ctest test each; `python3 test_lora.py PART --probe ... --train ... --work DIR`):
  parity  logits, loss and the gradient of every lora_A / lora_B weight, ours
          (`hf_probe lora`: the module unsharded, and sharded under fully_shard
          with a frozen base) against PeftModel.from_pretrained(base, adapter)
          in training mode, fp32, SDPA; for llama2 (MHA, untied) and qwen3 (q/k/v/o
          biases, q/k norms). Negative control: the base model's logits are far.
  export  our adapter export (`hf_probe lora-export ... adapter`) read by
          PeftModel.from_pretrained: the same tensors, config and logits; our
          merged export (`... merged`) read by plain transformers: peft's
          merge_and_unload weights and the adapted logits; the CLI
          (`fsdp-train --init-from --lora-rank --export-hf`, with and without
          --merge-lora): trained adapters that peft reads with our logits; the
          CLI's refusals of bad --lora-* flags; a LoRA run resumed from its
          checkpoint at another world size, and that checkpoint converted
          (--max-steps 0); --lora-dropout resumed and recomputed; --init-adapter
          with and without --sync-module-states.

Tolerance: max|ours - theirs| <= 1e-5 x max|theirs| (fp32; see test_transformers.py).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_transformers as tt  # noqa: E402  (sets the offline environment first)

import torch  # noqa: E402
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

TOL = 1e-5
RANK, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FAMILIES = ["llama2", "qwen3"]


def write_adapter(base, directory, seed):
    """peft's save_pretrained of an adapter with random (nonzero) A and B."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS,
                                                  lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if ".lora_A." in name:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif ".lora_B." in name:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)
    peft_model.save_pretrained(directory)
    return directory


def our_name(peft_name):
    """base_model.model.X.lora_A.default.weight -> X.lora_A.weight"""
    return peft_name[len("base_model.model."):].replace(".default.", ".")


def peft_model(base, adapter, trainable=False):
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    return PeftModel.from_pretrained(model, adapter, is_trainable=trainable)


def peft_forward_backward(base, adapter, tokens, targets):
    model = peft_model(base, adapter, trainable=True)
    model.train()  # dropout 0: the same math as eval, as in training
    out = model(input_ids=tokens, labels=targets, shift_labels=targets)
    out.loss.backward()
    grads = {our_name(n): p.grad.detach().float() for n, p in model.named_parameters() if p.requires_grad}
    return out.logits.detach().float(), out.loss.detach().float(), grads


def peft_logits(base, adapter, tokens):
    model = peft_model(base, adapter)
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def part_parity(args):
    batch = os.path.join(args.work, "batch.safetensors")
    tokens, targets = tt.token_batch(batch)
    for i, family in enumerate(FAMILIES):
        base = tt.write_family(family, os.path.join(args.work, family))
        adapter = write_adapter(base, os.path.join(args.work, family + "-adapter"), 100 + i)
        logits, loss, grads = peft_forward_backward(base, adapter, tokens, targets)
        tt.check(len(grads) == 2 * 7 * 2, "%s: peft has %d trainable tensors, expected 28" % (family, len(grads)))
        base_gap = (tt.hf_logits(base, tokens) - logits).abs().max().item() / logits.abs().max().item()
        tt.check(base_gap > 0.05, "%s: the adapter changes the logits by only %.3g of their max: a weak test" % (
            family, base_gap))
        for layout in ["unsharded", "sharded"]:
            out = os.path.join(args.work, "%s.%s.safetensors" % (family, layout))
            _, _, seconds = tt.run([args.probe, "lora", base, adapter, batch, out, layout])
            if not os.path.exists(out):
                continue
            ours, _ = tt.probe_outputs(out)
            w = tt.Worst()
            label = "%s %s" % (family, layout)
            tt.compare(label, "logits", ours["logits"], logits, TOL, w)
            tt.check(abs(ours["loss"].item() - loss.item()) <= 1e-6 * abs(loss.item()),
                     "%s: loss %.8f vs peft's %.8f" % (label, ours["loss"].item(), loss.item()))
            ours_grads = {k[len("grad."):]: v for k, v in ours.items() if k.startswith("grad.")}
            tt.check(sorted(ours_grads) == sorted(grads), "%s: gradients of %s, peft's of %s" % (
                label, sorted(ours_grads)[:4], sorted(grads)[:4]))
            for name in grads:
                if name in ours_grads:
                    tt.compare(label, "grad." + name, ours_grads[name], grads[name], TOL, w)
            print("[parity] %-6s %-9s (%.1f s): logits, loss and %d LoRA gradients vs peft: %s (the adapter moves "
                  "the logits by %.3g of their max)" % (family, layout, seconds, len(ours_grads), w.text(), base_gap),
                  flush=True)


def check_adapter_dir(label, directory, source_adapter):
    """Our adapter export: peft's config, the source's tensors."""
    cfg = PeftConfig.from_pretrained(directory)
    tt.check(cfg.peft_type == "LORA" and cfg.r == RANK and cfg.lora_alpha == ALPHA and cfg.task_type == "CAUSAL_LM"
             and sorted(cfg.target_modules) == sorted(TARGETS),
             "%s: adapter_config.json reads as %s" % (label, cfg))
    if source_adapter:
        theirs = load_file(os.path.join(source_adapter, "adapter_model.safetensors"))
        ours = load_file(os.path.join(directory, "adapter_model.safetensors"))
        tt.check(sorted(ours) == sorted(theirs), "%s: tensors %s vs peft's %s" % (label, sorted(ours)[:3],
                                                                                 sorted(theirs)[:3]))
        for name in theirs:
            tt.check(name not in ours or torch.equal(ours[name], theirs[name]), "%s: %s differs" % (label, name))


def corpus_file(work):
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(200):
            f.write("Line %d: the quick brown fox jumps over the lazy dog, %d times.\n" % (i, i * 7 % 13))
    return corpus


def train(args, base, corpus, out, *extra, steps=2, procs=1, expect_rc=0):
    # The same global batch (2) at every world size, so runs of different sizes read the same data.
    cmd = [args.train, "--init-from", base, "--data", corpus, "--seq-len", str(tt.SEQ), "--batch-size", str(2 // procs),
           "--max-steps", str(steps), "--lr", "1e-2", "--min-lr", "1e-2", "--warmup-steps", "0", "--log-every", "1", "--lora-rank", str(RANK),
           "--lora-alpha", str(ALPHA), "--lora-targets", ",".join(TARGETS), "--nproc-per-node", str(procs)]
    if out:
        cmd += ["--export-hf", out]
    # Later flags win (CLI11 keeps the last value): the extras override the defaults above.
    return tt.run(cmd + list(extra), expect_rc=expect_rc, timeout=180)


def part_export(args):
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, tt.VOCAB, (tt.BATCH, tt.SEQ), generator=g, dtype=torch.int64)
    batch = os.path.join(args.work, "batch.safetensors")
    save_file({"tokens": tokens, "targets": tokens.clone()}, batch)
    base = tt.write_family("llama2", os.path.join(args.work, "llama2"))
    adapter = write_adapter(base, os.path.join(args.work, "llama2-adapter"), 100)
    reference = peft_logits(base, adapter, tokens)

    # 1. The library path: adapter export read by peft, merged export by transformers.
    out = os.path.join(args.work, "adapter-export")
    tt.run([args.probe, "lora-export", base, adapter, out, "adapter"])
    if os.path.exists(os.path.join(out, "adapter_config.json")):
        check_adapter_dir("adapter export", out, adapter)
        d = (peft_logits(base, out, tokens) - reference).abs().max().item()
        tt.check(d == 0.0, "adapter export: peft's logits differ by %.3g" % d)
        print("[export] adapter export: peft reads r %d, alpha %d, targets, the same tensors; logits max |diff| %.3g"
              % (RANK, ALPHA, d), flush=True)
    merged = os.path.join(args.work, "merged-export")
    tt.run([args.probe, "lora-export", base, adapter, merged, "merged"])
    if os.path.exists(os.path.join(merged, "config.json")):
        ours = load_file(os.path.join(merged, "model.safetensors"))
        theirs = {k: v.detach() for k, v in peft_model(base, adapter).merge_and_unload().state_dict().items()}
        tt.check(sorted(ours) == sorted(theirs), "merged export: tensors %s vs merge_and_unload's %s" % (
            sorted(set(ours) ^ set(theirs))[:4], ""))
        w = tt.Worst()
        for name in theirs:
            if name in ours:
                tt.compare("merged export", name, ours[name], theirs[name], 1e-6, w)
        tt.compare("merged export", "logits", tt.hf_logits(merged, tokens), reference, TOL, w)
        print("[export] merged export: weights vs peft's merge_and_unload and transformers' logits vs the adapted "
              "model: %s" % w.text(), flush=True)

    # 2. The CLI: two steps of LoRA training, the adapter read by peft with our logits;
    #    the same run with --merge-lora read by plain transformers with the same logits.
    corpus = corpus_file(args.work)
    cli = os.path.join(args.work, "cli-adapter")
    rc, text, seconds = train(args, base, corpus, cli)
    if rc != 0:
        return
    check_adapter_dir("fsdp-train adapter", cli, None)
    trained = load_file(os.path.join(cli, "adapter_model.safetensors"))
    moved = max(v.abs().max().item() for k, v in trained.items() if ".lora_B." in k)
    tt.check(moved > 0, "fsdp-train: two steps of LoRA training left every lora_B at 0")
    probe = os.path.join(args.work, "cli.probe.safetensors")
    tt.run([args.probe, "lora", base, cli, batch, probe, "sharded"])
    theirs = peft_logits(base, cli, tokens)
    w = tt.Worst()
    if os.path.exists(probe):
        tt.compare("fsdp-train adapter", "logits", tt.probe_outputs(probe)[0]["logits"], theirs, TOL, w)
    cli_merged = os.path.join(args.work, "cli-merged")
    rc, _, _ = train(args, base, corpus, cli_merged, "--merge-lora")
    if rc == 0:
        tt.compare("fsdp-train --merge-lora", "logits", tt.hf_logits(cli_merged, tokens), theirs, TOL, w)
    print("[export] fsdp-train --lora-rank %d (%.1f s): lora_B moved to %.3g; peft's logits of our adapter vs ours, "
          "and plain transformers' of the --merge-lora export vs peft's: %s" % (RANK, seconds, moved, w.text()),
          flush=True)

    # 3. Refusals before any worker starts (exit 2, the flag and the fix named).
    for extra, needle in [(["--lora-rank", "-1"], "--lora-rank -1 must be >= 1"),
                          (["--lora-rank", "0", "--merge-lora"], "--merge-lora needs LoRA"),
                          (["--lora-targets", "q_proj,qkv_proj"], "'qkv_proj' matches no Linear layer"),
                          (["--lora-dropout", "1"], "--lora-dropout 1 must lie in [0, 1)"),
                          (["--lora-rank", "8", "--init-adapter", cli], "has r 4")]:
        rc, text, _ = train(args, base, corpus, None, *extra, expect_rc=2)
        tt.check(needle in text, "fsdp-train %s: expected '%s' in:\n%s" % (" ".join(extra), needle, text[-1000:]))

    # 4. Resume with adapters at another world size: 2 steps on 2 processes, checkpoint,
    #    2 more on 1 process = 4 uninterrupted steps on 2 processes.
    ck = os.path.join(args.work, "ck")
    straight = os.path.join(args.work, "straight")
    resumed = os.path.join(args.work, "resumed")
    rc1, _, _ = train(args, base, corpus, straight, steps=4, procs=2)
    rc2, _, _ = train(args, base, corpus, None, "--checkpoint-dir", ck, steps=2, procs=2)
    rc3, text, _ = train(args, base, corpus, resumed, "--checkpoint-dir", ck, "--resume", steps=4, procs=1)
    if rc1 == 0 and rc2 == 0 and rc3 == 0:
        tt.check("Resumed from" in text, "the LoRA run did not resume:\n" + text[-2000:])
        a = load_file(os.path.join(straight, "adapter_model.safetensors"))
        b = load_file(os.path.join(resumed, "adapter_model.safetensors"))
        w = tt.Worst()
        for name in a:
            tt.compare("resumed at world size 1", name, b[name], a[name], TOL, w)
        print("[export] LoRA checkpoint of 2 processes resumed on 1: adapters after 4 steps vs uninterrupted: %s"
              % w.text(), flush=True)

        # 5. Converting that checkpoint (--max-steps 0): its newest step is the resumed run's
        #    last, so the adapter equals the one that run exported, tensor for tensor.
        conv = os.path.join(args.work, "converted")
        rc, text, _ = tt.run([args.train, "--max-steps", "0", "--resume", "--checkpoint-dir", ck, "--export-hf", conv,
                              "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--lora-targets",
                              ",".join(TARGETS)], timeout=180)
        if rc == 0:
            check_adapter_dir("--max-steps 0 conversion of a LoRA checkpoint", conv, resumed)
            print("[export] --max-steps 0 conversion of the LoRA checkpoint: peft reads it; the tensors equal the "
                  "run's own export", flush=True)

        # 5b. --lora-dropout 0.1 at 2 processes. The masks are keyed by (seed, step, micro-batch,
        #     rank), so a run resumed at the same world size and one that recomputes its layers
        #     (--activation-checkpointing) draw the same masks: both equal the uninterrupted run
        #     bit for bit. Negative control: the adapter differs from the run without dropout.
        drop = ["--lora-dropout", "0.1"]
        ck_d = os.path.join(args.work, "ck-dropout")
        outs = {label: os.path.join(args.work, "dropout-" + label) for label in ("straight", "resumed", "recomputed")}
        rcs = [train(args, base, corpus, outs["straight"], *drop, steps=4, procs=2)[0],
               train(args, base, corpus, None, *drop, "--checkpoint-dir", ck_d, steps=2, procs=2)[0],
               train(args, base, corpus, outs["resumed"], *drop, "--checkpoint-dir", ck_d, "--resume", steps=4,
                     procs=2)[0],
               train(args, base, corpus, outs["recomputed"], *drop, "--activation-checkpointing", steps=4,
                     procs=2)[0]]
        if rcs == [0, 0, 0, 0]:
            d = {k: load_file(os.path.join(v, "adapter_model.safetensors")) for k, v in outs.items()}
            for label in ("resumed", "recomputed"):
                differ = [k for k in d["straight"] if not torch.equal(d["straight"][k], d[label][k])]
                tt.check(not differ, "--lora-dropout 0.1, %s: differs from the uninterrupted run in %s" % (
                    label, differ[:3]))
            no_dropout = a  # part 4's uninterrupted run: the same 4 steps at 2 processes
            gap = max((d["straight"][k] - no_dropout[k]).abs().max().item() for k in no_dropout)
            tt.check(gap > 0, "--lora-dropout 0.1 gave the adapter of a run without dropout")
            print("[export] --lora-dropout 0.1 at 2 processes: resumed after 2 of 4 steps and recomputed under "
                  "--activation-checkpointing, both identical to the uninterrupted run; %.3g from the run "
                  "without dropout" % gap, flush=True)

    # 6. --init-adapter at 2 processes, each rank reading its own shards or (--sync-module-states)
    #    rank 0 reading everything and broadcasting: the two runs give the same adapter bit for
    #    bit, and 2 steps at lr 1e-2 leave it near the one it started from (a fresh lora_B would
    #    be 0, and peft's here is not).
    source = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    runs = {}
    for label, extra in [("own shards", []), ("--sync-module-states", ["--sync-module-states"])]:
        out = os.path.join(args.work, "init-adapter-%d" % len(runs))
        rc, _, _ = train(args, base, corpus, out, "--init-adapter", adapter, *extra, steps=2, procs=2)
        if rc == 0:
            runs[label] = load_file(os.path.join(out, "adapter_model.safetensors"))
    if len(runs) == 2:
        a, b = runs["own shards"], runs["--sync-module-states"]
        tt.check(sorted(a) == sorted(b) == sorted(source), "--init-adapter: tensors %s, %s, peft's %s" % (
            sorted(a)[:2], sorted(b)[:2], sorted(source)[:2]))
        differ = [k for k in a if k in b and not torch.equal(a[k], b[k])]
        tt.check(not differ, "--init-adapter with --sync-module-states differs from without in %s" % differ[:3])
        moved = max((a[k] - source[k]).abs().max().item() for k in source if k in a)
        start = max(source[k].abs().max().item() for k in source if ".lora_B." in k)
        tt.check(moved < 0.1 < start, "--init-adapter: the adapter moved by %.3g from peft's (lora_B up to %.3g): "
                 "it did not start from it" % (moved, start))
        print("[export] --init-adapter at 2 processes, own shards vs --sync-module-states: identical; moved %.3g "
              "from peft's adapter in 2 steps (its lora_B reaches %.3g)" % (moved, start), flush=True)


def main():
    return tt.golden_main(__doc__, {"parity": part_parity, "export": part_export}, tt.FAILURES)


if __name__ == "__main__":
    sys.exit(main())

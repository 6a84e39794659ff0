#!/usr/bin/env python3
"""transformers as the golden model for fsdp-cpp's Mixtral (mixture of experts).

A tiny random MixtralForCausalLM is written by transformers' own save_pretrained
at test time (seeded, in --work). transformers 5 keeps the experts fused in
memory (mlp.experts.gate_up_proj (E, 2F, D), mlp.experts.down_proj (E, D, F),
mlp.gate.weight) and writes the per-expert names on disk
(block_sparse_moe.experts.{e}.w1/w2/w3.weight, block_sparse_moe.gate.weight);
ours are the on-disk names, so its gradients are split here to compare.

Parts (one ctest test each; `python3 test_mixtral.py PART --probe ... --train ... --work DIR`):
  parity  through hf_probe (the --init-from path, under fully_shard): logits,
          every layer's router logits, the load-balancing loss, the training loss
          (cross-entropy + router_aux_loss_coef x aux, transformers' loss with
          output_router_logits) and the gradient of every parameter, with SDPA
          and eager attention on both sides, fp32. Negative controls: the model
          read with num_experts_per_tok 1 (routing changed) and with
          router_aux_loss_coef 0 (aux left out of the loss) must fail the
          comparison.
  config  the mixtral-8x7b preset against Mixtral-8x7B-v0.1's published
          config.json: ours and transformers' read it alike (rope, window,
          experts), parameter counts (ours, fsdp's plan, transformers' meta
          model) agree, and transformers' meta model's active parameters (K of
          E experts) equal active_parameters() (printed by hf_probe config);
          what we lack is refused naming the key (router_jitter_noise != 0,
          K > E, an unknown key).
  export  our export (checkpoint::export_hf through hf_probe) read by
          transformers' from_pretrained: the same config, the same tensors
          and the same logits, to the bit; and the real CLI, `fsdp-train
          --init-from DIR --export-hf OUT` after two training steps, read back
          with logits equal to ours on the exported files.

Tolerances: a tensor passes when max|ours - theirs| <= tol * max|theirs|.
fp32 only: both sides run the same LibTorch with one thread and the same
operations; what may differ is the order of additions inside the matmuls
(transformers runs gate and up of an expert as one fused (2F, D) matmul and each
expert on its own rows). 1e-5 (~80 fp32 ulps of the largest value) leaves room
for that, never for a different computation: the negative controls are
thousands of times the tolerance. bf16 is not compared elementwise: there a
rounding difference in a router logit can flip a token's choice of expert, a
discrete change no tolerance describes.
"""

import json
import math
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_transformers as tt  # noqa: E402  (the golden scripts' shared checks and batch)
from test_transformers import BATCH, SEQ, VOCAB, Worst, batch_tokens, check, compare, rel_diff, write_config  # noqa: E402,E501

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TOLERANCE = 1e-5       # logits, router logits, gradients (relative to the tensor's max)
LOSS_TOLERANCE = 1e-6  # loss and aux loss, relative to their value
EXPERTS, TOP_K, F = 4, 2, 96
AUX_COEF = 0.25  # larger than Mixtral's 0.02 so that the aux term's gradients are far above the tolerance


def run(cmd, expect_rc=0, timeout=180):
    """tt.run with a longer default bound: Mixtral's probe and training runs route every token."""
    return tt.run(cmd, expect_rc, timeout)


def probe_outputs(path):
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    return tensors, meta


def compare_scalar(label, name, ours, theirs, tol):
    rel = abs(ours - theirs) / abs(theirs)
    check(rel <= tol, "%s %s: ours %.9g, transformers %.9g (relative %.3g > %g)" % (label, name, ours, theirs, rel, tol))
    return rel


# ---------------------------------------------------------------------------
# The model written by transformers


def mixtral_config(**kw):
    d = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=F, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.02,
             num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, router_aux_loss_coef=AUX_COEF,
             output_router_logits=True, sliding_window=None, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, bos_token_id=1, eos_token_id=2)
    d.update(kw)
    return MixtralConfig(**d)


def write_mixtral(directory, seed=21, **kw):
    """save_pretrained of a seeded random model, weights scaled so activations,
    logits and router logits are O(1) (the 0.02 init routes almost uniformly)."""
    torch.manual_seed(seed)
    model = MixtralForCausalLM(mixtral_config(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name == "model.embed_tokens.weight":
                p.normal_(0.0, 0.3)
            else:  # a Linear (out, in), or fused experts (E, out, in)
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    model.save_pretrained(directory)
    return directory


def disk_name_grads(model):
    """transformers' gradients under the on-disk (our) names."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().float()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("mlp.experts.gate_up_proj")] + "block_sparse_moe.experts."
            for e in range(g.shape[0]):
                out[prefix + "%d.w1.weight" % e] = g[e, :F]
                out[prefix + "%d.w3.weight" % e] = g[e, F:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("mlp.experts.down_proj")] + "block_sparse_moe.experts."
            for e in range(g.shape[0]):
                out[prefix + "%d.w2.weight" % e] = g[e]
        elif name.endswith("mlp.gate.weight"):
            out[name.replace("mlp.gate.weight", "block_sparse_moe.gate.weight")] = g
        else:
            out[name] = g
    return out


def hf_forward_backward(directory, attn, tokens, targets):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation=attn)
    model.train()  # no dropout, no jitter: the same math as eval, as in training
    out = model(input_ids=tokens, labels=targets, shift_labels=targets, output_router_logits=True)
    out.loss.backward()
    return out, disk_name_grads(model)


def hf_logits(directory, tokens):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


# ---------------------------------------------------------------------------
# Parts


def part_parity(args):
    batch = os.path.join(args.work, "batch.safetensors")
    tokens, targets = batch_tokens()
    save_file({"tokens": tokens, "targets": targets}, batch)
    directory = write_mixtral(os.path.join(args.work, "mixtral"))
    out = os.path.join(args.work, "mixtral.probe.safetensors")
    _, _, seconds = run([args.probe, "model", directory, batch, out, "fp32", "sdpa,eager"])
    if not os.path.exists(out):
        return
    ours, meta = probe_outputs(out)
    our_config = json.loads(meta["config"])
    hf_config = AutoConfig.from_pretrained(directory)
    for key in ["num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise",
                "output_router_logits", "sliding_window", "rope_parameters"]:
        check(our_config.get(key) == getattr(hf_config, key), "we read %s = %r, transformers %r" % (
            key, our_config.get(key), getattr(hf_config, key)))
    for attn in ["sdpa", "eager"]:
        key = "fp32.%s." % attn
        label = "mixtral fp32 " + attn
        theirs, grads = hf_forward_backward(directory, attn, tokens, targets)
        worst = Worst()
        compare(label, "logits", ours[key + "logits"], theirs.logits.detach().float(), TOLERANCE, worst)
        check(len(theirs.router_logits) == 2, "transformers returned %d router logits" % len(theirs.router_logits))
        min_gap = float("inf")
        for i, r in enumerate(theirs.router_logits):
            compare(label, "router_logits.%d" % i, ours[key + "router_logits.%d" % i], r.detach().float(), TOLERANCE,
                    worst)
            # How far each token's K-th choice is from its (K+1)-th: a routing
            # decision that rounding could flip would make the comparison luck.
            p = torch.softmax(r.detach().double(), -1).sort(-1, descending=True).values
            min_gap = min(min_gap, (p[:, TOP_K - 1] - p[:, TOP_K]).min().item())
        check(min_gap > 1e-4, "%s: a token's K-th and (K+1)-th router probabilities are %.3g apart: reseed the model"
              % (label, min_gap))
        aux_rel = compare_scalar(label, "aux_loss", ours[key + "aux_loss"].item(), theirs.aux_loss.item(),
                                 LOSS_TOLERANCE)
        loss_rel = compare_scalar(label, "loss", ours[key + "loss"].item(), theirs.loss.item(), LOSS_TOLERANCE)
        our_grads = {k[len(key + "grad."):]: v for k, v in ours.items() if k.startswith(key + "grad.")}
        check(sorted(our_grads) == sorted(grads), "%s: parameter names differ: ours %s, transformers %s" % (
            label, sorted(our_grads), sorted(grads)))
        for name in sorted(grads):
            if name in our_grads:
                compare(label, "grad " + name, our_grads[name], grads[name], TOLERANCE, worst)
        ce = theirs.loss.item() - AUX_COEF * theirs.aux_loss.item()
        print("[parity] mixtral fp32 %-5s loss ours %.7f transformers %.7f (rel %.2g; cross-entropy %.5f + %g x aux) "
              "aux ours %.7f transformers %.7f (rel %.2g) | %s (tolerance %g); routing margin %.3g" % (
                  attn, ours[key + "loss"].item(), theirs.loss.item(), loss_rel, ce, AUX_COEF,
                  ours[key + "aux_loss"].item(), theirs.aux_loss.item(), aux_rel, worst.text(), TOLERANCE, min_gap),
              flush=True)
    print("[parity] hf_probe ran in %.1f s" % seconds)

    # The comparison has teeth: the same weights read with one expert per
    # token, and with the load-balancing term left out of the loss.
    theirs, _ = hf_forward_backward(directory, "sdpa", tokens, targets)
    for what, edit, field in [("num_experts_per_tok 1", {"num_experts_per_tok": 1}, "logits"),
                              ("router_aux_loss_coef 0", {"router_aux_loss_coef": 0.0}, "loss")]:
        blind = os.path.join(args.work, "control-" + field)
        os.makedirs(blind)
        with open(os.path.join(directory, "config.json")) as f:
            d = json.load(f)
        d.update(edit)
        with open(os.path.join(blind, "config.json"), "w") as f:
            json.dump(d, f)
        os.symlink(os.path.join(directory, "model.safetensors"), os.path.join(blind, "model.safetensors"))
        out = os.path.join(args.work, "control-%s.probe.safetensors" % field)
        run([args.probe, "model", blind, batch, out, "fp32", "sdpa"])
        if not os.path.exists(out):
            continue
        ctl = load_file(out)
        if field == "logits":
            d_abs, rel = rel_diff(ctl["fp32.sdpa.logits"], theirs.logits.detach())
            tol = TOLERANCE
        else:
            d_abs = abs(ctl["fp32.sdpa.loss"].item() - theirs.loss.item())
            rel, tol = d_abs / abs(theirs.loss.item()), LOSS_TOLERANCE
        check(rel > 100 * tol, "negative control: %s moved the %s by only %.3g relative (tolerance %g): the "
              "comparison is too weak" % (what, field, rel, tol))
        print("[parity] control: read with %s: %s |diff| %.3g, %.3g relative (%.0fx the tolerance)" % (
            what, field, d_abs, rel, rel / tol))


# Mixtral-8x7B-v0.1's config.json as published (transformers 4 form).
MIXTRAL_8X7B = dict(
    architectures=["MixtralForCausalLM"], attention_dropout=0.0, bos_token_id=1, eos_token_id=2, hidden_act="silu",
    hidden_size=4096, initializer_range=0.02, intermediate_size=14336, max_position_embeddings=32768,
    model_type="mixtral", num_attention_heads=32, num_experts_per_tok=2, num_hidden_layers=32,
    num_key_value_heads=8, num_local_experts=8, output_router_logits=False, rms_norm_eps=1e-05,
    rope_theta=1000000.0, router_aux_loss_coef=0.02, sliding_window=None, tie_word_embeddings=False,
    torch_dtype="bfloat16", transformers_version="4.36.0.dev0", use_cache=True, vocab_size=32000)


def probe_config(args, spec, name, expect_rc=0):
    out = os.path.join(args.work, name + ".config.safetensors")
    rc, text, _ = run([args.probe, "config", spec, out], expect_rc=expect_rc)
    if rc != 0:
        return None, None, text
    tensors, meta = probe_outputs(out)
    return tensors, meta, text


def part_config(args):
    published = write_config(os.path.join(args.work, "Mixtral-8x7B-v0.1"), MIXTRAL_8X7B)
    hf = AutoConfig.from_pretrained(published)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    hf_total = sum(p.numel() for p in model.parameters())
    per_expert = sum(p[0].numel() for n, p in model.named_parameters()
                     if n.startswith("model.layers.0.mlp.experts."))  # one expert of one layer
    hf_active = hf_total - hf.num_hidden_layers * (hf.num_local_experts - hf.num_experts_per_tok) * per_expert
    from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding
    hf_inv_freq = MixtralRotaryEmbedding(hf).inv_freq
    for spec, name in [("mixtral-8x7b", "preset"), (published, "published")]:
        tensors, meta, _ = probe_config(args, spec, name)
        if tensors is None:
            continue
        ours = json.loads(meta["config"])
        for key in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                    "num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise",
                    "sliding_window", "tie_word_embeddings", "rope_parameters"]:
            check(ours.get(key) == getattr(hf, key), "%s: %s = %r, transformers reads %r" % (
                name, key, ours.get(key), getattr(hf, key)))
        _, d = rel_diff(tensors["inv_freq"], hf_inv_freq)
        check(d <= 2e-7, "%s: rope inverse frequencies differ by %.3g relative" % (name, d))
        n, planned, active = int(meta["num_parameters"]), int(meta["planned_parameters"]), int(
            meta["active_parameters"])
        check(n == hf_total and planned == hf_total, "%s: parameters ours %d, plan %d, transformers %d" % (
            name, n, planned, hf_total))
        check(active == hf_active, "%s: active parameters ours %d, transformers' meta model %d" % (
            name, active, hf_active))
        names = json.loads(meta["parameters"])
        check(len(names) == 3 + 32 * (4 + 2 + 1 + 3 * 8), "%s: %d parameter tensors" % (name, len(names)))
        check(names.get("model.layers.31.block_sparse_moe.experts.7.w2.weight") == [4096, 14336],
              "%s: expert 7's w2 of layer 31 is %s" % (name, names.get(
                  "model.layers.31.block_sparse_moe.experts.7.w2.weight")))
        print("[config] %-9s %d parameters (%.2fB; plan %d; transformers %d), %d active per token (%.2fB; "
              "transformers %d), rope_theta %s" % (name, n, n / 1e9, planned, hf_total, active, active / 1e9,
                                                   hf_active, ours["rope_parameters"]["rope_theta"]))
    # rope_theta absent: MixtralConfig's default is 1e6, not Llama's 10000.
    no_theta = dict(MIXTRAL_8X7B)
    del no_theta["rope_theta"]
    d = write_config(os.path.join(args.work, "no-theta"), no_theta)
    tensors, meta, _ = probe_config(args, d, "no-theta")
    if tensors is not None:
        theta = json.loads(meta["config"])["rope_parameters"]["rope_theta"]
        hf_theta = AutoConfig.from_pretrained(d).rope_parameters["rope_theta"]
        check(theta == hf_theta == 1e6, "rope_theta absent: ours %s, transformers %s" % (theta, hf_theta))
    # Refused, naming the key and the fix.
    for name, edit, needle in [
            ("jitter", {"router_jitter_noise": 0.1}, "router_jitter_noise = 0.1 is not supported"),
            ("k-above-e", {"num_experts_per_tok": 9}, "num_experts_per_tok (K) = 9 must lie in [1, num_local_experts"),
            ("no-experts", {"num_local_experts": 0}, "num_local_experts (E) = 0 must be positive"),
            ("negative-coef", {"router_aux_loss_coef": -1.0}, "router_aux_loss_coef = -1"),
            ("attention-bias", {"attention_bias": True}, "key 'attention_bias' = true is not one this reader knows "
                                                         "for model_type \"mixtral\"")]:
        d = write_config(os.path.join(args.work, "refused-" + name), dict(MIXTRAL_8X7B, **edit))
        _, _, text = probe_config(args, d, "refused-" + name, expect_rc=2)
        check(needle in text, "refused-%s: message lacks %r:\n%s" % (name, needle, text[-1000:]))
        print("[config] refused %-15s %s" % (name, text.strip().splitlines()[-1][:200]))


def part_export(args):
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g, dtype=torch.int64)
    src = write_mixtral(os.path.join(args.work, "mixtral"))
    # 1. The library path: same config, same tensors, same logits, to the bit.
    out = os.path.join(args.work, "mixtral-export")
    run([args.probe, "export", src, out, "float32"])
    if os.path.exists(os.path.join(out, "config.json")):
        a, b = AutoConfig.from_pretrained(src).to_dict(), AutoConfig.from_pretrained(out).to_dict()
        for key in sorted(set(a) | set(b)):
            if key in ("_name_or_path", "transformers_version", "head_dim"):
                continue  # head_dim: transformers writes null for D / H, we write D / H
            check(a.get(key) == b.get(key), "export config: %s = %r, source %r" % (key, b.get(key), a.get(key)))
        check(AutoConfig.from_pretrained(out).head_dim in (None, 16), "export config: head_dim")
        theirs = load_file(os.path.join(src, "model.safetensors"))
        ours = load_file(os.path.join(out, "model.safetensors"))
        check(sorted(theirs) == sorted(ours), "export tensors: %s vs %s" % (sorted(ours), sorted(theirs)))
        for name in theirs:
            if name in ours:
                check(torch.equal(theirs[name], ours[name]), "export: %s differs" % name)
        d = (hf_logits(out, tokens) - hf_logits(src, tokens)).abs().max().item()
        check(d == 0.0, "export: transformers' logits differ by %.3g from the source's" % d)
        print("[export] float32: %d tensors equal, config equal, transformers' logits max |diff| %.3g" % (
            len(ours), d))
    # 2. The CLI: two training steps from the transformers directory, exported,
    #    read by transformers; its logits equal ours on the exported files.
    corpus = os.path.join(args.work, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(200):
            f.write("Line %d: the quick brown fox jumps over the lazy dog, %d times.\n" % (i, i * 7 % 13))
    cli_out = os.path.join(args.work, "mixtral-cli")
    rc, text, seconds = run([args.train, "--init-from", src, "--data", corpus, "--seq-len", str(SEQ),
                             "--batch-size", "2", "--max-steps", "2", "--lr", "1e-3", "--log-every", "1",
                             "--export-hf", cli_out], timeout=240)
    if rc != 0:
        return
    theirs = load_file(os.path.join(src, "model.safetensors"))
    trained = load_file(os.path.join(cli_out, "model.safetensors"))
    moved = {n: (trained[n] - theirs[n]).abs().max().item() for n in theirs}
    check(max(v for n, v in moved.items() if ".gate." in n) > 0, "fsdp-train export: training moved no router weight")
    batch = os.path.join(args.work, "batch.safetensors")
    save_file({"tokens": tokens, "targets": tokens.clone()}, batch)
    probe = os.path.join(args.work, "mixtral-cli.probe.safetensors")
    run([args.probe, "model", cli_out, batch, probe, "fp32", "sdpa"])
    if os.path.exists(probe):
        w = Worst()
        compare("fsdp-train export", "logits", load_file(probe)["fp32.sdpa.logits"], hf_logits(cli_out, tokens),
                TOLERANCE, w)
        print("[export] fsdp-train --init-from --export-hf (%.1f s): weights moved by up to %.3g; logits vs ours "
              "max |diff| %.3g (%.3g relative)" % (seconds, max(moved.values()), w.abs, w.rel))


def main():
    return tt.golden_main(__doc__, {"parity": part_parity, "config": part_config, "export": part_export},
                          tt.FAILURES)


if __name__ == "__main__":
    sys.exit(main())

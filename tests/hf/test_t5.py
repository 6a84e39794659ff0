#!/usr/bin/env python3
"""transformers as the golden model for fsdp-cpp's T5 family.

Every model here is written at test time by transformers' own save_pretrained
(fixed seeds, in --work). Our side is t5_probe (tests/hf/t5_probe.cpp), which
loads a directory as `fsdp-train --init-from DIR` does (the family that reads
its config.json, the model under fully_shard, checkpoint::import_hf), and the
fsdp-train CLI itself.

Variants (tiny, random):
  t5      the original form: feed_forward_proj "relu", the head tied to the
          shared embedding, the decoder's output scaled by D^-0.5
  t5-v1.1 T5 v1.1 / flan-T5: "gated-gelu" (gelu_new), an lm_head of its own,
          no scaling (config.json "tie_word_embeddings": false)
Both have num_decoder_layers != num_layers and H x Dh != D.

Parts (one ctest test each; `python3 test_t5.py PART --probe ... --train ... --work DIR`):
  parity  every preset's parameter names, shapes and count are those of
          transformers' model of its config.json; for a batch with padded inputs and ignored targets: logits, loss and
          the gradient of every parameter (HF names), ours in fp32 with and
          without activation checkpointing, against T5ForConditionalGeneration
          (eager and sdpa attention) in fp32: within 1e-5 of the largest
          value; bf16 (ours) against transformers' fp32 within 5e-2.
  convert `fsdp-train convert --init-from HF_DIR --export-hf OUT` (no data, no
          training; 1 and 2 processes) for both variants and a Llama: OUT read
          by from_pretrained gives the original's logits within 1e-5 in fp32,
          with the same config and the tokenizer and generation files carried.
  train   `fsdp-train --model t5-tiny --data pairs.jsonl --tokenizer spiece.model`
          (a SentencePiece model with T5's ids: pad 0, </s> 1, unk 2), 20 steps
          at 2 processes equal (1e-5 per step) to 20 at 1 process with the same
          global batch; with bf16 and activation checkpointing, a run saved at
          step 10 and resumed at another world size reaches the uninterrupted
          run's losses; the export loads in transformers, its teacher-forced
          loss equals our evaluation of it, and generate() decodes with the
          exported spiece.model.
"""

import json
import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_transformers as tt  # noqa: E402
from test_transformers import Worst, check, compare, run  # noqa: E402

FAILURES = tt.FAILURES  # one list: check() and fail() of test_transformers append to it

TOL = 1e-5       # fp32, relative to the tensor's largest |value|
BF16_TOL = 5e-2  # our bf16 against transformers' fp32
VOCAB = 96
B, TS, TT = 3, 12, 9


def t5_config(variant):
    common = dict(vocab_size=VOCAB, d_model=32, d_kv=12, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0,
                  dropout_rate=0.0)
    if variant == "t5":
        return T5Config(feed_forward_proj="relu", **common)
    return T5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common)


def write_t5(variant, directory):
    """A random model of `variant` saved by transformers; v1.1's lm_head gets
    weights of its own (transformers 5 ties a freshly built model's head)."""
    torch.manual_seed(11 if variant == "t5" else 12)
    model = T5ForConditionalGeneration(t5_config(variant))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.normal_(1.0, 0.2)  # norms that matter
    model.save_pretrained(directory)
    if variant != "t5":
        # A separate head, as flan-T5's files hold it (and the config says so).
        weights = load_file(os.path.join(directory, "model.safetensors"))
        weights["lm_head.weight"] = torch.randn(VOCAB, 32) * 0.5
        save_file(weights, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(directory, "config.json")) as f:
            cfg = json.load(f)
        cfg["tie_word_embeddings"] = False
        cfg["scale_decoder_outputs"] = False
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
    return directory


def batch(path):
    """Inputs padded with 0 at the ends of rows 1 and 2 (after their </s> = 1);
    targets ending in </s>, -100 past it (rows of different lengths)."""
    g = torch.Generator().manual_seed(5)
    inputs = torch.randint(3, VOCAB, (B, TS), generator=g)
    targets = torch.randint(3, VOCAB, (B, TT), generator=g)
    for row, (n_in, n_tgt) in enumerate([(TS, TT), (7, 5), (4, 8)]):
        inputs[row, n_in - 1] = 1
        inputs[row, n_in:] = 0
        targets[row, n_tgt - 1] = 1
        targets[row, n_tgt:] = -100
    save_file({"inputs": inputs, "targets": targets}, path)
    return inputs, targets


def hf_model(directory, attn="eager", dtype=torch.float32):
    model = T5ForConditionalGeneration.from_pretrained(directory, dtype=dtype, attn_implementation=attn)
    model.train()  # dropout_rate is 0: train mode only makes the loss path the training one
    return model


def hf_forward_backward(directory, attn, inputs, targets):
    model = hf_model(directory, attn)
    out = model(input_ids=inputs, attention_mask=(inputs != 0).long(), labels=targets)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def part_parity(args):
    check_presets(args)
    inputs_path = os.path.join(args.work, "batch.safetensors")
    inputs, targets = batch(inputs_path)
    for variant in ["t5", "t5-v1.1"]:
        directory = write_t5(variant, os.path.join(args.work, variant))
        out = os.path.join(args.work, variant + ".probe.safetensors")
        rc, text, seconds = run([args.probe, "model", directory, inputs_path, out, "fp32,fp32+ckpt,bf16"])
        if rc != 0:
            continue
        ours = load_file(out)
        for attn in ["eager", "sdpa"]:
            logits, loss, grads = hf_forward_backward(directory, attn, inputs, targets)
            for v in ["fp32", "fp32+ckpt"]:
                label = "%s %s vs transformers %s" % (variant, v, attn)
                w = Worst()
                compare(label, "logits", ours[v + ".logits"], logits, TOL, w)
                compare(label, "loss", ours[v + ".loss"], loss.reshape(1), TOL, w)
                names = sorted(n[len(v) + 6:] for n in ours if n.startswith(v + ".grad."))
                check(names == sorted(grads), "%s: gradients of %s, transformers has %s" % (
                    label, names, sorted(grads)))
                for n in names:
                    compare(label, "grad " + n, ours[v + ".grad." + n], grads[n], TOL, w)
                print("[parity] %s: loss %.6f vs %.6f; %d gradients; %s" % (
                    label, ours[v + ".loss"].item(), loss.item(), len(names), w.text()))
            w = Worst()
            compare(variant + " bf16 vs transformers fp32 " + attn, "logits", ours["bf16.logits"], logits, BF16_TOL, w)
            compare(variant + " bf16 vs transformers fp32 " + attn, "loss", ours["bf16.loss"], loss.reshape(1),
                    BF16_TOL, w)
            print("[parity] %s bf16 vs transformers fp32 %s: %s" % (variant, attn, w.text()))
    # A negative control: the v1.1 model read as if its head were tied must fail by far.
    control = os.path.join(args.work, "control")
    write_t5("t5-v1.1", control)
    with open(os.path.join(control, "config.json")) as f:
        cfg = json.load(f)
    cfg["scale_decoder_outputs"] = True
    with open(os.path.join(control, "config.json"), "w") as f:
        json.dump(cfg, f)
    out = os.path.join(args.work, "control.probe.safetensors")
    if run([args.probe, "model", control, inputs_path, out, "fp32"])[0] == 0:
        logits = hf_forward_backward(os.path.join(args.work, "t5-v1.1"), "eager", inputs, targets)[0]
        diff, rel = tt.rel_diff(load_file(out)["fp32.logits"], logits)
        check(rel > 100 * TOL, "negative control: a scaled v1.1 decoder should differ, got %.3g" % rel)
        print("[parity] negative control (v1.1 read with scale_decoder_outputs): logits %.3g of their max off" % rel)


def check_presets(args):
    """Every t5 preset: transformers' T5ForConditionalGeneration of the config.json we write for it has our
    parameters (names, shapes) and count. transformers 5 always ties a freshly built model's lm_head to the
    shared embedding (T5Config forces tie_word_embeddings, reading the file's value as scale_decoder_outputs):
    an untied preset's lm_head.weight (V, D) is ours alone, as flan-T5's published files hold it."""
    out = os.path.join(args.work, "presets.json")
    if run([args.probe, "presets", out])[0] != 0:
        return
    with open(out) as f:
        presets = json.load(f)
    for name, p in sorted(presets.items()):
        with torch.device("meta"):
            model = T5ForConditionalGeneration(T5Config(**p["config"]))
        theirs = {n: list(t.shape) for n, t in model.named_parameters()}
        ours = {n: s for n, s in p["params"]}
        untied = p["config"]["tie_word_embeddings"] is False
        extra = {"lm_head.weight": [p["config"]["vocab_size"], p["config"]["d_model"]]} if untied else {}
        check(ours == {**theirs, **extra}, "preset %s: parameters differ from transformers': ours only %s, theirs "
              "only %s" % (name, sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))))
        count = model.num_parameters() + sum(a * b for a, b in extra.values())
        check(p["num_parameters"] == count, "preset %s: %d parameters, transformers %d" % (
            name, p["num_parameters"], count))
        check(model.config.scale_decoder_outputs == p["config"]["scale_decoder_outputs"],
              "preset %s: transformers reads scale_decoder_outputs %s" % (name, model.config.scale_decoder_outputs))
        print("[presets] %s: %d parameters (%d tensors) as transformers'" % (name, p["num_parameters"], len(ours)))


def hf_llama(directory):
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, bos_token_id=1,
                      eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(directory)
    return directory


def part_convert(args):
    inputs_path = os.path.join(args.work, "batch.safetensors")
    inputs, targets = batch(inputs_path)
    sources = {"t5": write_t5("t5", os.path.join(args.work, "t5")),
               "t5-v1.1": write_t5("t5-v1.1", os.path.join(args.work, "t5-v1.1")),
               "llama": hf_llama(os.path.join(args.work, "llama"))}
    for name, src in sources.items():
        tt.write_tokenizer_files(src, vocab=VOCAB)
        for procs in ["1", "2"]:
            out = os.path.join(args.work, "%s-converted-%s" % (name, procs))
            rc, text, seconds = run([args.train, "convert", "--init-from", src, "--export-hf", out,
                                     "--nproc-per-node", procs], timeout=120)
            if rc != 0:
                continue
            label = "%s convert --init-from at %s process%s" % (name, procs, "" if procs == "1" else "es")
            w = Worst()
            if name == "llama":
                ref = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)(inputs).logits
                got = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)(inputs).logits
            else:
                mask = (inputs != 0).long()
                ref = hf_model(src)(input_ids=inputs, attention_mask=mask, labels=targets).logits
                got = hf_model(out)(input_ids=inputs, attention_mask=mask, labels=targets).logits
            compare(label, "logits", got.detach(), ref.detach(), TOL, w)
            a, b = load_file(os.path.join(src, "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
            same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
            check(same, "%s: the exported tensors differ from the source's (%s vs %s)" % (label, sorted(b), sorted(a)))
            for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]:
                check(open(os.path.join(src, f), "rb").read() == open(os.path.join(out, f), "rb").read(),
                      "%s: %s not carried byte for byte" % (label, f))
            print("[convert] %s (%.1f s): tensors identical: %s; from_pretrained logits %s" % (
                label, seconds, same, w.text()))


def train_spm(work):
    """A SentencePiece model with T5's special ids (pad 0, </s> 1, unk 2, no <s>)."""
    import sentencepiece as spm
    words = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "one", "two", "three", "four", "five"]
    text = os.path.join(work, "spm.txt")
    g = torch.Generator().manual_seed(0)
    with open(text, "w") as f:
        for i in range(400):
            idx = torch.randint(0, len(words), (6,), generator=g).tolist()
            f.write(" ".join(words[j] for j in idx) + "\n")
    prefix = os.path.join(work, "spiece")
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=32, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    return prefix + ".model", words


def write_pairs(path, words, n, seed):
    """Reverse the words of a sentence: {"input": "reverse: a b c", "target": "c b a"}."""
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for _ in range(n):
            k = int(torch.randint(2, 6, (1,), generator=g))
            idx = torch.randint(0, len(words), (k,), generator=g).tolist()
            src = [words[j] for j in idx]
            f.write(json.dumps({"input": "reverse: " + " ".join(src), "target": " ".join(reversed(src))}) + "\n")


def losses(metrics):
    with open(metrics) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def part_train(args):
    spiece, words = train_spm(args.work)
    pairs, val = os.path.join(args.work, "pairs.jsonl"), os.path.join(args.work, "val.jsonl")
    write_pairs(pairs, words, 96, 1)
    write_pairs(val, words, 10, 2)
    base = [args.train, "--model", "t5-tiny", "--data", pairs, "--tokenizer", spiece, "--seq-len", "12",
            "--target-len", "10", "--lr", "3e-3", "--warmup-steps", "2", "--log-every", "1", "--seed", "7"]

    def train(name, procs, batch, extra, steps=20):
        m = os.path.join(args.work, name + ".metrics.jsonl")
        rc, text, seconds = run(base + ["--nproc-per-node", procs, "--batch-size", batch, "--max-steps", str(steps),
                                        "--metrics-file", m] + extra, timeout=300)
        return (losses(m) if rc == 0 else {}), seconds

    def agree(label, a, b, tol=TOL):
        worst = max((abs(a[s] - b[s]) / abs(b[s]) for s in b if s in a), default=float("inf"))
        check(sorted(a) == sorted(b) and worst <= tol, "%s: losses %s vs %s (worst %.3g)" % (label, a, b, worst))
        return worst

    one, s1 = train("w1", "1", "4", [])
    two, s2 = train("w2", "2", "2", [])
    worst = agree("t5-tiny 2 processes vs 1", two, one)
    check(len(one) == 20 and one.get(19, 99) < one.get(0, 0), "t5-tiny: 20 steps that lower the loss, got %s" % one)
    print("[train] t5-tiny 20 steps, global batch 4: 2 processes (%.1f s) vs 1 (%.1f s): worst relative loss "
          "difference %.3g; loss %.4f -> %.4f" % (s2, s1, worst, one.get(0, 0), one.get(19, 0)))

    # bf16 and activation checkpointing, saved at step 10 and resumed at 1 process.
    ck = os.path.join(args.work, "ck")
    # A constant learning rate after the warmup (--min-lr = --lr): the first run's --max-steps 10 then
    # changes no step's rate, so the two halves replay the uninterrupted run's schedule.
    extra = ["--mixed-precision", "bf16", "--activation-checkpointing", "--checkpoint-every", "10", "--min-lr", "3e-3"]
    full, _ = train("bf16", "2", "2", extra + ["--checkpoint-dir", os.path.join(args.work, "ck-full")])
    first, _ = train("bf16-a", "2", "2", extra + ["--checkpoint-dir", ck], steps=10)
    second, s3 = train("bf16-b", "1", "4", extra + ["--checkpoint-dir", ck, "--resume"])
    check(sorted(first) == list(range(0, 10)) and sorted(second) == list(range(10, 20)),
          "resume: steps %s then %s" % (sorted(first), sorted(second)))
    worst = agree("bf16 resumed at 1 process vs uninterrupted at 2", {**first, **second}, full, 1e-2)
    print("[train] bf16 + activation checkpointing, 10 steps at 2 processes, resumed at 1 for 10 more (%.1f s): "
          "worst relative loss difference to the uninterrupted run %.3g" % (s3, worst))

    # The export: transformers reads it, its loss on the validation pairs is our evaluation of it, it generates.
    out = os.path.join(args.work, "export")
    rc, text, _ = run(base + ["--nproc-per-node", "2", "--batch-size", "2", "--max-steps", "20", "--export-hf", out,
                              "--val-data", val, "--eval-every", "20"], timeout=300)
    if rc != 0:
        return
    ours_eval = [float(l.split("Eval Loss: ")[1].split()[0]) for l in text.splitlines() if "Eval Loss: " in l][-1]
    model = T5ForConditionalGeneration.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spiece.model"))

    def tok(text, width):
        """T5's tokenizer with truncation: the pieces' ids cut to width - 1, then </s> (1)."""
        return torch.tensor([sp.encode(text)[:width - 1] + [1]])

    total, count = 0.0, 0
    with open(val) as f:
        for r in map(json.loads, f):
            ids = tok(r["input"], 12)
            labels = tok(r["target"], 10)
            with torch.no_grad():
                loss = model(input_ids=ids, labels=labels).loss.item()
            total += loss * labels.numel()
            count += labels.numel()
    theirs = total / count
    check(abs(theirs - ours_eval) <= 1e-4 * abs(ours_eval), "export: transformers' validation loss %.6f vs our "
          "Eval Loss %.6f" % (theirs, ours_eval))
    prompt = tok("reverse: red green blue", 12)
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False)
    text_out = sp.decode([t for t in generated[0].tolist() if t > 2])
    check(generated.shape[1] >= 2 and generated[0, 0].item() == 0, "generate: %s" % generated.tolist())
    print("[train] export: transformers' validation loss %.6f vs our Eval Loss %.6f; generate('reverse: red green "
          "blue') -> %r" % (theirs, ours_eval, text_out))


def main():
    return tt.golden_main(__doc__, {"parity": part_parity, "convert": part_convert, "train": part_train}, FAILURES)


if __name__ == "__main__":
    sys.exit(main())

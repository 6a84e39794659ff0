#!/usr/bin/python3
"""Golden values for fsdp-cpp's Llama: an independent, from-scratch reference.

This is a plain functional re-statement of Hugging Face's LlamaForCausalLM
semantics (transformers' modeling_llama.py / modeling_rope_utils.py), written
without reference to the C++ in src/models/:

  * token embedding lookup
  * RMSNorm: upcast to fp32, x * rsqrt(mean(x^2) + eps), cast back, times weight
  * rotary embedding, "rotate_half" convention (the two halves of head_dim,
    NOT interleaved pairs); inv_freq with Llama 3.1's "llama3" scaling exactly
    as HF's _compute_llama3_parameters; cos/sin computed in fp32 (as HF does)
  * grouped-query attention: repeat_kv (query head h uses kv head h // n_rep),
    scores * head_dim**-0.5, causal mask, softmax, weighted sum
  * SwiGLU MLP: down(silu(gate(x)) * up(x))
  * final norm, lm_head (or the embedding matrix when tied)
  * loss: mean cross-entropy over positions whose target != -100

Everything downstream of the rope tables is computed in float64 with weights
that are exactly representable in float32, so the golden numbers are the
"true" values of the fp32 model up to fp64 rounding; the C++ test compares its
fp32 (and bf16) runs against them.

Weights are a closed-form function both sides reproduce. For the k-th
parameter in HF name order (k is written to the metadata next to each name)
and flat row-major element index i:

    base(i, k) = sin(0.37 * i + 1.3 * k + 0.0011 * i * i)      (in double)
    *norm.weight              : 1 + 0.1 * base
    model.embed_tokens.weight : 0.5 * base
    every other (Linear) weight, shape (out, in): 1.5 / sqrt(in) * base

then rounded to float32. (The i*i "chirp" term keeps the matrices full rank;
sin(a*i + c) alone would make every weight matrix rank 2.)

Outputs (overwritten):
    llama_golden.json  metadata: configs, tokens, targets, loss (double),
                       inv_freq tables, and for every stored tensor its
                       name, shape and offset into the .f32 blob
    llama_golden.f32   little-endian float32 blob: logits and every gradient

Regenerate (needs Debian's python3-torch, nothing else; the C++ test suite
never runs Python):

    /usr/bin/python3 tests/models/golden/make_golden.py

and commit both files. Re-run the C++ test (test_models, Golden.*) after.
"""

import json
import math
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
IGNORE_INDEX = -100


# --------------------------------------------------------------------------
# Configs of the golden cases
# --------------------------------------------------------------------------

def base_config():
    return {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        # original_max_position_embeddings=256 with head_dim 8 and theta 5e5
        # puts the four frequencies in all three llama3 bands: wavelengths
        # 6.3 (< 64, kept), 167 (between 64 and 256, smoothed), 4450 and
        # 118000 (> 256, divided by factor).
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        "tie_word_embeddings": False,
    }


def token_batch(cfg, B, T, seed):
    """Deterministic token ids from a 31-bit LCG (x <- (1103515245 x + 12345) mod 2^31,
    token = (x >> 16) mod V), B rows of T+1; tokens = seq[:, :-1], targets = seq[:, 1:]."""
    V = cfg["vocab_size"]
    x = seed
    seq = []
    for _ in range(B):
        row = []
        for _ in range(T + 1):
            x = (1103515245 * x + 12345) % (1 << 31)
            row.append((x >> 16) % V)
        seq.append(row)
    tokens = [row[:-1] for row in seq]
    targets = [row[1:] for row in seq]
    return tokens, targets


# --------------------------------------------------------------------------
# Parameters, in Hugging Face name order
# --------------------------------------------------------------------------

def param_shapes(cfg):
    D = cfg["hidden_size"]
    F = cfg["intermediate_size"]
    H = cfg["num_attention_heads"]
    Hkv = cfg["num_key_value_heads"]
    Dh = cfg["head_dim"]
    V = cfg["vocab_size"]
    out = [("model.embed_tokens.weight", (V, D))]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [
            (p + "self_attn.q_proj.weight", (H * Dh, D)),
            (p + "self_attn.k_proj.weight", (Hkv * Dh, D)),
            (p + "self_attn.v_proj.weight", (Hkv * Dh, D)),
            (p + "self_attn.o_proj.weight", (D, H * Dh)),
            (p + "mlp.gate_proj.weight", (F, D)),
            (p + "mlp.up_proj.weight", (F, D)),
            (p + "mlp.down_proj.weight", (D, F)),
            (p + "input_layernorm.weight", (D,)),
            (p + "post_attention_layernorm.weight", (D,)),
        ]
    out.append(("model.norm.weight", (D,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D)))
    return out


def closed_form_weight(name, shape, k):
    n = 1
    for s in shape:
        n *= s
    base = [math.sin(0.37 * i + 1.3 * k + 0.0011 * i * i) for i in range(n)]
    if name.endswith("norm.weight"):
        vals = [1.0 + 0.1 * b for b in base]
    elif name == "model.embed_tokens.weight":
        vals = [0.5 * b for b in base]
    else:
        s = 1.5 / math.sqrt(shape[1])
        vals = [s * b for b in base]
    # Round to float32 first: the C++ side holds float32 parameters.
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32).to(torch.float64).reshape(shape)


# --------------------------------------------------------------------------
# Rotary embedding (HF: _compute_default_rope_parameters, _compute_llama3_parameters,
# LlamaRotaryEmbedding.forward, rotate_half, apply_rotary_pos_emb)
# --------------------------------------------------------------------------

def rope_inv_freq(cfg):
    dim = cfg["head_dim"]
    base = cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv_freq
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(cfg, T):
    inv_freq = rope_inv_freq(cfg)                      # (Dh/2,) fp32
    pos = torch.arange(T, dtype=torch.int64).float()   # (T,)   fp32
    freqs = inv_freq[None, :, None] @ pos[None, None, :]  # (1, Dh/2, T)
    freqs = freqs.transpose(1, 2)[0]                   # (T, Dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)            # (T, Dh)
    return emb.cos().to(torch.float64), emb.sin().to(torch.float64)


def rotate_half(x):
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


# --------------------------------------------------------------------------
# The model, functional
# --------------------------------------------------------------------------

def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def linear(x, w):
    return x @ w.t()


def repeat_kv(x, n_rep):
    # (B, Hkv, T, Dh) -> (B, Hkv*n_rep, T, Dh); head h reads kv head h // n_rep
    if n_rep == 1:
        return x
    B, Hkv, T, Dh = x.shape
    return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, Dh).reshape(B, Hkv * n_rep, T, Dh)


def forward(cfg, P, tokens):
    B, T = tokens.shape
    D = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    Hkv = cfg["num_key_value_heads"]
    Dh = cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    cos, sin = rope_cos_sin(cfg, T)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    h = P["model.embed_tokens.weight"][tokens]  # (B, T, D)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        residual = h
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = linear(x, P[p + "self_attn.q_proj.weight"]).view(B, T, H, Dh).transpose(1, 2)
        k = linear(x, P[p + "self_attn.k_proj.weight"]).view(B, T, Hkv, Dh).transpose(1, 2)
        v = linear(x, P[p + "self_attn.v_proj.weight"]).view(B, T, Hkv, Dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, H // Hkv)
        v = repeat_kv(v, H // Hkv)
        scores = (q @ k.transpose(2, 3)) * (Dh ** -0.5)
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(B, T, H * Dh)
        h = residual + linear(a, P[p + "self_attn.o_proj.weight"])
        residual = h
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = linear(x, P[p + "mlp.gate_proj.weight"])
        u = linear(x, P[p + "mlp.up_proj.weight"])
        h = residual + linear(torch.nn.functional.silu(g) * u, P[p + "mlp.down_proj.weight"])
    h = rms_norm(h, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    return linear(h, head)  # (B, T, V)


def causal_lm_loss(logits, targets):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                             ignore_index=IGNORE_INDEX, reduction="mean")


# --------------------------------------------------------------------------
# Cases and output
# --------------------------------------------------------------------------

class Blob:
    def __init__(self):
        self.values = []

    def add(self, t):
        flat = t.detach().to(torch.float32).reshape(-1).tolist()
        offset = len(self.values)
        self.values.extend(flat)
        return offset


def run_case(name, cfg, B, T, seed, ignore_positions, blob):
    tokens, targets = token_batch(cfg, B, T, seed)
    for (b, t) in ignore_positions:
        targets[b][t] = IGNORE_INDEX
    shapes = param_shapes(cfg)
    P = {}
    for k, (pname, shape) in enumerate(shapes):
        P[pname] = closed_form_weight(pname, shape, k).requires_grad_(True)
    tok = torch.tensor(tokens, dtype=torch.int64)
    tgt = torch.tensor(targets, dtype=torch.int64)
    logits = forward(cfg, P, tok)
    loss = causal_lm_loss(logits, tgt)
    loss.backward()

    entries = [{"name": "logits", "shape": list(logits.shape), "offset": blob.add(logits)}]
    params = []
    for k, (pname, shape) in enumerate(shapes):
        params.append({"name": pname, "k": k, "shape": list(shape), "grad_offset": blob.add(P[pname].grad)})
    return {
        "name": name,
        "config": cfg,
        "batch": B,
        "seq_len": T,
        "tokens": tokens,
        "targets": targets,
        "loss": loss.item(),
        "inv_freq": rope_inv_freq(cfg).tolist(),
        "tensors": entries,
        "params": params,
    }


def inv_freq_case(name, head_dim, theta, scaling):
    cfg = {"head_dim": head_dim, "rope_theta": theta, "rope_scaling": scaling}
    return {"name": name, "head_dim": head_dim, "rope_theta": theta, "rope_scaling": scaling,
            "inv_freq": rope_inv_freq(cfg).tolist()}


def main():
    torch.set_grad_enabled(True)
    blob = Blob()
    cases = []
    cfg = base_config()
    cases.append(run_case("llama3_scaled_untied", cfg, B=2, T=8, seed=5, ignore_positions=[], blob=blob))
    cfg2 = base_config()
    cfg2["tie_word_embeddings"] = True
    cases.append(run_case("llama3_scaled_tied_ignore", cfg2, B=2, T=8, seed=11,
                          ignore_positions=[(1, 3)], blob=blob))

    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    llama32 = dict(llama31, factor=32.0)
    rope_tables = [
        inv_freq_case("llama3.1-8b", 128, 500000.0, llama31),
        inv_freq_case("llama3.2-1b", 64, 500000.0, llama32),
        inv_freq_case("llama2-7b", 128, 10000.0, None),
    ]

    meta = {
        "generator": "tests/models/golden/make_golden.py",
        "torch_version": torch.__version__,
        "blob": "llama_golden.f32",
        "blob_dtype": "float32-le",
        "blob_count": len(blob.values),
        "ignore_index": IGNORE_INDEX,
        "weight_formula": "base=sin(0.37*i+1.3*k+0.0011*i*i); norms 1+0.1*base; embed 0.5*base; "
                          "linear (out,in) 1.5/sqrt(in)*base; rounded to float32",
        "cases": cases,
        "rope_tables": rope_tables,
    }
    with open(os.path.join(HERE, "llama_golden.f32"), "wb") as f:
        f.write(struct.pack("<%df" % len(blob.values), *blob.values))
    with open(os.path.join(HERE, "llama_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    for c in cases:
        print("%-28s loss=%.10f" % (c["name"], c["loss"]))
    print("wrote %d floats" % len(blob.values))


if __name__ == "__main__":
    main()

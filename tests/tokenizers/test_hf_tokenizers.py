#!/usr/bin/env python3
"""The `tokenizers` library as the golden tokenizer for fsdp-cpp's tokenizer.json support.

Every tokenizer.json here is made at test time by the tokenizers library itself: the
component configuration of a published file, transcribed below (CONFIGS), around a BPE
vocabulary that the library's BpeTrainer learns from a corpus generated here (so merges
and vocabularies are real BPE output). Nothing is downloaded. Our side is
tokenizer_probe (tests/tokenizers/tokenizer_probe.cpp), which loads the file exactly as
`fsdp-train --tokenizer` does (data::make_tokenizer).

Configurations (the published files whose components each one mirrors):
  llama3     meta-llama/Meta-Llama-3-8B, Llama-3.1-8B, Llama-3.2-1B: Split with the
             Llama 3 regex + ByteLevel(use_regex false), BPE with ignore_merges (and a
             few whole pieces in the vocabulary that no merge makes, which only
             ignore_merges finds), 256 specials after the vocabulary, template
             "<|begin_of_text|> $A"
  qwen2      Qwen/Qwen2.5-0.5B (Qwen2-*, Qwen3-* have the same components): NFC, Split
             with the Qwen2 regex (\\p{N} single), BPE with continuing_subword_prefix and
             end_of_word_suffix "", special and non-special (normalized false) added
             tokens, no BOS
  smollm2    HuggingFaceTB/SmolLM2-135M: Digits(individual) + ByteLevel(GPT-2 regex),
             17 specials at ids 0..16
  llama2     meta-llama/Llama-2-7b-hf (TinyLlama-1.1B-Chat-v1.0 and Mistral-7B-v0.1 have
             the same components): normalizer Prepend("▁") + Replace(" ", "▁"), no
             pre-tokenizer, BPE with byte_fallback and fuse_unk, <unk> <s> </s>, the
             decoder Replace + ByteFallback + Fuse + Strip, template "<s> $A"
  mistral3   mistralai/Mistral-7B-v0.3 (transformers' Llama converter with
             legacy=false): Metaspace(prepend_scheme first, split false) instead of the
             normalizers, [INST]-style specials
  flags      no published file: added tokens with lstrip / rstrip / single_word /
             normalized (NFC) in every combination the library distinguishes, Digits
             (contiguous) + Split(GPT-2 regex) + ByteLevel(add_prefix_space), template
             "<s> $A </s>"
  metaspace  no published file: Metaspace(always, split true) with its decoder, a
             Prepend normalizer making a normalized added token match as "▁<extra>",
             byte fallback with 4-byte characters left to a fused <unk>
  unk        the same with prepend_scheme never and <unk> not fused

Parts (one ctest test each):
  compare   every configuration: our ids == the library's `encode(text,
            add_special_tokens=False).ids` token for token, and our decode == its
            `decode(ids, skip_special_tokens=False)`, on a corpus of several
            languages and scripts, emoji, whitespace runs, tabs/newlines, numbers,
            code, special-token strings, NFC-sensitive sequences, empty input,
            very long words and random Unicode; random id sequences decoded alike;
            BOS/EOS/vocabulary size as the files say. Exits 1 on any difference.
  refuse    files using components we do not implement are refused (exit 2) with
            the component named.
  data      a c4-like directory of .json.gz (multi-member) and plain .jsonl files read
            through load_dataset with a tokenizer.json: exactly the library's ids with
            BOS and EOS per document, in file-name order; a pattern; a truncated file
            named with its offset.
  train     `fsdp-train --tokenizer DIR --data DIR` trains on them (2 steps) and
            reports the token count the library gives.
"""

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
import unicodedata
import zlib

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import AddedToken, Tokenizer, pre_tokenizers  # noqa: E402
from tokenizers.trainers import BpeTrainer  # noqa: E402

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def template(before, after, ids):
    """A TemplateProcessing as the published files write it ("<s> $A" ...)."""
    single = [{"SpecialToken": {"id": t, "type_id": 0}} for t in before] + [{"Sequence": {"id": "A", "type_id": 0}}]
    single += [{"SpecialToken": {"id": t, "type_id": 0}} for t in after]
    pair = single + [{"SpecialToken": {"id": t, "type_id": 1}} for t in before] + [{"Sequence": {"id": "B", "type_id": 1}}]
    pair += [{"SpecialToken": {"id": t, "type_id": 1}} for t in after]
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in before + after}}


def byte_level(add_prefix_space, trim_offsets, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}

LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"] +
                   ["<|reserved_special_token_%d|>" % i for i in range(2, 247)])
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_NONSPECIAL = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                 "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
                 "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>",
                 "<empty_output>"]
MISTRAL3_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                     "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]

# Each configuration: how to train (the library's own components), then the file's
# components as the published file writes them. "first": specials trained at ids 0..;
# "after": specials added after the vocabulary; "bytes": SentencePiece-style <0xNN>
# vocabulary entries (ids after the first specials); "config": tokenizer_config.json.
CONFIGS = {
    "llama3": dict(
        vocab=1200, byte_level=True, after=LLAMA3_SPECIALS,
        # Whole pieces in the vocabulary that no merge makes: ignore_merges takes them.
        whole_words=["Straße", " training", "hello", " ÷÷÷", "2023"],
        normalizer=None,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(False, True, False)]},
        post_processor=lambda ids: {"type": "Sequence", "processors": [
            byte_level(True, False, True), template(["<|begin_of_text|>"], [], ids)]},
        decoder=byte_level(True, True, True),
        model=dict(unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=False,
                   byte_fallback=False, ignore_merges=True),
        config={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
        expect=dict(bos="<|begin_of_text|>", eos="<|end_of_text|>", adds_bos=True)),
    "qwen2": dict(
        vocab=1200, byte_level=True, after=QWEN_SPECIAL, after_nonspecial=QWEN_NONSPECIAL,
        normalizer={"type": "NFC"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(False, False, False)]},
        post_processor=lambda ids: byte_level(False, False, False),
        decoder=byte_level(False, False, False),
        model=dict(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                   byte_fallback=False, ignore_merges=False),
        config={"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "add_prefix_space": False, "split_special_tokens": False, "errors": "replace"},
        expect=dict(bos=None, eos="<|endoftext|>", adds_bos=False)),
    "smollm2": dict(
        vocab=1000, byte_level=True, first=SMOL_SPECIALS,
        normalizer=None,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                             byte_level(False, True, True)]},
        post_processor=lambda ids: byte_level(True, False, True),
        decoder=byte_level(True, True, True),
        model=dict(unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=False,
                   byte_fallback=False),
        config={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
        expect=dict(bos="<|endoftext|>", eos="<|endoftext|>", adds_bos=False)),
    "llama2": dict(
        vocab=900, byte_level=False, first=["<unk>", "<s>", "</s>"], bytes=True, limit_alphabet=200,
        normalizer={"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        pre_tokenizer=None,
        post_processor=lambda ids: template(["<s>"], [], ids),
        decoder=SPM_DECODER,
        model=dict(unk_token="<unk>", continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True,
                   byte_fallback=True),
        config={"add_bos_token": True, "add_eos_token": False, "legacy": False,
                "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False},
                "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False}},
        expect=dict(bos="<s>", eos="</s>", adds_bos=True)),
    "mistral3": dict(
        vocab=900, byte_level=False, first=MISTRAL3_SPECIALS, bytes=True, limit_alphabet=200,
        normalizer=None,
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        post_processor=lambda ids: template(["<s>"], [], ids),
        decoder=SPM_DECODER,
        model=dict(unk_token="<unk>", continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True,
                   byte_fallback=True),
        config={"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>"},
        expect=dict(bos="<s>", eos="</s>", adds_bos=True)),
    "flags": dict(
        vocab=800, byte_level=True, first=["<s>", "</s>"],
        added=[  # (content, special, normalized, lstrip, rstrip, single_word)
            ("<mask>", True, False, True, False, False),
            ("<mask_long>", True, False, False, False, False),
            ("[SEP]", True, False, False, True, False),
            ("<|tab|>", False, False, True, True, False),
            ("hello", False, True, False, False, True),
            ("wo\u0308rld", False, True, False, False, False),  # NFC: matches "wörld"
            ("ab", False, False, False, False, True),
            ("the", False, True, False, False, False),  # also a vocabulary token: keeps its id
            ("Ωmega", False, True, True, True, True),
        ],
        normalizer={"type": "NFC"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False}, split(GPT2_REGEX), byte_level(True, True, False)]},
        post_processor=lambda ids: template(["<s>"], ["</s>"], ids),
        decoder=byte_level(True, True, True),
        model=dict(unk_token=None, continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=False,
                   byte_fallback=False),
        config=None,
        expect=dict(bos="<s>", eos="</s>", adds_bos=True)),
    "metaspace": dict(
        vocab=700, byte_level=False, first=["<unk>", "<s>", "</s>"], bytes=True, limit_alphabet=120,
        missing_bytes=range(0xF0, 0xF5),  # 4-byte characters have no byte fallback: <unk>
        added=[("<extra>", False, True, False, False, False),  # matched as "▁<extra>"
               ("[raw]", True, False, False, True, False)],
        normalizer={"type": "Prepend", "prepend": "▁"},
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        post_processor=lambda ids: None,
        decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        model=dict(unk_token="<unk>", continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True,
                   byte_fallback=True),
        config={"bos_token": "<s>", "eos_token": "</s>"},
        expect=dict(bos="<s>", eos="</s>", adds_bos=False)),
}
# The same with unknown characters kept apart and no prefix at all.
CONFIGS["unk"] = dict(
    CONFIGS["metaspace"], added=[],
    pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
    decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
    model=dict(CONFIGS["metaspace"]["model"], fuse_unk=False))

# --- the corpus ---------------------------------------------------------------------------

WORDS = {
    "en": "the quick brown fox jumps over a lazy dog while people don't say it's what they'll do we've "
          "learned training models takes data time and patience I'm sure you're right".split(),
    "de": "Größe Straße über schön Mädchen Fußball Äpfel Ölpreis weiß nächste Übung".split(),
    "fr": "élève être déjà garçon où français cœur naïve Noël façade".split(),
    "es": "niño señor año mañana corazón él está aquí".split(),
    "vi": "Tiếng Việt có dấu người Việt Nam đẹp lắm".split(),
    "ru": "привет мир это тест русский язык Москва Ёлка щука".split(),
    "el": "καλημέρα κόσμε ελληνικά γλώσσα Αθήνα ψυχή".split(),
    "ar": "مرحبا بالعالم اللغة العربية كتاب".split(),
    "he": "שלום עולם עברית ספר".split(),
    "hi": "नमस्ते दुनिया हिन्दी भाषा किताब".split(),
    "zh": "你好 世界 中文 测试 我们 的 模型 训练 数据".split(),
    "ja": "こんにちは 世界 カタカナ ひらがな 漢字 東京".split(),
    "ko": "안녕하세요 세계 한국어 서울 데이터".split(),
    "th": "สวัสดี ชาวโลก ภาษาไทย กรุงเทพ".split(),
}
EMOJI = ["😀", "🚀", "👍🏽", "👩‍💻", "🇩🇪", "❤️", "🤖", "🧪", "✅", "🎉"]
CODE = [
    "def f(x):\n\treturn x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\r\n",
    "SELECT * FROM users WHERE id = 42;",
    "const std::vector<int32_t>& ids = tok->encode(\"héllo\");",
    "<html><body class=\"x\">Hello</body></html>",
]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085",
          "\u2003", "      \t  \n"]
COMBINING = ["e\u0301", "a\u0308", "o\u0302\u0323", "\u1100\u1161\u11a8", "\u212b", "q\u0307\u0323",
             "\u0041\u030a", "n\u0303", "\u0915\u093c", "\u00e9", "\u1e9b\u0323", "s\u0323\u0307"]


def sentence(rng, specials):
    parts = []
    for _ in range(rng.randint(3, 25)):
        r = rng.random()
        if r < 0.55:
            parts.append(rng.choice(WORDS[rng.choice(list(WORDS))]))
        elif r < 0.65:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        elif r < 0.72:
            parts.append(rng.choice(EMOJI))
        elif r < 0.80:
            parts.append(rng.choice(",.;:!?()-\"'/&%$€@#*"))
        elif r < 0.86:
            parts.append(rng.choice(COMBINING))
        elif r < 0.90:
            parts.append(rng.choice(CODE))
        elif r < 0.93 and specials:
            parts.append(rng.choice(specials))
        else:
            parts.append(rng.choice(SPACES))
    glue = [" ", "", " ", "\n", " ", "  "]
    return "".join(p + rng.choice(glue) for p in parts)


def training_corpus(rng, n):
    return [sentence(rng, []) for _ in range(n)]


# Code points for random text: assigned in Python's Unicode (14.0, as our tables), no
# surrogates, none from the Unicode versions only the library's engines know.
ASSIGNED = [cp for cp in range(0x20, 0x30000)
            if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co")]


def random_text(rng, specials):
    out = []
    for _ in range(rng.randint(0, 40)):
        r = rng.random()
        if r < 0.35:
            out.append(chr(rng.choice(ASSIGNED)))
        elif r < 0.55:
            out.append(chr(rng.randint(0x20, 0x7e)))
        elif r < 0.65:
            out.append(rng.choice(SPACES))
        elif r < 0.75 and specials:
            s = rng.choice(specials)
            cut = rng.randint(1, len(s))
            out.append(s if rng.random() < 0.6 else s[:cut])  # whole, or a prefix of one
        elif r < 0.85:
            out.append(rng.choice(COMBINING))
        else:
            out.append(rng.choice(WORDS[rng.choice(list(WORDS))]))
    return "".join(out)


def test_corpus(rng, specials, n_sentences, n_random):
    texts = ["", " ", "a", "\n", "  \n\n  x  ", "Hello world", "hello world", " Hello", "HELLO'S WORLD'LL",
             "it'\u017f fine", "I'M, YOU'RE, THEY'VE, WE'D", "don't won't can't", "1234567890 12 123 1.5 -3e10",
             "٣٤٥٦ Ⅻ½ ²³", "\t\tindented\n\ttabs\t", "trailing   ", "   leading", "a\u00a0b c\u3000d",
             "line1\r\nline2\rline3\n", "x" * 20000, "ab" * 6000, "🎉" * 300, " " * 3000, "\n" * 500,
             "9" * 2500, "".join(chr(0x4e00 + i) for i in range(3000)), "Straße " * 400,
             "hello<mask>world", "hello <mask> world", "<mask>", "  <mask>  ", "<mask_long><mask>x",
             "a[SEP]  b", "tab <|tab|>  tab", "hello hellohello ahello hello_ hello. (hello)",
             "wo\u0308rld wörld wöorld", "ab abab ab_ab ab9 9ab (ab)", "the theme the", "xΩmega Ωmega Ωmegax",
             "Hello<s>world</s>", "<s></s><s>", " <s> x", "<unk><0x41>", "[INST] hi [/INST]", "<extra> x<extra>",
             "[raw]  y", "<|begin_of_text|>Hi<|eot_id|>", "<|im_start|>user\nhi<|im_end|>", "<tool_call>{}</tool_call>",
             "<|endoftext|><|endoftext|>", "<|fim_prefix|>x<|fim_suffix|>", "<reponame>r<filename>f",
             "<|begin_of_text", "<|im_end", "e\u0301\u0301 \u1100\u1161\u11a8\u11a8"]
    texts += CODE
    texts += [sentence(rng, specials) for _ in range(n_sentences)]
    texts += [random_text(rng, specials) for _ in range(n_random)]
    return texts


# --- building the files -------------------------------------------------------------------

def build(name, cfg, corpus, out_dir):
    """Trains the vocabulary with the library and writes DIR/tokenizer.json (and
    tokenizer_config.json): the file's components are cfg's, verbatim."""
    skeleton = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                "normalizer": cfg["normalizer"], "post_processor": None, "decoder": None,
                "model": {"type": "BPE", "vocab": {}, "merges": []}}
    # Training pre-tokenizer: the file's, except that a SentencePiece-style BPE (no
    # pre-tokenizer in the file) is trained on words, as SentencePiece trains.
    train_pre = cfg["pre_tokenizer"]
    if not cfg["byte_level"]:
        train_pre = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    skeleton["pre_tokenizer"] = train_pre
    tok = Tokenizer.from_str(json.dumps(skeleton))
    first = list(cfg.get("first", []))
    byte_tokens = ["<0x%02X>" % b for b in range(256)] if cfg.get("bytes") else []
    trainer_args = dict(vocab_size=cfg["vocab"], special_tokens=first + byte_tokens, show_progress=False)
    if cfg["byte_level"]:
        trainer_args["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    if cfg.get("limit_alphabet"):
        trainer_args["limit_alphabet"] = cfg["limit_alphabet"]
    tok.train_from_iterator(corpus, BpeTrainer(**trainer_args))
    j = json.loads(tok.to_str())
    # <0xNN> are vocabulary entries in SentencePiece-converted files, not added tokens.
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]
    for t in j["added_tokens"]:
        t["normalized"] = False  # as the published files write their specials
    j["pre_tokenizer"] = cfg["pre_tokenizer"]
    j["decoder"] = cfg["decoder"]
    j["model"].update(cfg["model"])
    j["model"]["dropout"] = None
    vocab = j["model"]["vocab"]
    for w in cfg.get("whole_words", []):
        mapped = "".join(BYTE_CHAR[b] for b in w.encode())
        if mapped not in vocab:
            vocab[mapped] = len(vocab)
    for b in cfg.get("missing_bytes", []):
        # No merge uses a <0xNN> entry (they were specials in training); ids after it move down.
        gone = "<0x%02X>" % b
        gone_id = vocab.pop(gone)
        for k in vocab:
            if vocab[k] > gone_id:
                vocab[k] -= 1
        for t in j["added_tokens"]:
            assert t["id"] < gone_id
    tok = Tokenizer.from_str(json.dumps(j))
    if cfg.get("after"):
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in cfg["after"]])
    if cfg.get("after_nonspecial"):
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in cfg["after_nonspecial"]])
    for content, special, normalized, lstrip, rstrip, single_word in cfg.get("added", []):
        t = AddedToken(content, special=special, normalized=normalized, lstrip=lstrip, rstrip=rstrip,
                       single_word=single_word)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    ids = {t: tok.token_to_id(t) for t in first + cfg.get("after", []) + [a[0] for a in cfg.get("added", [])]}
    j = json.loads(tok.to_str())
    j["post_processor"] = cfg["post_processor"](ids)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
    if cfg.get("config") is not None:
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg["config"], f, ensure_ascii=False, indent=2)
    lib = Tokenizer.from_file(path)
    assert json.loads(lib.to_str())["pre_tokenizer"] == cfg["pre_tokenizer"], name
    return lib, path


def bytes_to_unicode():
    """GPT-2's byte -> character map (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHAR = bytes_to_unicode()


def specials_of(lib):
    return [t.content for t in lib.get_added_tokens_decoder().values()]


def probe(args, *cmd, expect_rc=0):
    r = subprocess.run([args.probe, *cmd], capture_output=True, text=True)
    if r.returncode != expect_rc:
        sys.exit("tokenizer_probe %s: exit %d, expected %d\n%s%s" % (" ".join(cmd), r.returncode, expect_rc,
                                                                    r.stdout, r.stderr))
    return r


def run_probe(args, tok_path, texts, decode_ids, work):
    inp, out = os.path.join(work, "in.json"), os.path.join(work, "out.json")
    with open(inp, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "decode": decode_ids}, f, ensure_ascii=False)
    probe(args, "encode", tok_path, inp, out)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


# --- parts --------------------------------------------------------------------------------

def part_compare(args):
    rng = random.Random(1234)
    corpus = training_corpus(rng, 2500)
    failures, total_tokens, total_texts = [], 0, 0
    for name, cfg in CONFIGS.items():
        t0 = time.time()
        lib, path = build(name, cfg, corpus, os.path.join(args.work, name))
        specials = specials_of(lib)
        texts = test_corpus(random.Random(zlib.crc32(name.encode())), specials, 400, 600)
        theirs = [e.ids for e in lib.encode_batch(texts, add_special_tokens=False)]
        vocab = lib.get_vocab_size(with_added_tokens=True)
        drng = random.Random(99)
        decode_ids = [[drng.randrange(vocab) for _ in range(drng.randint(0, 30))] for _ in range(300)]
        ours = run_probe(args, os.path.dirname(path), texts, decode_ids, args.work)
        bad = 0
        for text, a, b in zip(texts, ours["ids"], theirs):
            total_tokens += len(b)
            if a != b:
                bad += 1
                if bad <= 3:
                    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                    failures.append("%s: ids differ for %r (first at token %d: ours %s, theirs %s)" %
                                    (name, text[:80], k, a[k:k + 5], b[k:k + 5]))
        for text, ids, dec in zip(texts, theirs, ours["decoded"]):
            want = lib.decode(ids, skip_special_tokens=False)
            if dec != want:
                bad += 1
                if bad <= 6:
                    failures.append("%s: decode differs for %r: ours %r, theirs %r" % (name, text[:60], dec[:60],
                                                                                      want[:60]))
        for ids, dec in zip(decode_ids, ours["decoded_ids"]):
            want = lib.decode(ids, skip_special_tokens=False)
            if dec != want:
                bad += 1
                if bad <= 9:
                    failures.append("%s: decode of random ids %s differs: ours %r, theirs %r" % (name, ids[:8],
                                                                                                dec[:40], want[:40]))
        exp = cfg["expect"]
        tid = lib.token_to_id
        meta = {"vocab_size": vocab, "bos": tid(exp["bos"]) if exp["bos"] else -1,
                "eos": tid(exp["eos"]) if exp["eos"] else -1, "adds_bos": exp["adds_bos"]}
        if exp["adds_bos"]:  # the file's template puts that BOS first
            assert lib.encode("x").ids[0] == meta["bos"], name
        for k, v in meta.items():
            if ours[k] != v:
                bad += 1
                failures.append("%s: %s is %s, expected %s" % (name, k, ours[k], v))
        total_texts += len(texts)
        print("%-9s %5d texts, %7d tokens, %4d random id lists decoded, vocab %d: %s (%.1f s)" %
              (name, len(texts), sum(len(b) for b in theirs), len(decode_ids), vocab,
               "ok" if bad == 0 else "%d MISMATCHES" % bad, time.time() - t0))
    print("compared %d texts, %d tokens in %d configurations" % (total_texts, total_tokens, len(CONFIGS)))
    if failures:
        print("\n".join(failures))
        return 1
    return 0


def part_refuse(args):
    rng = random.Random(5)
    corpus = training_corpus(rng, 300)
    cfg = dict(CONFIGS["llama3"], vocab=400, after=LLAMA3_SPECIALS[:4])
    _, path = build("llama3", cfg, corpus, os.path.join(args.work, "base"))
    with open(path, encoding="utf-8") as f:
        base = json.load(f)

    def variant(label, change, expected):
        j = json.loads(json.dumps(base))
        change(j)
        d = os.path.join(args.work, label)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "tokenizer.json")
        with open(p, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        r = probe(args, "encode", p, os.path.join(args.work, "none.json"), os.path.join(d, "out.json"), expect_rc=2)
        if expected not in r.stderr:
            return "%s: the error does not name %r:\n%s" % (label, expected, r.stderr)
        print("%-22s refused: %s" % (label, r.stderr.strip().split("\n")[0][:150]))
        return None

    with open(os.path.join(args.work, "none.json"), "w") as f:
        json.dump({"texts": []}, f)
    cases = [
        ("wordpiece", lambda j: j["model"].update(type="WordPiece"), '"WordPiece"'),
        ("unigram", lambda j: j.update(model={"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 0}), '"Unigram"'),
        ("dropout", lambda j: j["model"].update(dropout=0.1), "dropout"),
        ("suffix", lambda j: j["model"].update(end_of_word_suffix="</w>"), "end_of_word_suffix"),
        ("lowercase", lambda j: j.update(normalizer={"type": "Lowercase"}), '"Lowercase"'),
        ("nfkc", lambda j: j.update(normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}]}), '"NFKC"'),
        ("replace-regex", lambda j: j.update(normalizer={"type": "Replace", "pattern": {"Regex": " +"},
                                                         "content": " "}), "Regex pattern"),
        ("split-regex", lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\s+|\w+"),
         "Split regex"),
        ("split-behavior", lambda j: j["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
         "Split behavior"),
        ("whitespace", lambda j: j.update(pre_tokenizer={"type": "Whitespace"}), '"Whitespace"'),
        ("bert", lambda j: j.update(post_processor={"type": "BertProcessing", "sep": ["[SEP]", 1],
                                                    "cls": ["[CLS]", 0]}), '"BertProcessing"'),
        ("wordpiece-decoder", lambda j: j.update(decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}),
         '"WordPiece"'),
        ("truncation", lambda j: j.update(truncation={"direction": "Right", "max_length": 8, "strategy":
                                                      "LongestFirst", "stride": 0}), "truncation"),
        ("padding", lambda j: j.update(padding={"strategy": "BatchLongest", "direction": "Right",
                                                "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                                                "pad_token": "[PAD]"}), "padding"),
        ("added-id", lambda j: j["added_tokens"][1].update(id=5), "is stated as id 5"),
        ("two-bos", lambda j: j["post_processor"]["processors"][1]["single"].insert(
            0, {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}), "2 tokens before"),
    ]
    errors = [e for e in (variant(*c) for c in cases) if e]
    # tokenizer_config.json that contradicts the file.
    d = os.path.join(args.work, "config-bos")
    shutil.copytree(os.path.dirname(path), d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "eos_token": "<|end_of_text|>"}, f)
    r = probe(args, "encode", d, os.path.join(args.work, "none.json"), os.path.join(d, "out.json"), expect_rc=2)
    if "add_bos_token" not in r.stderr:
        errors.append("config-bos: the error does not name add_bos_token:\n" + r.stderr)
    if errors:
        print("\n".join(errors))
        return 1
    print("%d variants refused with the component named" % (len(cases) + 1))
    return 0


def c4_like(rng, n):
    docs = []
    for i in range(n):
        docs.append({"text": sentence(rng, ["<|end_of_text|>"] if i % 7 == 0 else []),
                     "timestamp": "2019-04-%02dT12:00:00Z" % (i % 28 + 1), "url": "https://example.com/%d" % i})
    return docs


def write_lines(docs):
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)


def make_c4_dir(rng, root):
    """c4/en-like: two multi-member .json.gz shards and a plain .jsonl, names sorting
    as the shards number; a validation shard a pattern leaves out."""
    os.makedirs(root, exist_ok=True)
    shards = {}
    for k in (1, 0):  # written out of order
        docs = c4_like(rng, 40)
        data = write_lines(docs).encode()
        cut = len(data) // 2
        # two gzip members, as `cat a.gz b.gz` makes
        blob = gzip.compress(data[:cut]) + gzip.compress(data[cut:])
        name = "c4-train.%05d-of-00003.json.gz" % k
        with open(os.path.join(root, name), "wb") as f:
            f.write(blob)
        shards[name] = docs
    docs = c4_like(rng, 25)
    with open(os.path.join(root, "c4-train.00002-of-00003.json"), "w", encoding="utf-8") as f:
        f.write(write_lines(docs))
    shards["c4-train.00002-of-00003.json"] = docs
    val = c4_like(rng, 10)
    with open(os.path.join(root, "c4-validation.00000-of-00001.json.gz"), "wb") as f:
        f.write(gzip.compress(write_lines(val).encode()))
    shards["c4-validation.00000-of-00001.json.gz"] = val
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write("not data\n")
    return shards


def expected_tokens(lib, bos, eos, docs):
    out = []
    for d in docs:
        out += ([bos] if bos is not None else []) + lib.encode(d["text"], add_special_tokens=False).ids + [eos]
    return out


def part_data(args):
    rng = random.Random(77)
    lib, path = build("llama3", CONFIGS["llama3"], training_corpus(rng, 600), os.path.join(args.work, "tok"))
    bos, eos = lib.token_to_id("<|begin_of_text|>"), lib.token_to_id("<|end_of_text|>")
    root = os.path.join(args.work, "c4", "en")
    shards = make_c4_dir(rng, root)
    errors = []

    def check(label, data_path, names, *extra):
        out = os.path.join(args.work, "dataset.json")
        probe(args, "dataset", os.path.dirname(path), data_path, out, *extra)
        with open(out) as f:
            got = json.load(f)
        want = []
        for n in names:
            want += expected_tokens(lib, bos, eos, shards[n])
        if [os.path.basename(p) for p in got["files"]] != names:
            errors.append("%s: files %s, expected %s" % (label, got["files"], names))
        if got["tokens"] != want:
            k = next((i for i in range(min(len(want), len(got["tokens"]))) if want[i] != got["tokens"][i]), -1)
            errors.append("%s: %d tokens, expected %d (first difference at %d)" % (label, len(got["tokens"]),
                                                                                 len(want), k))
        print("%-9s %6d tokens from %d files: %s" % (label, len(want), len(names), got["describe"]))

    names = sorted(n for n in shards)
    check("directory", root, names)
    check("pattern", os.path.join(root, "c4-train.*.json*"), names[:3])
    check("one-file", os.path.join(root, names[0]), names[:1], "jsonl", "text")
    # A truncated shard: named, with the offset.
    bad = os.path.join(args.work, "bad")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(root, names[1]), "rb") as f:
        blob = f.read()
    with open(os.path.join(bad, "c4-train.00000-of-00001.json.gz"), "wb") as f:
        f.write(blob[:len(blob) - 100])
    r = probe(args, "dataset", os.path.dirname(path), bad, os.path.join(args.work, "x.json"), expect_rc=2)
    if "c4-train.00000-of-00001.json.gz' is truncated" not in r.stderr or "offset" not in r.stderr:
        errors.append("truncated: the error does not name the file and offset:\n" + r.stderr)
    else:
        print("truncated refused: " + r.stderr.strip()[:200])
    if errors:
        print("\n".join(errors))
        return 1
    return 0


def part_train(args):
    rng = random.Random(31)
    # A Llama-2-style tokenizer small enough for the tiny model (V = 512).
    cfg = dict(CONFIGS["llama2"], vocab=420, limit_alphabet=100)
    lib, path = build("llama2", cfg, training_corpus(rng, 800), os.path.join(args.work, "tok"))
    assert lib.get_vocab_size() <= 512
    root = os.path.join(args.work, "c4")
    shards = make_c4_dir(rng, root)
    names = sorted(n for n in shards if n.startswith("c4-train"))
    want = sum(len(expected_tokens(lib, 1, 2, shards[n])) for n in names)
    cmd = [args.train, "--model", "tiny", "--tokenizer", os.path.dirname(path), "--data",
           os.path.join(root, "c4-train.*"), "--seq-len", "32", "--batch-size", "2", "--max-steps", "2",
           "--log-every", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(r.stdout[-1500:], r.stderr[-1500:])
    if r.returncode != 0:
        print("fsdp-train failed: exit %d" % r.returncode)
        return 1
    needle = ": %d tokens in %d documents from %d files" % (want, sum(len(shards[n]) for n in names), len(names))
    if needle not in r.stdout + r.stderr:
        print("fsdp-train did not report %r (BOS + the library's ids + EOS per document)" % needle)
        return 1
    print("fsdp-train read %s" % needle)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["compare", "refuse", "data", "train"])
    parser.add_argument("--probe", required=True)
    parser.add_argument("--train")
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return {"compare": part_compare, "refuse": part_refuse, "data": part_data, "train": part_train}[args.part](args)


if __name__ == "__main__":
    sys.exit(main())

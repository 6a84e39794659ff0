#!/usr/bin/env python3
"""The checkpoint layer names no model family and no optimizer class (issue 36): a source scan.

Checkpoints of every family and optimizer go through one code path (docs/checkpoints.md, the state
seam): what a format needs of a model (config.json's text, tensors an import may skip, another
program's names of the parameters) comes from the model's family (include/fsdp/train/model_family.h),
and an optimizer's state comes through its named slots (include/fsdp/common/state.h), never from the
checkpoint code itself. This test reads every source and header of src/checkpoint/ and
include/fsdp/checkpoint/ (comments and string literals blanked) and fails when one names a family
(Llama, Mistral, Mixtral, Qwen, T5: a config type, a helper, a header of the family's model) or an
optimizer class (AdamW, SGD, ...; a header of src/optim), save the allow-list below, with reasons.

  test_names_no_model.py SOURCE_DIR     exit 0: none; 1: the places found, one per line

It also checks itself: a planted source naming a family in code and in an include must be found.
"""

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
from test_file_access import code_only  # noqa: E402  (the same blanking of comments and literals)

FAMILY = re.compile(r"(?i)\b\w*(?:llama|mistral|mixtral|qwen\d*|t5)\w*\b")
OPTIMIZER = re.compile(r"(?i)\b\w*(?:adamw?|sgd|adafactor|lion)(?:_\w*)?\b|\bexp_avg(?:_sq)?\b|\bmomentum_buffer\b")
# The model headers the layer may include: LoRA adapters' names are the same in every family.
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"fsdp/(models|train|optim)/([^"]+)"', re.M)
ALLOWED_INCLUDES = {"models/lora.h"}
# (file, word) -> why it may. Empty on purpose.
ALLOWED = {}
DIRS = ("src/checkpoint", "include/fsdp/checkpoint")


def scan(root: Path) -> list:
    found = []
    for top in DIRS:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".cpp", ".h", ".cc", ".hpp", ".inc") or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            text = path.read_text(errors="replace")
            for m in INCLUDE.finditer(text):
                if f"{m.group(1)}/{m.group(2)}" not in ALLOWED_INCLUDES:
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{rel}:{line}: includes fsdp/{m.group(1)}/{m.group(2)}: a family's header")
            code = code_only(text)
            for pattern, what, home in ((FAMILY, "a model family", "beside the family (src/train/family_*.cpp)"),
                                        (OPTIMIZER, "an optimizer class", "in the optimizer (src/optim/)")):
                for m in pattern.finditer(code):
                    if (rel, m.group(0)) in ALLOWED:
                        continue
                    line = code.count("\n", 0, m.start()) + 1
                    found.append(f"{rel}:{line}: names {what} ({m.group(0)}); it belongs {home}")
    return found


SELF_TEST = """
    // A LlamaConfig in a comment is fine, and so is "llama" in a string.
    #include "fsdp/models/lora.h"
    #include "fsdp/models/t5_config.h"
    std::string f(const models::LlamaConfig& c) { return torchtitan_llama_names(c); }
    void g(optim::AdamW& opt) { opt.exp_avg(); }
"""


def self_test() -> list:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / DIRS[0]).mkdir(parents=True)
        (root / DIRS[0] / "bad.cpp").write_text(SELF_TEST)
        found = scan(root)
    want = ["includes fsdp/models/t5_config.h", "(LlamaConfig)", "(torchtitan_llama_names)", "(AdamW)", "(exp_avg)"]
    bad = [f"self-test: the scan missed {w}" for w in want if not any(w in f for f in found)]
    bad += [f"self-test: flagged a comment, a string or LoRA: {f}" for f in found if re.search(r":[23]:", f)]
    return bad


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    problems = self_test()
    found = scan(Path(sys.argv[1]).resolve())
    for line in problems + found:
        print(line)
    if problems or found:
        print(f"FAIL: {len(found)} place(s) naming a model family or an optimizer, {len(problems)} self-test failure(s)")
        return 1
    print("ok: src/checkpoint and include/fsdp/checkpoint name no model family and no optimizer class")
    return 0


if __name__ == "__main__":
    sys.exit(main())

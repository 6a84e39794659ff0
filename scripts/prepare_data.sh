#!/usr/bin/env bash
# Builds fsdp-train's default corpus from Debian's `fortunes` package, and a
# SentencePiece tokenizer trained on it: nothing is downloaded. Deterministic: the
# same package versions give byte-identical output.
#
#   scripts/prepare_data.sh [--src DIR] [--out PATH] [--val-every N] [--vocab-size V] [--no-tokenizer]
#
#   --src DIR        fortune files (default /usr/share/games/fortunes)
#   --out PATH       training split, JSON lines (default build/data/corpus.jsonl);
#                    the validation split goes beside it as <name>.val.jsonl
#   --val-every N    every N-th document goes to the validation split (default 20)
#   --vocab-size V   SentencePiece vocabulary, written beside --out as tokenizer.model (default 512)
#   --no-tokenizer   do not train the tokenizer
#
# Conversion:
#  - Files: the regular files directly inside DIR, sorted by name (byte order);
#    skipped: *.dat index files, symlinks (the *.u8 aliases), subdirectories (the
#    offensive collections live in off/) and files whose name has a dot.
#  - Documents: the text between lines that contain only "%". Trailing whitespace
#    and leading/trailing blank lines are trimmed; empty entries are dropped.
#    Overstrike sequences ("_<BS>x" for underline, "x<BS>x" for bold) keep the
#    character that was printed last, BEL characters are dropped, and bytes that
#    are not UTF-8 are decoded as Latin-1.
#  - Split: documents are numbered in file order from 0; number k goes to the
#    validation split when k % N == N - 1, otherwise to training.
#  - Output: one JSON object per line, {"text": "..."}, UTF-8, keys as written.
#
# Tokenizer (Debian's spm_train): Llama 2's SentencePiece recipe scaled down — BPE,
# byte fallback (every byte has a piece, so no text is ever <unk>), identity
# normalization, whitespace kept, digits split, unk/bos/eos = 0/1/2 — trained on the
# training split's non-empty lines, one thread, no sampling (deterministic). The
# default 512 pieces fill the `tiny` and `small` presets' vocabulary (V = 512):
# 256 byte pieces + 3 specials + 253 learned merges, which take ~1.7x fewer tokens
# than bytes on this corpus. --vocab-size is a soft limit (--hard_vocab_limit=false):
# a tiny corpus gets fewer pieces instead of an error.
#
# Without the fortunes package (apt-get install fortunes, see scripts/deps.sh) the
# repository's small corpus data/fallback_corpus.jsonl (+ .val.jsonl) can be used.
set -euo pipefail
cd "$(dirname "$0")/.."

SRC=/usr/share/games/fortunes
OUT=build/data/corpus.jsonl
VAL_EVERY=20
VOCAB=512
TOKENIZER=1

usage() { sed -n '6,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# The value after a flag, or a usage error naming the flag: value FLAG WHAT "$@"
value() {
  (($# >= 4)) || { echo "prepare_data.sh: error: $1 needs $2 (see prepare_data.sh --help)" >&2; exit 2; }
  printf '%s' "$4"
}

while (($# > 0)); do
  case "$1" in
    --src) SRC=$(value --src "a directory" "$@"); shift 2 ;;
    --out) OUT=$(value --out "a path" "$@"); shift 2 ;;
    --val-every) VAL_EVERY=$(value --val-every "a number" "$@"); shift 2 ;;
    --vocab-size) VOCAB=$(value --vocab-size "a number" "$@"); shift 2 ;;
    --no-tokenizer) TOKENIZER=0; shift ;;
    -h|--help) usage ;;
    *) echo "prepare_data.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

if [[ ! -d "$SRC" ]]; then
  echo "prepare_data.sh: fortune directory '$SRC' not found — install Debian's fortunes package" \
       "(apt-get install fortunes; scripts/deps.sh does it), pass --src DIR, or use the small" \
       "corpus in data/fallback_corpus.jsonl" >&2
  exit 2
fi
if ! [[ "$VAL_EVERY" =~ ^[0-9]+$ ]] || ((VAL_EVERY < 2)); then
  echo "prepare_data.sh: --val-every must be an integer >= 2, got '$VAL_EVERY'" >&2
  exit 2
fi
if ! [[ "$VOCAB" =~ ^[0-9]+$ ]] || ((VOCAB < 300)); then
  echo "prepare_data.sh: --vocab-size must be an integer >= 300 (256 byte pieces + specials + merges), got '$VOCAB'" >&2
  exit 2
fi
command -v python3 >/dev/null || { echo "prepare_data.sh: python3 is required (scripts/deps.sh installs it)" >&2; exit 2; }
if ((TOKENIZER)) && ! command -v spm_train >/dev/null; then
  echo "prepare_data.sh: spm_train is required to train the tokenizer — install Debian's sentencepiece package" \
       "(apt-get install sentencepiece; scripts/deps.sh does it) or pass --no-tokenizer" >&2
  exit 2
fi

case "$OUT" in
  *.jsonl) VAL="${OUT%.jsonl}.val.jsonl" ;;
  *) VAL="$OUT.val.jsonl" ;;
esac
for dir in "$(dirname "$OUT")" "$(dirname "$VAL")"; do
  err=$(mkdir -p "$dir" 2>&1) ||
    { echo "prepare_data.sh: error: --out $OUT: cannot create directory $dir (${err#mkdir: }); choose a directory you can write to" >&2; exit 2; }
done

python3 - "$SRC" "$OUT" "$VAL" "$VAL_EVERY" <<'PY'
import json, os, sys

src, out_path, val_path, val_every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def clean(text):
    kept = []
    for ch in text:
        if ch == "\b":  # overstrike: a backspace takes back the character before it
            if kept and kept[-1] != "\n":
                kept.pop()
        elif ch != "\a":
            kept.append(ch)
    text = "".join(kept)
    lines = [l.rstrip() for l in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)

names = sorted(n for n in os.listdir(src)
               if "." not in n
               and not os.path.islink(os.path.join(src, n))
               and os.path.isfile(os.path.join(src, n)))
if not names:
    sys.exit(f"prepare_data.sh: no fortune files in {src}")

docs = []
for name in names:
    raw = open(os.path.join(src, name), "rb").read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    text = text.replace("\r\n", "\n")
    entry = []
    for line in text.split("\n") + ["%"]:
        if line == "%":
            doc = clean("\n".join(entry))
            if doc:
                docs.append(doc)
            entry = []
        else:
            entry.append(line)

n_train = n_val = b_train = b_val = 0
with open(out_path, "w", encoding="utf-8", newline="\n") as tr, \
     open(val_path, "w", encoding="utf-8", newline="\n") as va:
    for k, doc in enumerate(docs):
        line = json.dumps({"text": doc}, ensure_ascii=False) + "\n"
        size = len(doc.encode("utf-8"))
        if k % val_every == val_every - 1:
            va.write(line); n_val += 1; b_val += size
        else:
            tr.write(line); n_train += 1; b_train += size

print(f"prepare_data.sh: {len(names)} fortune files from {src}, {len(docs)} documents")
print(f"  train {out_path}: {n_train} documents, {b_train} bytes of text, {os.path.getsize(out_path)} bytes on disk")
print(f"  val   {val_path}: {n_val} documents, {b_val} bytes of text, {os.path.getsize(val_path)} bytes on disk")
PY

((TOKENIZER)) || exit 0
# The tokenizer, trained in a scratch directory with relative paths (the model
# records its trainer flags, so the same paths everywhere give identical bytes),
# then moved into place.
TOK="$(dirname "$OUT")/tokenizer.model"
WORK=$(mktemp -d "$(dirname "$OUT")/.spm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
python3 - "$OUT" "$WORK/input.txt" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8", newline="\n") as out:
    for line in f:
        for text_line in json.loads(line)["text"].split("\n"):
            if text_line.strip():
                out.write(text_line + "\n")
PY
(cd "$WORK" && spm_train --input=input.txt --model_prefix=tokenizer --vocab_size="$VOCAB" --model_type=bpe \
   --byte_fallback=true --character_coverage=1.0 --normalization_rule_name=identity \
   --remove_extra_whitespaces=false --split_digits=true --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 \
   --hard_vocab_limit=false --num_threads=1 --input_sentence_size=0 --shuffle_input_sentence=false \
   --random_seed=1 --minloglevel=2 > spm_train.log 2>&1) ||
  { echo "prepare_data.sh: spm_train failed:" >&2; cat "$WORK/spm_train.log" >&2; exit 1; }
mv -f "$WORK/tokenizer.model" "$TOK"
echo "  tokenizer $TOK: SentencePiece BPE, $(wc -l < "$WORK/tokenizer.vocab") pieces (byte fallback), trained on $(wc -l < "$WORK/input.txt") lines"

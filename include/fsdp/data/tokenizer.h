// Tokenizers: text <-> token ids.
//
// Four kinds, picked by `make_tokenizer(spec)`:
//  - "byte"             ByteTokenizer: ids 0..255 are the bytes of the UTF-8 text,
//                       then the specials; vocab_size() == 258, so it fits the `tiny`
//                       model (V = 512).
//  - a SentencePiece    SentencePieceTokenizer (Llama 2, Mistral `tokenizer.model`),
//    .model file        through libsentencepiece.
//  - a tiktoken BPE     TiktokenTokenizer (Llama 3.x `tokenizer.model`: lines
//    rank file          "<base64 token> <rank>"), implemented natively here.
//  - a Hugging Face     HfTokenizer (Llama 3, Qwen2/2.5/3, SmolLM2, Llama 2, Mistral,
//    tokenizer.json     TinyLlama), implemented natively here; see its class comment.
// A path is recognised by its content, never by its name: a file whose first
// non-blank byte is '{' is a tokenizer.json; a tiktoken file starts with a
// "<base64> <integer>" line; anything else is handed to SentencePiece, whose models
// are protobufs. A directory stands for the model directory holding the tokenizer:
// its tokenizer.json if there is one, else its tokenizer.model.
//
// Contract shared by all kinds:
//  - encode(text) never adds BOS/EOS (no post-processor template is applied). Callers
//    add bos_id()/eos_id(); adds_bos() says whether the tokenizer's own convention puts
//    BOS before a document.
//  - Special token text inside `text`: byte, SentencePiece and tiktoken encode it as
//    ordinary text (the behaviour of Meta's Llama 3 tokenizer.py defaults); HfTokenizer
//    maps it to the token's id, as the `tokenizers` library does.
//  - decode(ids) requires 0 <= id < vocab_size() for every id (UsageError otherwise).
//  - Every id encode() returns is < vocab_size(). A model's vocabulary V must be
//    >= vocab_size(); datasets check this with TokenDataset::validate.
//  - All methods are const and thread-safe; a Tokenizer is immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdp::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text` (raw bytes; UTF-8 expected but not required), no BOS/EOS.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids`. Byte-level kinds return the exact bytes, so
  // decode(encode(s)) == s for every byte string s (SentencePiece: for every
  // string its normalizer leaves unchanged; see SentencePieceTokenizer).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  // Number of ids: every id is in [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // Beginning / end of sequence ids; -1 when the tokenizer has none (only a
  // SentencePiece model trained without them).
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Whether documents start with BOS by this tokenizer's convention: its files say
  // so (a tokenizer.json post-processor template with a token before the text). The
  // trainer's datasets then put bos_id() before every document. Others: false.
  virtual bool adds_bos() const { return false; }
  // For logs: "byte", "sentencepiece:<path>", "tiktoken:<path>", "hf:<path>".
  virtual std::string name() const = 0;
};

// spec: "byte", the path of a SentencePiece model, a tiktoken rank file or a
// tokenizer.json, or a model directory holding tokenizer.json or tokenizer.model.
// Throws UsageError when the file is missing, unreadable, in none of these formats,
// or uses something the implementation does not have (named in the message).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

// The file make_tokenizer(spec) reads ("byte" for "byte"): a directory stands
// for its tokenizer.json, else its tokenizer.model. Throws UsageError naming
// the spec when there is no such file, or it is not a regular file (a device
// such as /dev/zero, a FIFO, a socket), or it is empty. Cheap: reads nothing.
std::string tokenizer_file(const std::string& spec);

// --- byte level -------------------------------------------------------------------

// ids 0..255: the byte with that value; 256: BOS, 257: EOS. decode() renders the
// specials as "<|begin_of_text|>" and "<|end_of_text|>" (Llama 3's names).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  static constexpr int32_t kVocabSize = 258;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::string name() const override { return "byte"; }
};

// --- SentencePiece ------------------------------------------------------------------

// A SentencePiece model (Llama 2 / Mistral). bos_id()/eos_id() come from the model
// (-1 if it has none); vocab_size() is the model's piece count. decode() drops
// control pieces (BOS/EOS), as SentencePiece does. Round trip holds for text the
// model's normalizer leaves unchanged (Llama 2 uses the "identity" normalizer and
// keeps whitespace) and, with byte_fallback, for characters outside the vocabulary.
//
// libsentencepiece is not linked into the program: it lives in a small module,
// libfsdp_spm_shim.so, loaded on first use (Note [SentencePiece isolation] in
// tokenizer_spm.cpp: Debian's libsentencepiece carries its own protobuf, which
// crashes a process that also loads LibTorch's). The module is looked up at
// $FSDP_SPM_SHIM, then beside the executable and in ../lib (an installed
// package's own), then where the build put it, then on the loader's path;
// Failure with these places if none loads.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws UsageError naming `model_path` when it cannot be loaded.
  explicit SentencePieceTokenizer(const std::string& model_path);
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  std::string name() const override { return "sentencepiece:" + path_; }

 private:
  struct Impl;  // the shim module's entry points and the processor handle
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

// --- tiktoken BPE (Llama 3) ---------------------------------------------------------

// Byte-level BPE in tiktoken's file format, as Llama 3 ships it.
//
// Encoding: the text is split by the Llama 3 pre-tokenizer (llama3_pretokenize in
// pretokenize.h); each piece is its own token if the piece is in the rank table,
// otherwise its bytes are merged pairwise, always merging the adjacent pair whose
// concatenation has the lowest rank (leftmost on ties), until no adjacent pair is in
// the table — tiktoken's `byte_pair_merge`, here in O(n log n) with a heap.
//
// Ids: rank r -> id r. Then the special tokens of Meta's Llama 3.1 tokenizer.py, in
// its order, at ids n + i where n is the number of ranks (n = 128000 for Llama 3:
// <|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|> 128006,
// <|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|> 128009, ... 256 in all,
// the unnamed ones "<|reserved_special_token_k|>"). vocab_size() = n + 256.
// BOS = <|begin_of_text|>, EOS = <|end_of_text|>. decode() renders specials as their text.
//
// File requirements (UsageError with the line number otherwise): every line is
// "<base64> <rank>", the ranks are exactly 0..n-1 with no repeats, the tokens are
// distinct, and all 256 single bytes are present (so every byte string encodes).
class TiktokenTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kNumSpecialTokens = 256;

  explicit TiktokenTokenizer(const std::string& path);
  // Not copyable: ranks_ views the strings owned by tokens_.
  TiktokenTokenizer(const TiktokenTokenizer&) = delete;
  TiktokenTokenizer& operator=(const TiktokenTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return num_ranks_ + kNumSpecialTokens; }
  int32_t bos_id() const override { return num_ranks_; }
  int32_t eos_id() const override { return num_ranks_ + 1; }
  std::string name() const override { return "tiktoken:" + path_; }

  int32_t num_ranks() const { return num_ranks_; }
  // Id of a special token by its text ("<|eot_id|>"); -1 if there is no such special.
  int32_t special_id(const std::string& text) const;
  // The BPE of one pre-tokenized piece (exposed for tests).
  std::vector<int32_t> encode_piece(std::string_view piece) const;

 private:
  int32_t rank_of(std::string_view bytes) const;  // -1 when not in the table

  std::string path_;
  int32_t num_ranks_ = 0;
  std::vector<std::string> tokens_;                      // rank -> token bytes
  std::unordered_map<std::string_view, int32_t> ranks_;  // token bytes (views of tokens_) -> rank
  std::vector<std::string> special_texts_;          // special index -> text
};

// --- Hugging Face tokenizer.json -----------------------------------------------------

// The `tokenizers` library's pipeline, read from a tokenizer.json and implemented
// natively: the same ids as `Tokenizer.from_file(path).encode(text,
// add_special_tokens=False).ids`, token for token, and decode() as its
// `decode(ids, skip_special_tokens=False)`. What is implemented is what the Llama 3,
// Qwen2/2.5/3, SmolLM2, Llama 2, Mistral and TinyLlama files use; anything else is
// refused at load with a UsageError naming the component (never a tokenization that
// silently differs):
//  - model: BPE, with vocab and merges (either serialization), unk_token, fuse_unk,
//    byte_fallback, ignore_merges; dropout null or 0; continuing_subword_prefix and
//    end_of_word_suffix null or "". Refused: WordPiece, Unigram, WordLevel.
//  - normalizer: null, NFC, Prepend, Replace with a String pattern, Sequence of these.
//  - pre_tokenizer: null, ByteLevel (with or without its GPT-2 regex, add_prefix_space),
//    Split with behavior Isolated whose Regex is Llama 3's, Qwen2's or GPT-2's (each
//    implemented by a scanner in pretokenize.h; any other regex is refused), Digits,
//    Metaspace (prepend_scheme always / first / never, split), Sequence of these.
//  - post_processor: null, ByteLevel (offsets only), TemplateProcessing whose single
//    template is [one special token] $A [one special token], Sequence of these.
//  - decoder: null, ByteLevel, Metaspace, Replace (String), ByteFallback, Fuse, Strip,
//    Sequence of these.
//  - added_tokens: special or not, with single_word, lstrip, rstrip and normalized as
//    the library treats them; ids assigned as the library assigns them (a file whose
//    stated id differs is refused). Special-token text in the input maps to its id.
//  - truncation and padding must be null (they would cut or pad every encoding).
// BOS / EOS: from the template (the token before / after $A) and from
// tokenizer_config.json in the same directory, if there is one (bos_token, eos_token,
// add_bos_token; where both name one they must agree). adds_bos(): the template puts a
// token before $A. Input text must be valid UTF-8 (UsageError with the byte offset
// otherwise), as the library's Python API only takes str.
// Unicode data: NFC with the library's Unicode 9.0 tables; \p{L}, \p{N}, \s and \w as
// in pretokenize.h (Unicode 14.0). The library's regex engine and Rust's char tables
// are newer: characters assigned after Unicode 14.0 may split differently.
class HfTokenizer final : public Tokenizer {
 public:
  // path: a tokenizer.json. Throws UsageError naming the file and the component.
  explicit HfTokenizer(const std::string& path);
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;
  ~HfTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  bool adds_bos() const override;
  std::string name() const override { return "hf:" + path_; }

  // Id of a token (added token or model vocabulary) by its text; -1 if there is none.
  int32_t token_to_id(std::string_view token) const;

 private:
  struct Impl;  // the pipeline's components (tokenizer_hf.cpp)
  void load();  // reads path_ into impl_
  std::string path_;
  std::unique_ptr<const Impl> impl_;
};

// True if `path`'s first line has the tiktoken form "<base64> <integer>".
// Throws UsageError naming the file if it cannot be read.
bool looks_like_tiktoken_file(const std::string& path);

}  // namespace fsdp::data

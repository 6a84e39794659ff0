// Hugging Face tokenizer.json, native. The class comment in tokenizer.h lists what is
// implemented; each component below follows the `tokenizers` library (0.23) step by
// step, with the library's function named where the behaviour is not obvious.
//
// Note [The encode pipeline]. TokenizerImpl::encode_single_sequence does, in order:
//  1. AddedVocabulary::extract_and_normalize: split the raw text on the added tokens
//     that are not `normalized` (leftmost-longest matches; lstrip/rstrip widen a match
//     over the whitespace beside it, single_word drops a match inside a word); each
//     remaining piece is normalized on its own, then split on the `normalized` added
//     tokens (matched in their normalized form).
//  2. The pre-tokenizer splits each remaining piece further (empty pieces vanish).
//  3. The model (BPE) turns each piece into ids.
// Pieces keep whether they start at byte 0 of the input: Metaspace's prepend_scheme
// "first" prepends only there (offsets_original().0 == 0 in the library).
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/common/files.h"
#include "fsdp/data/pretokenize.h"
#include "fsdp/data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <optional>
#include <queue>
#include <unordered_map>

namespace fsdp::data {
namespace {

using json = nlohmann::json;
using unicode::decode_utf8;

// The three Split regexes with a scanner in pretokenize.h, as the files write them.
const char* const kLlama3Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen2Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kGpt2Regex = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

// --- reading the file -------------------------------------------------------------------

// A position in the file for messages: the file and the JSON path of a component.
struct Where {
  const std::string* file;
  std::string path;  // "pre_tokenizer.pretokenizers[1]"
  Where at(const std::string& key) const { return {file, path.empty() ? key : path + "." + key}; }
  Where item(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
};

[[noreturn]] void refuse(const Where& w, const std::string& what, const std::string& hint) {
  detail::throw_usage(detail::cat("tokenizer.json '", *w.file, "': ", w.path, ": ", what, " — ", hint));
}

// Refuses a component this implementation does not have.
[[noreturn]] void unsupported(const Where& w, const std::string& what) {
  refuse(w, what + " is not supported",
         "fsdp-cpp implements the tokenizer.json components of the Llama 3, Qwen2/2.5/3, SmolLM2, Llama 2, "
         "Mistral and TinyLlama files (docs/data.md); use one of those tokenizers or a SentencePiece / "
         "tiktoken tokenizer.model");
}

const json& field(const json& j, const char* key, const Where& w) {
  const auto it = j.find(key);
  if (it == j.end()) refuse(w, detail::cat("has no \"", key, "\""), "is the file complete and from the tokenizers library?");
  return *it;
}

std::string string_field(const json& j, const char* key, const Where& w) {
  const json& v = field(j, key, w);
  if (!v.is_string()) refuse(w.at(key), "is not a string: " + v.dump(), "check the file");
  return v.get<std::string>();
}

bool bool_field(const json& j, const char* key, bool fallback, const Where& w) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) refuse(w.at(key), "is not a boolean: " + it->dump(), "check the file");
  return it->get<bool>();
}

// The "type" of a tagged component; untagged (pre-2020) forms are refused.
std::string type_of(const json& j, const Where& w) {
  if (!j.is_object()) refuse(w, "is not an object: " + j.dump().substr(0, 80), "check the file");
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string())
    refuse(w, "has no \"type\"", "save the tokenizer again with a current tokenizers library (Tokenizer.save)");
  return it->get<std::string>();
}

// A single code point given as a JSON string (Metaspace's replacement, Strip's content).
uint32_t char_field(const json& j, const char* key, const Where& w) {
  const std::string s = string_field(j, key, w);
  int len = 0;
  const uint32_t cp = s.empty() ? unicode::kInvalidCodePoint : decode_utf8(s, 0, len);
  if (cp == unicode::kInvalidCodePoint || static_cast<size_t>(len) != s.size())
    refuse(w.at(key), "must be one character, got \"" + s + "\"", "check the file");
  return cp;
}

std::string utf8(uint32_t cp) {
  std::string s;
  unicode::append_utf8(cp, s);
  return s;
}

// Replaces every non-overlapping occurrence of `pattern` (non-empty), left to right.
std::string replace_all(const std::string& s, const std::string& pattern, const std::string& content) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(pattern, pos)) != std::string::npos; pos = hit + pattern.size()) {
    out.append(s, pos, hit - pos);
    out += content;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// --- byte level -------------------------------------------------------------------------

// GPT-2's bytes_to_unicode (pre_tokenizers/byte_level.rs bytes_char): the printable
// bytes stand for themselves, the others for U+0100 + n in byte order.
struct ByteLevelAlphabet {
  std::array<std::string, 256> char_of_byte;  // UTF-8 of the stand-in
  std::unordered_map<uint32_t, unsigned char> byte_of_char;
  ByteLevelAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      char_of_byte[b] = utf8(cp);
      byte_of_char[cp] = static_cast<unsigned char>(b);
    }
  }
};

const ByteLevelAlphabet& byte_level() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

// --- normalizers ------------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class NfcNormalizer final : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode::nfc(s); }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);  // the library leaves "" alone
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = replace_all(s, pattern_, content_); }

 private:
  std::string pattern_, content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// Replace's pattern: {"String": "..."} (a {"Regex": ...} is refused).
std::string string_pattern(const json& j, const Where& w) {
  const json& p = field(j, "pattern", w);
  if (p.is_object() && p.size() == 1 && p.contains("String") && p["String"].is_string()) {
    std::string s = p["String"].get<std::string>();
    if (s.empty()) unsupported(w.at("pattern"), "an empty String pattern");
    return s;
  }
  if (p.is_object() && p.contains("Regex")) unsupported(w.at("pattern"), "a Regex pattern (" + p.dump() + ")");
  refuse(w.at("pattern"), "is neither {\"String\": ...} nor {\"Regex\": ...}: " + p.dump(), "check the file");
}

// The parts of a "Sequence" normalizer, pre-tokenizer or decoder: each item of
// the list j[key] read by make(item, where), the null ones (a null JSON item) left out.
template <typename Part, typename Make>
std::vector<std::unique_ptr<Part>> sequence_parts(const json& j, const char* key, const Where& w, const Make& make) {
  const json& list = field(j, key, w);
  if (!list.is_array()) refuse(w.at(key), "is not a list", "check the file");
  std::vector<std::unique_ptr<Part>> parts;
  for (size_t i = 0; i < list.size(); ++i) {
    auto part = make(list[i], w.at(key).item(i));
    if (part) parts.push_back(std::move(part));
  }
  return parts;
}

std::unique_ptr<Normalizer> make_normalizer(const json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(string_field(j, "prepend", w));
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(string_pattern(j, w), string_field(j, "content", w));
  if (type == "Sequence") {
    return std::make_unique<SequenceNormalizer>(sequence_parts<Normalizer>(j, "normalizers", w, make_normalizer));
  }
  unsupported(w, "the normalizer \"" + type + "\"");
}

// --- pre-tokenizers ---------------------------------------------------------------------

struct Piece {
  std::string text;
  bool at_origin;  // starts at byte 0 of the encoded text
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits; empty splits are dropped (PreTokenizedString::split).
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// Appends the non-empty parts of `piece` cut at `cuts` (increasing byte offsets).
void push_parts(const Piece& piece, const std::string& text, const std::vector<size_t>& cuts,
                std::vector<Piece>& out) {
  size_t begin = 0;
  for (size_t k = 0; k <= cuts.size(); ++k) {
    const size_t end = k < cuts.size() ? cuts[k] : text.size();
    if (end > begin) out.push_back({text.substr(begin, end - begin), piece.at_origin && begin == 0});
    begin = end;
  }
}

using Scanner = std::vector<std::string_view> (*)(std::string_view);

// Split with one of the scanned regexes, behavior Isolated: every match is a piece
// (the three regexes match every character, so there is nothing between matches).
class SplitPreTokenizer final : public PreTokenizer {
 public:
  explicit SplitPreTokenizer(Scanner scan) : scan_(scan) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces) {
      bool first = true;
      for (const std::string_view v : scan_(p.text)) {
        out.push_back({std::string(v), p.at_origin && first});
        first = false;
      }
    }
    pieces = std::move(out);
  }

 private:
  Scanner scan_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> split;
    for (Piece& p : pieces) {
      if (add_prefix_space_ && p.text[0] != ' ') p.text.insert(0, " ");
      if (!use_regex_) {
        split.push_back(std::move(p));
        continue;
      }
      bool first = true;
      for (const std::string_view v : gpt2_pretokenize(p.text)) {
        split.push_back({std::string(v), p.at_origin && first});
        first = false;
      }
    }
    const ByteLevelAlphabet& alphabet = byte_level();
    for (Piece& p : split) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) mapped += alphabet.char_of_byte[static_cast<unsigned char>(c)];
      p.text = std::move(mapped);
    }
    pieces = std::move(split);
  }

 private:
  bool add_prefix_space_, use_regex_;
};

// Digits: numbers (char::is_numeric, i.e. \p{N}) apart from the rest; each one on its
// own (individual_digits, behavior Isolated) or in runs (Contiguous).
class DigitsPreTokenizer final : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    std::vector<size_t> cuts;
    for (const Piece& p : pieces) {
      cuts.clear();
      int prev = -1;  // class of the previous code point: 1 number, 0 other, -1 none
      for (size_t i = 0; i < p.text.size();) {
        int len = 0;
        const int cls = unicode::is_number(decode_utf8(p.text, i, len)) ? 1 : 0;
        if (i > 0 && (cls != prev || (individual_ && cls == 1))) cuts.push_back(i);
        prev = cls;
        i += static_cast<size_t>(len);
      }
      push_parts(p, p.text, cuts, out);
    }
    pieces = std::move(out);
  }

 private:
  bool individual_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(uint32_t replacement, PrependScheme scheme, bool split)
      : replacement_(utf8(replacement)), scheme_(scheme), split_(split) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    std::vector<size_t> cuts;
    for (const Piece& p : pieces) {
      std::string t = replace_all(p.text, " ", replacement_);
      const bool prepend = !starts_with(t, replacement_) &&
                           (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_origin));
      if (prepend) t.insert(0, replacement_);
      if (!split_) {
        out.push_back({std::move(t), p.at_origin});
        continue;
      }
      // Behavior MergedWithNext: each replacement character starts a piece and takes
      // the run of other characters after it; one followed by another stays alone.
      cuts.clear();
      for (size_t i = 0; (i = t.find(replacement_, i)) != std::string::npos; i += replacement_.size())
        if (i > 0) cuts.push_back(i);
      push_parts(p, t, cuts, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

PrependScheme prepend_scheme(const json& j, const Where& w) {
  // pre_tokenizers/metaspace.rs: prepend_scheme defaults to "always"; the legacy
  // add_prefix_space = false means "never" and contradicts any other scheme.
  PrependScheme scheme = PrependScheme::kAlways;
  if (const auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
    const std::string s = it->is_string() ? it->get<std::string>() : it->dump();
    if (s == "always") scheme = PrependScheme::kAlways;
    else if (s == "first") scheme = PrependScheme::kFirst;
    else if (s == "never") scheme = PrependScheme::kNever;
    else refuse(w.at("prepend_scheme"), "is \"" + s + "\"", "use always, first or never");
  }
  if (const auto it = j.find("add_prefix_space"); it != j.end() && it->is_boolean() && !it->get<bool>()) {
    if (scheme != PrependScheme::kNever)
      refuse(w, "add_prefix_space false contradicts prepend_scheme", "the tokenizers library refuses this file too");
    scheme = PrependScheme::kNever;
  }
  return scheme;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(bool_field(j, "add_prefix_space", true, w),
                                                   bool_field(j, "use_regex", true, w));
  if (type == "Split") {
    const json& p = field(j, "pattern", w);
    if (!p.is_object() || !p.contains("Regex") || !p["Regex"].is_string())
      unsupported(w.at("pattern"), "a Split pattern other than a Regex (" + p.dump() + ")");
    const std::string re = p["Regex"].get<std::string>();
    Scanner scan = nullptr;
    if (re == kLlama3Regex) scan = llama3_pretokenize;
    else if (re == kQwen2Regex) scan = qwen2_pretokenize;
    else if (re == kGpt2Regex) scan = gpt2_pretokenize;
    else
      unsupported(w.at("pattern"), "the Split regex \"" + re +
                                       "\" (implemented: the Llama 3, Qwen2 and GPT-2 regexes, exactly as their files "
                                       "write them)");
    const std::string behavior = string_field(j, "behavior", w);
    if (behavior != "Isolated") unsupported(w.at("behavior"), "Split behavior \"" + behavior + "\"");
    if (bool_field(j, "invert", false, w)) unsupported(w.at("invert"), "Split with invert = true");
    return std::make_unique<SplitPreTokenizer>(scan);
  }
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(bool_field(j, "individual_digits", false, w));
  if (type == "Metaspace")
    return std::make_unique<MetaspacePreTokenizer>(char_field(j, "replacement", w), prepend_scheme(j, w),
                                                   bool_field(j, "split", true, w));
  if (type == "Sequence") {
    return std::make_unique<SequencePreTokenizer>(
        sequence_parts<PreTokenizer>(j, "pretokenizers", w, make_pre_tokenizer));
  }
  unsupported(w, "the pre-tokenizer \"" + type + "\"");
}

// --- decoders ---------------------------------------------------------------------------

using Tokens = std::vector<std::string>;

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual Tokens decode_chain(Tokens tokens) const = 0;  // the library's Decoder::decode_chain
};

// All tokens back to bytes (a token with a character outside the alphabet keeps its
// own UTF-8), then the bytes as lossy UTF-8: one string.
class ByteLevelDecoder final : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    const ByteLevelAlphabet& alphabet = byte_level();
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        int len = 0;
        const auto it = alphabet.byte_of_char.find(decode_utf8(t, i, len));
        if (it == alphabet.byte_of_char.end()) all = false;
        else mapped.push_back(static_cast<char>(it->second));
        i += static_cast<size_t>(len);
      }
      bytes += all ? mapped : t;
    }
    return {unicode::utf8_lossy(bytes)};
  }
};

// Every replacement character becomes a space, except in the first token (when a
// prefix is prepended), where they all vanish (decoders of metaspace.rs).
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(uint32_t replacement, PrependScheme scheme) : replacement_(utf8(replacement)), scheme_(scheme) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = replace_all(tokens[i], replacement_, i == 0 && scheme_ != PrependScheme::kNever ? "" : " ");
    return tokens;
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (auto& t : tokens) t = replace_all(t, pattern_, content_);
    return tokens;
  }

 private:
  std::string pattern_, content_;
};

// Runs of "<0xNN>" tokens become their bytes as text, or one U+FFFD per byte when the
// run is not valid UTF-8.
class ByteFallbackDecoder final : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    Tokens out;
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (unicode::find_invalid_utf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (auto& t : tokens) {
      if (const int b = byte_token(t); b >= 0) {
        run.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }

 private:
  // "<0xNN>": the byte NN, parsed as the library does (u8::from_str_radix(NN, 16): hex
  // digits of either case, or '+' and one digit); otherwise -1.
  static int byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    if (t[3] == '+') return lo;
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  Tokens decode_chain(Tokens tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (auto& t : tokens) {
      std::vector<uint32_t> cps;
      for (size_t i = 0; i < t.size();) {
        int len = 0;
        cps.push_back(decode_utf8(t, i, len));
        i += static_cast<size_t>(len);
      }
      size_t begin = 0, end = cps.size();
      while (begin < std::min(start_, cps.size()) && cps[begin] == content_) ++begin;
      for (size_t k = 0; k < stop_ && end > begin && cps[end - 1] == content_; ++k) --end;
      std::string s;
      for (size_t i = begin; i < end; ++i) unicode::append_utf8(cps[i], s);
      t = std::move(s);
    }
    return tokens;
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  Tokens decode_chain(Tokens tokens) const override {
    for (const auto& p : parts_) tokens = p->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

size_t count_field(const json& j, const char* key, const Where& w) {
  const json& v = field(j, key, w);
  if (!v.is_number_unsigned()) refuse(w.at(key), "is not a non-negative integer: " + v.dump(), "check the file");
  return v.get<size_t>();
}

std::unique_ptr<Decoder> make_decoder(const json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(char_field(j, "replacement", w), prepend_scheme(j, w));
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(string_pattern(j, w), string_field(j, "content", w));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(char_field(j, "content", w), count_field(j, "start", w),
                                          count_field(j, "stop", w));
  if (type == "Sequence") {
    return std::make_unique<SequenceDecoder>(sequence_parts<Decoder>(j, "decoders", w, make_decoder));
  }
  unsupported(w, "the decoder \"" + type + "\"");
}

// --- the BPE model ----------------------------------------------------------------------

class Bpe {
 public:
  Bpe(const json& j, const Where& w) {
    const std::string type = type_of(j, w);
    if (type != "BPE") unsupported(w, "the model \"" + type + "\" (only BPE is implemented)");
    if (const auto it = j.find("dropout"); it != j.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0))
      unsupported(w.at("dropout"), "BPE dropout " + it->dump() + " (random merges at encode time)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto it = j.find(key);
      if (it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
        unsupported(w.at(key), std::string(key) + " " + it->dump());
    }
    fuse_unk_ = bool_field(j, "fuse_unk", false, w);
    byte_fallback_ = bool_field(j, "byte_fallback", false, w);
    ignore_merges_ = bool_field(j, "ignore_merges", false, w);

    const json& vocab = field(j, "vocab", w);
    if (!vocab.is_object()) refuse(w.at("vocab"), "is not an object {token: id}", "check the file");
    int64_t max_id = -1;
    for (const auto& [tok, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= (uint64_t{1} << 30))
        refuse(w.at("vocab"), "token \"" + tok + "\" has id " + id.dump(), "ids must be integers in [0, 2^30)");
      max_id = std::max<int64_t>(max_id, id.get<int64_t>());
    }
    size_ = static_cast<int32_t>(vocab.size());
    tokens_.resize(static_cast<size_t>(max_id + 1));
    present_.assign(static_cast<size_t>(max_id + 1), 0);
    for (const auto& [tok, id] : vocab.items()) {
      const auto i = id.get<size_t>();
      if (present_[i]) refuse(w.at("vocab"), "tokens \"" + tokens_[i] + "\" and \"" + tok + "\" share id " +
                                                 std::to_string(i), "every id must name one token");
      present_[i] = 1;
      tokens_[i] = tok;
    }
    ids_.reserve(vocab.size());
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (present_[i]) ids_.emplace(std::string_view(tokens_[i]), static_cast<int32_t>(i));

    if (const auto it = j.find("unk_token"); it != j.end() && !it->is_null()) {
      if (!it->is_string()) refuse(w.at("unk_token"), "is not a string", "check the file");
      unk_token_ = it->get<std::string>();
      unk_id_ = id_of(*unk_token_);  // -1: the library fails only when it is needed; so do we
    }
    // Nothing to encode text into: every document would become its end-of-sequence
    // marker alone (or unknown tokens), and a run would train on nothing.
    if (size_ == 0) refuse(w.at("vocab"), "is empty: no text can be encoded", "give the model's real tokenizer.json");
    if (size_ == 1 && unk_id_ >= 0) {
      refuse(w.at("vocab"), "holds only the unknown token \"" + *unk_token_ + "\": every text would encode to it",
             "give the model's real tokenizer.json");
    }
    for (int b = 0; b < 256; ++b) {
      static const char* digits = "0123456789ABCDEF";
      const std::string code = std::string("<0x") + digits[b >> 4] + digits[b & 15] + ">";
      byte_ids_[b] = id_of(code);
    }

    const json& merges = field(j, "merges", w);
    if (!merges.is_array()) refuse(w.at("merges"), "is not a list", "check the file");
    merges_.reserve(merges.size());
    int32_t rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string a, b;
      if (m.is_string()) {
        // The legacy "a b" form (convert_merges_to_hashmap): "#version" lines skipped,
        // exactly one space.
        const std::string s = m.get<std::string>();
        if (starts_with(s, "#version")) continue;
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          refuse(w.at("merges").item(i), "\"" + s + "\" is not two tokens separated by one space", "check the file");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        refuse(w.at("merges").item(i), "is neither \"a b\" nor [\"a\", \"b\"]: " + m.dump(), "check the file");
      }
      const int32_t ia = id_of(a), ib = id_of(b), inew = id_of(a + b);
      if (ia < 0) refuse(w.at("merges").item(i), "token \"" + a + "\" is not in the vocabulary", "check the file");
      if (ib < 0) refuse(w.at("merges").item(i), "token \"" + b + "\" is not in the vocabulary", "check the file");
      if (inew < 0) refuse(w.at("merges").item(i), "the merged token \"" + a + b + "\" is not in the vocabulary", "check the file");
      // A repeated pair takes its last rank, as the library's map does.
      merges_[key(ia, ib)] = Merge{rank, inew};
      ++rank;
    }
  }

  int32_t id_of(std::string_view tok) const {
    const auto it = ids_.find(tok);
    return it == ids_.end() ? -1 : it->second;
  }
  const std::string* token_of(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < tokens_.size() && present_[id] ? &tokens_[id] : nullptr;
  }
  int32_t size() const { return size_; }  // the number of tokens (get_vocab_size)
  int32_t id_bound() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1

  // BPE::tokenize of one pre-tokenized piece.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const int32_t id = id_of(word); id >= 0) {
        out.push_back(id);
        return;
      }
    }
    merge_word(word, out);
  }

 private:
  struct Merge {
    int32_t rank, new_id;
  };
  struct Symbol {
    int32_t c;
    int64_t prev, next;  // -1: none
    size_t len;          // bytes of the word; 0: merged into its left neighbour
  };
  struct Candidate {
    int32_t rank;
    size_t pos;
    int32_t new_id;
    // The library's heap pops the lowest rank, then the lowest position.
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  const Merge* merge_of(int32_t a, int32_t b) const {
    const auto it = merges_.find(key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  static void add(std::vector<Symbol>& symbols, int32_t c, size_t len) {
    const auto n = static_cast<int64_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({c, n - 1, -1, len});
  }

  // BPE::merge_word then Word::merge_all.
  void merge_word(std::string_view w, std::vector<int32_t>& out) const {
    std::vector<Symbol> symbols;
    symbols.reserve(w.size());
    size_t unk_bytes = 0;  // a pending run of unknown characters (of unk_id_), 0: none
    for (size_t i = 0; i < w.size();) {
      int len = 0;
      decode_utf8(w, i, len);
      const std::string_view ch = w.substr(i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      if (const int32_t id = id_of(ch); id >= 0) {
        if (unk_bytes > 0) add(symbols, unk_id_, unk_bytes);
        unk_bytes = 0;
        add(symbols, id, ch.size());
        continue;
      }
      if (byte_fallback_ &&
          std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
        // As the library: a pending unknown run is not flushed before the bytes.
        for (const char c : ch) add(symbols, byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
      if (!unk_token_) continue;  // no unk_token: the library drops the character
      FSDP_CHECK(unk_id_ >= 0, "tokenizer.json: the BPE unk_token \"", *unk_token_, "\" is not in the vocabulary, ",
                 "and the text has a character outside it (\"", std::string(ch), "\") — fix the file's unk_token");
      if (unk_bytes > 0 && !fuse_unk_) {
        add(symbols, unk_id_, unk_bytes);
        unk_bytes = 0;
      }
      unk_bytes += ch.size();
    }
    if (unk_bytes > 0) add(symbols, unk_id_, unk_bytes);

    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (const Merge* m = merge_of(symbols[i].c, symbols[i + 1].c)) queue.push({m->rank, i, m->new_id});
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& cur = symbols[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const auto next_pos = static_cast<size_t>(cur.next);
      const Symbol right = symbols[next_pos];
      // An expired entry: the pair at pos no longer makes this token.
      const Merge* m = merge_of(cur.c, right.c);
      if (m == nullptr || m->new_id != top.new_id) continue;
      cur.c = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      symbols[next_pos].len = 0;
      if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size())
        symbols[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
      if (cur.prev >= 0) {
        const auto prev = static_cast<size_t>(cur.prev);
        if (const Merge* pm = merge_of(symbols[prev].c, cur.c)) queue.push({pm->rank, prev, pm->new_id});
      }
      if (cur.next >= 0) {
        if (const Merge* nm = merge_of(cur.c, symbols[static_cast<size_t>(cur.next)].c))
          queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
    for (const Symbol& s : symbols)
      if (s.len != 0) out.push_back(s.c);
  }

  std::vector<std::string> tokens_;  // id -> token (where present_)
  std::vector<char> present_;
  std::unordered_map<std::string_view, int32_t> ids_;  // views of tokens_
  std::unordered_map<uint64_t, Merge> merges_;         // (left id, right id) -> rank, merged id
  std::array<int32_t, 256> byte_ids_{};                // "<0xNN>" ids, -1 when absent
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  int32_t size_ = 0;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
};

// --- added tokens -----------------------------------------------------------------------

struct AddedToken {
  int32_t id;
  std::string content;
  std::string pattern;  // what is matched: content, or its normalized form when `normalized`
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest matching of a set of byte strings (the library's daachorse
// automaton with MatchKind::LeftmostLongest), as a trie walked from each position.
class TokenMatcher {
 public:
  void add(const std::string& pattern, size_t token) {
    int32_t node = 0;
    for (const char c : pattern) {
      const auto b = static_cast<unsigned char>(c);
      auto& next = nodes_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
      if (it == next.end()) {
        next.emplace_back(b, static_cast<int32_t>(nodes_.size()));
        node = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = static_cast<int64_t>(token);
    first_bytes_[static_cast<unsigned char>(pattern[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }

  // The longest pattern starting at s[i]: (length, token), or (0, -1).
  std::pair<size_t, int64_t> longest_at(std::string_view s, size_t i) const {
    std::pair<size_t, int64_t> best{0, -1};
    if (!first_bytes_[static_cast<unsigned char>(s[i])]) return best;
    int32_t node = 0;
    for (size_t k = i; k < s.size(); ++k) {
      const auto b = static_cast<unsigned char>(s[k]);
      const auto& next = nodes_[node].next;
      const auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
      if (it == next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = {k + 1 - i, nodes_[node].token};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int64_t token = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_bytes_{};
  bool empty_ = true;
};

struct Segment {
  int32_t id;  // the added token's id, or -1 for text
  size_t begin, end;
};

// The code point that ends s (s non-empty, valid UTF-8).
uint32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  int len = 0;
  return decode_utf8(s, i, len);
}

// AddedVocabulary::find_matches.
std::vector<Segment> find_matches(std::string_view s, const TokenMatcher& matcher,
                                  const std::vector<AddedToken>& tokens) {
  std::vector<Segment> out;
  if (matcher.empty()) {
    if (!s.empty()) out.push_back({-1, 0, s.size()});
    return out;
  }
  size_t start_offset = 0;
  for (size_t i = 0; i < s.size();) {
    const auto [len, index] = matcher.longest_at(s, i);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // the automaton resumes after the match, whatever is done with it
    const AddedToken& t = tokens[static_cast<size_t>(index)];
    if (t.single_word) {
      // A word character (Rust regex \w) just before or after: not a whole word.
      const bool start_space = start == 0 || !unicode::is_word_char(last_code_point(s.substr(0, start)));
      int l = 0;
      const bool stop_space = stop == s.size() || !unicode::is_word_char(decode_utf8(s, stop, l));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > 0 && unicode::is_space(last_code_point(s.substr(0, b)))) {
        --b;
        while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
      }
      start = std::max(b, start_offset);  // spaces a previous match took stay with it
    }
    if (t.rstrip) {
      for (int l = 0; stop < s.size() && unicode::is_space(decode_utf8(s, stop, l));) stop += static_cast<size_t>(l);
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
  return out;
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...}, or null.
std::optional<std::string> config_token(const json& config, const char* key, const Where& w) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  refuse(w.at(key), "is neither a string nor {\"content\": ...}: " + it->dump(), "check the file");
}

json read_json(const std::string& path, const char* what) {
  const std::string text = read_input_file(path, what, kMaxTokenizerBytes,
                                           "give a tokenizer.json (and a tokenizer_config.json beside it) as files");
  std::string why;
  std::optional<json> parsed = parse_json_input(text, why);
  FSDP_CHECK(parsed.has_value(), what, " '", path, "' is not valid JSON: ", why, " — is the file complete?");
  return std::move(*parsed);
}

}  // namespace

struct HfTokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<Bpe> model;
  std::vector<AddedToken> added;                           // in file order
  std::unordered_map<std::string, int32_t> added_ids;      // content -> id
  std::unordered_map<int32_t, size_t> added_by_id;         // id -> index in `added`
  TokenMatcher raw_matcher, normalized_matcher;
  int32_t vocab_size = 0, bos = -1, eos = -1;
  bool adds_bos = false;

  int32_t token_to_id(std::string_view token) const {
    if (const auto it = added_ids.find(std::string(token)); it != added_ids.end()) return it->second;
    return model->id_of(token);
  }

  // HfTokenizer::load's steps, after the model and the components.
  void read_added_tokens(const json& j, const Where& root);
  void read_template(const json& j, const Where& root);
  void read_config(const std::string& path);
};

HfTokenizer::HfTokenizer(const std::string& path) : path_(path) {
  try {
    load();
  } catch (const json::exception& e) {
    // A value of an unexpected JSON type deep in a component.
    FSDP_CHECK(false, "tokenizer.json '", path, "' has an unexpected structure: ", e.what(),
               " — is it a tokenizer.json saved by the tokenizers library?");
  }
}

namespace {

// tokenizer.json's top level: what the file is, and settings fsdp-train does not follow.
void check_top_level(const json& j, const Where& root, const std::string& path) {
  FSDP_CHECK(j.is_object() && j.contains("model"), "tokenizer.json '", path, "' has no \"model\" — is it a ",
             "Hugging Face tokenizer.json (saved by the tokenizers library)?");
  if (const auto it = j.find("version"); it != j.end() && !(it->is_string() && it->get<std::string>() == "1.0"))
    refuse(root.at("version"), "is " + it->dump() + ", not \"1.0\"", "the tokenizers library refuses it too");
  for (const char* key : {"truncation", "padding"}) {
    const auto it = j.find(key);
    if (it != j.end() && !it->is_null())
      refuse(root.at(key), "is set (" + it->dump().substr(0, 120) + "), which would cut or pad every encoding",
             "set it to null: fsdp-train cuts the token stream into windows itself");
  }
}

// The post-processor's single template: the ids before $A (`prefix`) and after it (`suffix`).
void read_processor(const json& p, const Where& w, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return;
  const std::string type = type_of(p, w);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = field(p, "processors", w);
    if (!list.is_array()) refuse(w.at("processors"), "is not a list", "check the file");
    for (size_t i = 0; i < list.size(); ++i) read_processor(list[i], w.at("processors").item(i), prefix, suffix);
    return;
  }
  if (type != "TemplateProcessing") unsupported(w, "the post-processor \"" + type + "\"");
  const json& single = field(p, "single", w);
  const json& specials = field(p, "special_tokens", w);
  if (!single.is_array()) refuse(w.at("single"), "is not a list", "check the file");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const Where wi = w.at("single").item(i);
    if (piece.contains("Sequence")) {
      if (piece["Sequence"].value("id", "") != "A" || seen_a)
        refuse(wi, "a single template must hold $A once: " + piece.dump(), "check the file");
      seen_a = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].value("id", "");
      const auto st = specials.find(name);
      if (st == specials.end() || !st->contains("ids") || !(*st)["ids"].is_array())
        refuse(wi, "special token \"" + name + "\" is not in special_tokens", "check the file");
      for (const json& id : (*st)["ids"]) (seen_a ? suffix : prefix).push_back(id.get<int32_t>());
    } else {
      refuse(wi, "is neither Sequence nor SpecialToken: " + piece.dump(), "check the file");
    }
  }
  if (!seen_a) refuse(w.at("single"), "has no $A", "check the file");
}

}  // namespace

void HfTokenizer::load() {
  const std::string& path = path_;
  const json j = read_json(path, "tokenizer.json");
  const Where root{&path_, ""};
  check_top_level(j, root, path);

  auto impl = std::make_unique<Impl>();
  impl->model = std::make_unique<Bpe>(j["model"], root.at("model"));
  impl->normalizer = make_normalizer(j.value("normalizer", json()), root.at("normalizer"));
  impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()), root.at("pre_tokenizer"));
  impl->decoder = make_decoder(j.value("decoder", json()), root.at("decoder"));
  impl->read_added_tokens(j, root);
  impl->read_template(j, root);
  impl->read_config(path);
  impl_ = std::move(impl);
}

// Added tokens, with ids as AddedVocabulary::add_tokens assigns them: the id of the
// same text in the vocabulary (or an earlier added token), else the next free id
// from the model's vocabulary size on.
void HfTokenizer::Impl::read_added_tokens(const json& j, const Where& root) {
  int32_t next_id = model->size();
  int32_t id_bound = model->id_bound();
  if (const auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
    const Where w = root.at("added_tokens");
    if (!it->is_array()) refuse(w, "is not a list", "check the file");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const Where wi = w.item(i);
      AddedToken a{};
      a.content = string_field(t, "content", wi);
      if (a.content.empty()) continue;  // the library ignores empty tokens
      a.single_word = bool_field(t, "single_word", false, wi);
      a.lstrip = bool_field(t, "lstrip", false, wi);
      a.rstrip = bool_field(t, "rstrip", false, wi);
      a.special = bool_field(t, "special", false, wi);
      a.normalized = bool_field(t, "normalized", !a.special, wi);
      if (const int32_t known = token_to_id(a.content); known >= 0) {
        a.id = known;
      } else {
        a.id = next_id++;
      }
      if (const auto id = t.find("id"); id != t.end() && !(id->is_number_integer() && id->get<int64_t>() == a.id))
        refuse(wi, "\"" + a.content + "\" is stated as id " + id->dump() + " but the tokenizers library gives it id " +
                       std::to_string(a.id),
               "the file's ids do not follow the library's rule (the vocabulary's id, else the next id after the "
               "vocabulary); fix the file");
      a.pattern = a.content;
      if (a.normalized && normalizer) normalizer->normalize(a.pattern);
      if (const auto dup = added_by_id.find(a.id); dup != added_by_id.end()) {
        added[dup->second] = a;  // the library keeps the last properties of an id
      } else {
        added_by_id.emplace(a.id, added.size());
        added.push_back(a);
      }
      added_ids[a.content] = a.id;
      id_bound = std::max(id_bound, a.id + 1);
    }
  }
  for (size_t k = 0; k < added.size(); ++k) {
    const AddedToken& a = added[k];
    if (a.normalized) {
      if (!a.pattern.empty()) normalized_matcher.add(a.pattern, k);
    } else {
      raw_matcher.add(a.pattern, k);
    }
  }
  vocab_size = id_bound;
}

// BOS / EOS: the post-processor's single template (tokenizer_config.json may
// restate them: read_config).
void HfTokenizer::Impl::read_template(const json& j, const Where& root) {
  std::vector<int32_t> prefix, suffix;
  read_processor(j.value("post_processor", json()), root.at("post_processor"), prefix, suffix);
  if (prefix.size() > 1 || suffix.size() > 1)
    unsupported(root.at("post_processor"), detail::cat("a template adding ", prefix.size(), " tokens before and ",
                                                       suffix.size(), " after the text (at most one BOS and one EOS)"));
  for (const int32_t id : prefix) bos = id;
  for (const int32_t id : suffix) eos = id;
  adds_bos = !prefix.empty();
}

// tokenizer_config.json beside `path`, when there is one: its BOS and EOS
// must agree with the template's.
void HfTokenizer::Impl::read_config(const std::string& path) {
  const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::exists(config_path)) {
    const json config = read_json(config_path, "tokenizer_config.json");
    const Where cw{&config_path, ""};
    auto resolve = [&](const char* key) {
      const std::optional<std::string> tok = config_token(config, key, cw);
      if (!tok) return -1;
      const int32_t id = token_to_id(*tok);
      if (id < 0) refuse(cw.at(key), "\"" + *tok + "\" is not a token of " + path, "check the two files belong together");
      return id;
    };
    const int32_t config_bos = resolve("bos_token"), config_eos = resolve("eos_token");
    if (config_bos >= 0 && bos >= 0 && config_bos != bos)
      refuse(cw.at("bos_token"), detail::cat("is id ", config_bos, " but tokenizer.json's template puts id ", bos,
                                             " before the text"),
             "make the two files agree");
    if (config_eos >= 0 && eos >= 0 && config_eos != eos)
      refuse(cw.at("eos_token"), detail::cat("is id ", config_eos, " but tokenizer.json's template puts id ", eos,
                                             " after the text"),
             "make the two files agree");
    if (config_bos >= 0) bos = config_bos;
    if (config_eos >= 0) eos = config_eos;
    if (const auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean() &&
                                                      it->get<bool>() != adds_bos)
      refuse(cw.at("add_bos_token"), detail::cat("is ", it->dump(), " but tokenizer.json's post-processor ",
                                                 adds_bos ? "adds" : "does not add", " a BOS token"),
             "the tokenizers library follows tokenizer.json: make the two files agree");
    if (const auto it = config.find("split_special_tokens"); it != config.end() && it->is_boolean() && it->get<bool>())
      unsupported(cw.at("split_special_tokens"), "split_special_tokens = true (special-token text encoded as text)");
  }
}

HfTokenizer::~HfTokenizer() = default;

int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
bool HfTokenizer::adds_bos() const { return impl_->adds_bos; }
int32_t HfTokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

// See Note [The encode pipeline].
std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  const size_t bad = unicode::find_invalid_utf8(text);
  FSDP_CHECK(bad == std::string_view::npos, "tokenizer ", name(), ": the text is not valid UTF-8 at byte ", bad,
             " of ", text.size(), " — tokenizer.json tokenizers take Unicode text; fix or re-encode the data");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<Piece> pieces;
  for (const Segment& seg : find_matches(text, m.raw_matcher, m.added)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string normalized(text.substr(seg.begin, seg.end - seg.begin));
    if (m.normalizer) m.normalizer->normalize(normalized);
    for (const Segment& sub : find_matches(normalized, m.normalized_matcher, m.added)) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({normalized.substr(sub.begin, sub.end - sub.begin), seg.begin == 0 && sub.begin == 0});
      if (m.pre_tokenizer) m.pre_tokenizer->apply(pieces);
      for (const Piece& p : pieces) m.model->tokenize(p.text, ids);
    }
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  Tokens tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (const auto it = m.added_by_id.find(id); it != m.added_by_id.end()) {
      // A normalized added token decodes from its normalized form (simple_id_to_token).
      tokens.push_back(m.added[it->second].pattern);
    } else if (const std::string* t = m.model->token_of(id)) {
      tokens.push_back(*t);
    } else {
      FSDP_CHECK(false, "tokenizer ", name(), ": cannot decode id ", id, " at position ", i, ": ",
                 id >= 0 && id < vocab_size() ? "no token has this id" : "ids must be in [0, " +
                                                                              std::to_string(vocab_size()) + ")",
                 " — were these ids made by another tokenizer?");
    }
  }
  if (!m.decoder) {
    std::string out;  // the library joins with spaces when there is no decoder
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  std::string out;
  for (const std::string& t : m.decoder->decode_chain(std::move(tokens))) out += t;
  return out;
}

}  // namespace fsdp::data

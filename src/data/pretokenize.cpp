// The Llama 3 pre-tokenizer regex, hand-compiled. See pretokenize.h for the
// contract and the character classes.
//
// At each position the regex tries its alternatives left to right and takes the
// first that matches (leftmost-first, as tiktoken's fancy_regex does), each with
// greedy quantifiers and backtracking. Every code point starts a match of some
// alternative (letters: 2, numbers: 3, other: 4, whitespace: 5-7), so the pieces are
// consecutive. What each alternative matches at position i, c the code point there:
//
//  1 (?i:'s|'t|'re|'ve|'m|'ll|'d)   c is U+0027 and a contraction follows.
//  2 [^\r\n\p{L}\p{N}]?\p{L}+       c a letter: the letter run from c. Otherwise c
//                                   neither CR, LF nor number and a letter follows:
//                                   c plus the letter run after it.
//  3 \p{N}{1,3}                     up to three numbers.
//  4  ?[^\s\p{L}\p{N}]+[\r\n]*      an optional U+0020 (taken only when "other"
//                                   follows: otherwise the + fails either way), the
//                                   run of "other", then the run of CR/LF after it.
//  5 \s*[\r\n]+                     \s* first takes the whole whitespace run, then
//                                   gives back until [\r\n]+ can match: the match ends
//                                   just after the LAST CR/LF of the run (none: fails).
//  6 \s+(?!\S)                      the whole run if it ends the text; otherwise the
//                                   run minus its last code point (the lookahead then
//                                   sees whitespace), which needs a run of >= 2.
//  7 \s+                            the whole run (a single space before non-space).
#include "fsdp/data/pretokenize.h"

#include "fsdp/common/error.h"

#include <algorithm>
#include <iterator>

namespace fsdp::data {
namespace unicode {
namespace {

struct CodePointRange {
  uint32_t lo, hi;  // inclusive
};

#include "unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodePointRange (&table)[N], uint32_t cp) {
  // First range whose hi >= cp.
  const auto* it = std::lower_bound(std::begin(table), std::end(table), cp,
                                    [](const CodePointRange& r, uint32_t v) { return r.hi < v; });
  return it != std::end(table) && it->lo <= cp;
}

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t pos, int& len) {
  FSDP_ASSERT(pos < s.size(), "pos ", pos, " size ", s.size());
  const auto b0 = static_cast<unsigned char>(s[pos]);
  len = 1;
  if (b0 < 0x80) return b0;
  const size_t left = s.size() - pos;
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[pos + k]); };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left >= 2 && is_cont(at(1))) {
      len = 2;
      return ((b0 & 0x1Fu) << 6) | (at(1) & 0x3Fu);
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left >= 3 && is_cont(at(1)) && is_cont(at(2))) {
      const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((at(1) & 0x3Fu) << 6) | (at(2) & 0x3Fu);
      // Reject overlong forms and UTF-16 surrogates.
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
        len = 3;
        return cp;
      }
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left >= 4 && is_cont(at(1)) && is_cont(at(2)) && is_cont(at(3))) {
      const uint32_t cp = ((b0 & 0x07u) << 18) | ((at(1) & 0x3Fu) << 12) | ((at(2) & 0x3Fu) << 6) |
                          (at(3) & 0x3Fu);
      if (cp >= 0x10000 && cp <= 0x10FFFF) {
        len = 4;
        return cp;
      }
    }
  }
  return kInvalidCodePoint;
}

bool is_letter(uint32_t cp) { return cp != kInvalidCodePoint && in_ranges(kLetterRanges, cp); }
bool is_number(uint32_t cp) { return cp != kInvalidCodePoint && in_ranges(kNumberRanges, cp); }
bool is_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace unicode

namespace {

using unicode::decode_utf8;
using unicode::is_letter;
using unicode::is_number;
using unicode::is_space;

enum class Cls { kLetter, kNumber, kSpace, kOther };

Cls classify(uint32_t cp) {
  if (cp < 0x80) {  // fast path for ASCII
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return Cls::kLetter;
    if (cp >= '0' && cp <= '9') return Cls::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return Cls::kSpace;
    return Cls::kOther;
  }
  if (is_letter(cp)) return Cls::kLetter;
  if (is_number(cp)) return Cls::kNumber;
  if (is_space(cp)) return Cls::kSpace;
  return Cls::kOther;
}

bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// (?i) folding for the contraction letters: ASCII, plus U+017F -> 's'.
uint32_t fold(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x17F) return 's';
  return cp;
}

class Scanner {
 public:
  // max_numbers: the bound of alternative 3 (Llama 3: \p{N}{1,3}; Qwen2: \p{N}, i.e. 1).
  Scanner(std::string_view s, int max_numbers) : s_(s), max_numbers_(max_numbers) {}

  // End of the piece that starts at i (i < size).
  size_t match(size_t i) const {
    const size_t n = s_.size();
    int len = 0;
    const uint32_t c = decode_utf8(s_, i, len);
    const size_t i1 = i + len;
    const Cls k = classify(c);

    // 1: contractions.
    if (c == '\'' && i1 < n) {
      int l2 = 0;
      const uint32_t c2 = fold(decode_utf8(s_, i1, l2));
      if (c2 == 's' || c2 == 't' || c2 == 'm' || c2 == 'd') return i1 + l2;
      if ((c2 == 'r' || c2 == 'v' || c2 == 'l') && i1 + l2 < n) {
        int l3 = 0;
        const uint32_t c3 = fold(decode_utf8(s_, i1 + l2, l3));
        if (((c2 == 'r' || c2 == 'v') && c3 == 'e') || (c2 == 'l' && c3 == 'l')) return i1 + l2 + l3;
      }
    }
    // 2: optional non-letter/number/CR/LF prefix, then letters.
    if (k == Cls::kLetter) return skip(i1, Cls::kLetter, -1);
    if (k != Cls::kNumber && !is_crlf(c) && i1 < n) {
      int l2 = 0;
      if (classify(decode_utf8(s_, i1, l2)) == Cls::kLetter) return skip(i1 + l2, Cls::kLetter, -1);
    }
    // 3: one to max_numbers_ numbers.
    if (k == Cls::kNumber) return skip(i1, Cls::kNumber, max_numbers_ - 1);
    // 4: optional space, "other" run, CR/LF run.
    size_t j = n;  // start of the "other" run, n: none
    if (k == Cls::kOther) {
      j = i;
    } else if (c == ' ' && i1 < n) {
      int l2 = 0;
      if (classify(decode_utf8(s_, i1, l2)) == Cls::kOther) j = i1;
    }
    if (j < n) {
      size_t e = skip(j, Cls::kOther, -1);
      while (e < n) {
        int l = 0;
        if (!is_crlf(decode_utf8(s_, e, l))) break;
        e += l;
      }
      return e;
    }
    // 5-7: c is whitespace.
    FSDP_ASSERT(k == Cls::kSpace, "code point ", c, " at byte ", i, " matched no alternative");
    size_t e = i, last_start = i, after_last_crlf = 0;
    int count = 0;
    while (e < n) {
      int l = 0;
      const uint32_t cp = decode_utf8(s_, e, l);
      if (classify(cp) != Cls::kSpace) break;
      if (is_crlf(cp)) after_last_crlf = e + l;
      last_start = e;
      e += l;
      ++count;
    }
    if (after_last_crlf > 0) return after_last_crlf;  // 5
    if (e == n) return e;                             // 6, at the end of the text
    if (count >= 2) return last_start;                // 6, lookahead sees the last space
    return e;                                         // 7
  }

 private:
  // Skips code points of class `cls` from `pos`; at most `max` of them (-1: no limit).
  size_t skip(size_t pos, Cls cls, int max) const {
    while (pos < s_.size() && max != 0) {
      int l = 0;
      if (classify(decode_utf8(s_, pos, l)) != cls) break;
      pos += l;
      --max;
    }
    return pos;
  }

  std::string_view s_;
  int max_numbers_;
};

// GPT-2's regex (the ByteLevel pre-tokenizer's, use_regex = true):
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// At position i, c the code point there (contractions are case-sensitive here):
//  1 contractions                 c is U+0027 and s, t, m, d or re, ve, ll follow.
//  2-4  ?X+ for X = letter, number, "other": c of class X: its run; c == U+0020 and
//                                 a code point of class X follows: the space and the run.
//  5 \s+(?!\S)                    the whole whitespace run if it ends the text, else the
//                                 run minus its last code point (needs a run of >= 2).
//  6 \s+                          the whole run (a single whitespace before non-space).
class Gpt2Scanner {
 public:
  explicit Gpt2Scanner(std::string_view s) : s_(s) {}

  size_t match(size_t i) const {
    const size_t n = s_.size();
    int len = 0;
    const uint32_t c = decode_utf8(s_, i, len);
    const size_t i1 = i + len;
    if (c == '\'' && i1 < n) {
      const char c2 = s_[i1];
      if (c2 == 's' || c2 == 't' || c2 == 'm' || c2 == 'd') return i1 + 1;
      if (i1 + 1 < n) {
        const char c3 = s_[i1 + 1];
        if ((c2 == 'r' && c3 == 'e') || (c2 == 'v' && c3 == 'e') || (c2 == 'l' && c3 == 'l')) return i1 + 2;
      }
    }
    const Cls k = classify(c);
    if (k != Cls::kSpace) return run(i1, k);
    if (c == ' ' && i1 < n) {
      int l2 = 0;
      const Cls k2 = classify(decode_utf8(s_, i1, l2));
      if (k2 != Cls::kSpace) return run(i1 + l2, k2);
    }
    size_t e = i, last_start = i;
    int count = 0;
    while (e < n) {
      int l = 0;
      if (classify(decode_utf8(s_, e, l)) != Cls::kSpace) break;
      last_start = e;
      e += l;
      ++count;
    }
    if (e == n || count < 2) return e;  // 5 at the end of the text, or 6
    return last_start;                  // 5: the lookahead sees the last whitespace
  }

 private:
  size_t run(size_t pos, Cls cls) const {
    while (pos < s_.size()) {
      int l = 0;
      if (classify(decode_utf8(s_, pos, l)) != cls) break;
      pos += l;
    }
    return pos;
  }

  std::string_view s_;
};

template <class S>
std::vector<std::string_view> scan(std::string_view text, const S& scanner) {
  std::vector<std::string_view> pieces;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = scanner.match(i);
    FSDP_ASSERT(end > i && end <= text.size(), "empty match at byte ", i);
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

}  // namespace

std::vector<std::string_view> llama3_pretokenize(std::string_view text) { return scan(text, Scanner(text, 3)); }
std::vector<std::string_view> qwen2_pretokenize(std::string_view text) { return scan(text, Scanner(text, 1)); }
std::vector<std::string_view> gpt2_pretokenize(std::string_view text) { return scan(text, Gpt2Scanner(text)); }

}  // namespace fsdp::data

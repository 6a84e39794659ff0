// NFC, \w and UTF-8 helpers of the tokenizer.json pipeline. See pretokenize.h for the
// contracts and src/data/gen_unicode_hf_tables.py for where the tables come from.
#include "fsdp/common/error.h"
#include "fsdp/data/pretokenize.h"

#include <algorithm>
#include <iterator>

namespace fsdp::data::unicode {
namespace {

struct CodePointRange {
  uint32_t lo, hi;  // inclusive
};
struct Decomposition {
  uint32_t cp;
  uint16_t offset;  // into kDecompositionData
  uint8_t length;
};
struct CombiningClassRange {
  uint32_t lo, hi;  // inclusive
  uint8_t ccc;
};
struct Composition {
  uint32_t first, second, composite;
};

#include "unicode_hf_tables.inc"

// Hangul syllables compose and decompose arithmetically (Unicode 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::lower_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                                    [](const CombiningClassRange& r, uint32_t v) { return r.hi < v; });
  return it != std::end(kCombiningClasses) && it->lo <= cp ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const auto* it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                      [](const Decomposition& d, uint32_t v) { return d.cp < v; });
    if (it != std::end(kDecompositions) && it->cp == cp) {
      out.insert(out.end(), kDecompositionData + it->offset, kDecompositionData + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                                    [](const Composition& c, const std::pair<uint32_t, uint32_t>& v) {
                                      return c.first != v.first ? c.first < v.first : c.second < v.second;
                                    });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

bool is_word_char(uint32_t cp) {
  const auto* it = std::lower_bound(std::begin(kWordRanges), std::end(kWordRanges), cp,
                                    [](const CodePointRange& r, uint32_t v) { return r.hi < v; });
  return it != std::end(kWordRanges) && it->lo <= cp;
}

size_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    if (decode_utf8(text, i, len) == kInvalidCodePoint) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_utf8(uint32_t cp, std::string& out) {
  FSDP_ASSERT(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF), "not a Unicode scalar value: ", cp);
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);  // ASCII neither decomposes nor combines
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    int len = 0;
    const uint32_t cp = decode_utf8(text, i, len);
    FSDP_ASSERT(cp != kInvalidCodePoint, "nfc() of invalid UTF-8 at byte ", i);
    decompose(cp, cps);
    i += len;
  }
  // Canonical ordering: a stable sort of each run of non-starters by class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: a character combines with the last starter unless a
  // character between them has a class of 0 or >= its own ("blocked"). After the
  // ordering above, the last kept character decides; a starter that does not combine
  // becomes the new last starter.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = std::string::npos;
  int last_class = -1;  // class of the last kept character after the starter; -1: none
  for (const uint32_t cp : cps) {
    const int cls = combining_class(cp);
    if (starter != std::string::npos && (last_class < 0 || last_class < cls)) {
      if (const uint32_t c = compose_pair(out[starter], cp); c != 0) {
        out[starter] = c;
        continue;
      }
    }
    if (cls == 0) {
      starter = out.size();
      last_class = -1;
    } else {
      last_class = cls;
    }
    out.push_back(cp);
  }
  std::string result;
  result.reserve(text.size() + 8);
  for (const uint32_t cp : out) append_utf8(cp, result);
  return result;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  size_t i = 0;
  while (i < s.size()) {
    int len = 0;
    if (decode_utf8(s, i, len) != kInvalidCodePoint) {
      out.append(s.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      continue;
    }
    // The maximal subpart: the lead byte and the continuation bytes that could still
    // belong to a valid sequence (Unicode 15, 3.9 "U+FFFD Substitution of Maximal
    // Subparts"), or the single byte when it cannot lead one.
    const unsigned char b0 = byte(i);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    size_t k = 1;
    while (k <= need && i + k < s.size()) {
      const unsigned char b = byte(i + k);
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace fsdp::data::unicode

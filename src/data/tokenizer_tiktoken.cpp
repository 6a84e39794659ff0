// tiktoken-format byte-level BPE (Llama 3), native.
#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/data/pretokenize.h"
#include "fsdp/data/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <iterator>
#include <queue>
#include <sstream>

namespace fsdp::data {
namespace {

// Meta's Llama 3.1 tokenizer.py: these names, in this order, then
// "<|reserved_special_token_{2 + i}|>" up to 256 specials. (Llama 3.0 named ids
// 4, 5, 8, 10 reserved_special_token_2..5 instead; the ids of the named ones agree.)
const char* const kNamedSpecials[] = {
    "<|begin_of_text|>",   "<|end_of_text|>",   "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>",          "<|python_tag|>",
};


std::string hex_byte(int b) {
  static const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

}  // namespace

TiktokenTokenizer::TiktokenTokenizer(const std::string& path) : path_(path) {
  const std::string content = read_input_file(path, "tiktoken file", kMaxTokenizerBytes,
                                              "give Llama 3's tokenizer.model (lines \"<base64 token> <rank>\")");
  FSDP_CHECK(!content.empty(), "tiktoken file '", path, "' is empty — expected lines \"<base64 token> <rank>\"");

  // First pass: (token, rank) per non-empty line, as tiktoken's load_tiktoken_bpe.
  std::vector<std::pair<std::string, int64_t>> entries;
  std::vector<int64_t> lines;
  size_t pos = 0;
  int64_t line_no = 0;
  std::string bytes;
  while (pos < content.size()) {
    size_t eol = content.find('\n', pos);
    if (eol == std::string::npos) eol = content.size();
    std::string_view line(content.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    const auto bad = [&](const char* why) {
      FSDP_CHECK(false, "tiktoken file '", path, "' line ", line_no, ": ", why, ": \"",
                 line.substr(0, 80), "\" — every line must be \"<base64 token> <rank>\"");
    };
    if (sp == std::string_view::npos || sp == 0) bad("no \"<base64> <rank>\" pair");
    const std::string_view tok = line.substr(0, sp), rank_s = line.substr(sp + 1);
    if (rank_s.empty() || rank_s.size() > 10 || rank_s.find_first_not_of("0123456789") != std::string_view::npos)
      bad("the rank is not a non-negative integer");
    const std::optional<std::string> decoded = base64_decode(tok);
    if (!decoded || decoded->empty()) bad("the token is not valid non-empty base64");
    bytes = *decoded;
    entries.emplace_back(bytes, std::stoll(std::string(rank_s)));
    lines.push_back(line_no);
  }
  const int64_t n = static_cast<int64_t>(entries.size());
  FSDP_CHECK(n > 0, "tiktoken file '", path, "' has no \"<base64> <rank>\" lines");
  FSDP_CHECK(n <= (int64_t{1} << 30), "tiktoken file '", path, "' has ", n, " ranks; at most 2^30 are supported");

  // Ranks must be exactly 0..n-1: ids are ranks, and Llama 3's special ids start at n.
  tokens_.assign(static_cast<size_t>(n), std::string());
  std::vector<int64_t> line_of(static_cast<size_t>(n), -1);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t r = entries[k].second;
    FSDP_CHECK(r < n, "tiktoken file '", path, "' line ", lines[k], ": rank ", r, " is >= the number of ",
               "ranks ", n, " — ranks must be exactly 0..", n - 1, " (is the file truncated?)");
    FSDP_CHECK(line_of[r] < 0, "tiktoken file '", path, "' line ", lines[k], ": rank ", r,
               " repeats line ", line_of[r], " — every rank must appear once");
    line_of[r] = lines[k];
    tokens_[r] = std::move(entries[k].first);
  }
  num_ranks_ = static_cast<int32_t>(n);
  ranks_.reserve(static_cast<size_t>(n));
  for (int32_t r = 0; r < num_ranks_; ++r) {
    const auto [it, inserted] = ranks_.emplace(std::string_view(tokens_[r]), r);
    FSDP_CHECK(inserted, "tiktoken file '", path, "' line ", line_of[r], ": token of rank ", r,
               " repeats the token of rank ", it->second, " (line ", line_of[it->second], ")");
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    FSDP_CHECK(rank_of(std::string_view(&c, 1)) >= 0, "tiktoken file '", path, "' has no token for the byte ",
               hex_byte(b), " — a byte-level BPE file must contain all 256 single bytes");
  }

  for (const char* s : kNamedSpecials) special_texts_.emplace_back(s);
  for (int i = 0; static_cast<int>(special_texts_.size()) < kNumSpecialTokens; ++i)
    special_texts_.push_back("<|reserved_special_token_" + std::to_string(2 + i) + "|>");
}

int32_t TiktokenTokenizer::rank_of(std::string_view bytes) const {
  const auto it = ranks_.find(bytes);
  return it == ranks_.end() ? -1 : it->second;
}

int32_t TiktokenTokenizer::special_id(const std::string& text) const {
  for (size_t i = 0; i < special_texts_.size(); ++i)
    if (special_texts_[i] == text) return num_ranks_ + static_cast<int32_t>(i);
  return -1;
}

// tiktoken's byte_pair_merge: repeatedly merge the adjacent pair of parts whose
// concatenation has the lowest rank, the leftmost on ties, until no pair is in the
// table. tiktoken rescans all pairs per merge (O(n^2)); here a min-heap of
// (rank, start) with lazy deletion gives the same merge order in O(n log n), which
// matters for long pieces (runs of whitespace or symbols).
std::vector<int32_t> TiktokenTokenizer::encode_piece(std::string_view piece) const {
  std::vector<int32_t> out;
  if (piece.empty()) return out;
  if (const int32_t r = rank_of(piece); r >= 0) {
    out.push_back(r);
    return out;
  }
  const size_t n = piece.size();
  // Parts are [start, next_[start]); prev_ links back. Indices are byte offsets.
  std::vector<size_t> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;
  }
  struct Cand {
    int32_t rank;
    size_t start, end;  // the pair covers piece[start, end)
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push_pair = [&](size_t s) {
    const size_t m = next[s];
    if (m >= n) return;
    const size_t e = next[m];
    if (const int32_t r = rank_of(piece.substr(s, e - s)); r >= 0) heap.push({r, s, e});
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale unless the pair at c.start still spans exactly [start, end): its bytes,
    // hence its rank, are then those the entry was pushed with.
    if (!alive[c.start] || next[c.start] >= n || next[next[c.start]] != c.end) continue;
    const size_t m = next[c.start];
    alive[m] = 0;
    next[c.start] = c.end;
    if (c.end < n) prev[c.end] = c.start;
    if (prev[c.start] < n) push_pair(prev[c.start]);
    push_pair(c.start);
  }
  for (size_t s = 0; s < n; s = next[s]) {
    const int32_t r = rank_of(piece.substr(s, next[s] - s));
    FSDP_ASSERT(r >= 0, "BPE part without a rank (every single byte has one)");
    out.push_back(r);
  }
  return out;
}

std::vector<int32_t> TiktokenTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (const std::string_view piece : llama3_pretokenize(text)) {
    if (const int32_t r = rank_of(piece); r >= 0) {
      ids.push_back(r);
    } else {
      const auto part = encode_piece(piece);
      ids.insert(ids.end(), part.begin(), part.end());
    }
  }
  return ids;
}

std::string TiktokenTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    FSDP_CHECK(id >= 0 && id < vocab_size(), "tiktoken tokenizer ", path_, ": cannot decode id ", id,
               " at position ", i, ": ids must be in [0, ", vocab_size(),
               ") — were these ids made by another tokenizer?");
    if (id < num_ranks_) {
      out += tokens_[id];
    } else {
      out += special_texts_[id - num_ranks_];
    }
  }
  return out;
}

}  // namespace fsdp::data

// Token datasets: one logical stream of token ids t[0 .. N).
//
// Sources (DatasetOptions::format, or kAuto from the names):
//  - kText   a plain text file is ONE document (the whole file, bytes verbatim).
//            Collections of documents belong in JSON lines (scripts/prepare_data.sh
//            turns the fortunes' "%"-separated files into that).
//  - kJsonl  JSON lines: one JSON object per line, the document is the string field
//            `text_field` (default "text"). Blank lines are skipped; documents whose
//            text is "" are skipped (they would add a lone EOS).
//  - kBinary raw little-endian token ids (uint16 by default, or uint32), memory-mapped
//            read-only.
// Text and JSON-lines files may be gzip-compressed (c4's .json.gz): recognised by
// their content and decompressed while read, several concatenated members included;
// a damaged or truncated file is a UsageError naming the file and the compressed byte
// offset (Note [gzip data files] in src/data/data_file.h).
//
// `path` is one file, a directory, or a pattern with wildcards (* ? [...], fnmatch) in
// its last component ("c4/en/c4-train.*.json.gz"). A directory's files, and a
// pattern's matches, are read in byte order of their names (zero-padded shard numbers
// sort numerically); hidden files (".name") are skipped. A directory holds either
// *.bin shards (then other files are ignored) or text: with kAuto its *.jsonl,
// *.json, *.ndjson and *.txt files (each optionally .gz), every one in the format of
// its name, other files ignored; with kText / kJsonl every file, in that format.
// kAuto for a file: *.bin -> kBinary; *.jsonl, *.json, *.ndjson -> kJsonl; anything else
// -> kText (a ".gz" suffix is looked through: "x.json.gz" is JSON lines). Binary and
// text files cannot be mixed; compressed .bin files are refused (they cannot be mapped).
//
// Text sources are tokenized once, at load, into int32 storage (4 bytes a token):
// each document d becomes [BOS if add_bos] tokens(d) EOS, and the documents follow
// each other in file order — documents packed into one stream, EOS between them
// (and after the last). Binary sources are used as they are (no EOS added: the
// tool that wrote them decided).
//
// Errors (UsageError, naming the file): missing, unreadable or empty file; a
// directory without data files or a pattern matching none; a binary file whose size
// is not a multiple of the token size; a bad JSON line or a line without the string
// field (with the line number); a file with no documents; damaged gzip; a text source
// given without a tokenizer, or a tokenizer without EOS.
//
// A TokenDataset is immutable once built; all methods are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

class Tokenizer;

enum class DataFormat { kAuto, kText, kJsonl, kBinary };
enum class TokenDtype { kUint16, kUint32 };

// "auto", "text", "jsonl", "bin" / "uint16" (or "u16"), "uint32" (or "u32");
// UsageError listing the choices.
DataFormat parse_data_format(const std::string& s);
TokenDtype parse_token_dtype(const std::string& s);
const char* to_string(DataFormat f);
const char* to_string(TokenDtype d);

struct DatasetOptions {
  std::string path;                           // file, directory, or pattern (see above)
  DataFormat format = DataFormat::kAuto;
  std::string text_field = "text";            // kJsonl: the document's field
  TokenDtype token_dtype = TokenDtype::kUint16;  // kBinary: width of one id
  bool add_bos = false;                       // text sources: BOS before each document
  // Text and JSON lines are decompressed and tokenized into memory: a file that would
  // hold more than this many bytes (text, or its tokens) is refused by name instead of
  // running the machine out of memory (a gzip bomb, a corpus meant for .bin). Also
  // bounded by RLIMIT_DATA. -1: only that limit.
  int64_t memory_budget = -1;
};

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;

  // N: the number of tokens in the stream.
  virtual int64_t size() const = 0;
  // Copies t[begin, begin + count) into out[0, count).
  // Requires: 0 <= begin, 0 <= count, begin + count <= size() (InternalError otherwise).
  virtual void read(int64_t begin, int64_t count, int32_t* out) const = 0;
  // Where token `pos` comes from, for messages: "file /x/b.bin, token 12 of the file".
  virtual std::string locate(int64_t pos) const = 0;
  // One line for logs: the source, its format, N, and the document count for text.
  virtual std::string describe() const = 0;

  int32_t at(int64_t pos) const;
  // Throws UsageError if some id is outside [0, vocab_size): names the file, the
  // first offending position (global and within its file), the value and vocab_size.
  // Reads the whole stream once (binary: ~1 s per GB).
  void validate(int64_t vocab_size) const;
};

// The files `options.path` stands for, in the order they are read (see above).
// UsageError when it names none.
std::vector<std::string> data_files(const DatasetOptions& options);

// Loads a dataset. `tokenizer` is needed for text sources (and must have an EOS)
// and ignored for binary ones; it is used only during the call.
std::shared_ptr<const TokenDataset> load_dataset(const DatasetOptions& options,
                                                 const Tokenizer* tokenizer);

// A dataset over tokens already in memory (tests, generated data). `name` is used
// in messages as the dataset's file.
std::shared_ptr<const TokenDataset> make_token_dataset(std::vector<int32_t> tokens,
                                                       std::string name = "<memory>");

// Writes `tokens` as raw little-endian ids of `dtype` (the kBinary format).
// UsageError if an id does not fit the dtype; Failure if the file cannot be written.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens,
                      TokenDtype dtype);

}  // namespace fsdp::data

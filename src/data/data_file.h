// Sequential reading of a text data file, gzip-compressed or not (internal to the data
// layer; datasets use it for text and JSON lines).
//
// Note [gzip data files]. A file whose first two bytes are gzip's magic 1f 8b is
// decompressed while it is read (zlib); no text in UTF-8 can start with them (8b is a
// continuation byte), so the content decides, never the name. As gzip(1) and Python's
// gzip module: concatenated members are one stream (`cat a.gz b.gz`), zero bytes after
// a member are padding; anything else after a member is an error. Each member's CRC-32
// and length are checked by zlib at its end. Damage is a UsageError naming the file,
// the compressed byte offset where it was found, the member and how much had been
// decompressed: "truncated" when the file ends inside a member, zlib's diagnosis
// ("incorrect data check" = a CRC-32 mismatch) otherwise.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

// What to do with text data too large to tokenize into memory (the end of every such refusal).
inline constexpr const char* kTooLargeForMemoryFix =
    "split the data or pre-tokenize it into a binary token file (DatasetOptions::format bin, read from disk as "
    "needed)";

class DataFileReader {
 public:
  // Throws UsageError naming `path` when it cannot be opened.
  explicit DataFileReader(const std::string& path);
  ~DataFileReader();
  DataFileReader(const DataFileReader&) = delete;
  DataFileReader& operator=(const DataFileReader&) = delete;

  bool compressed() const { return gzip_ != nullptr; }
  const std::string& path() const { return path_; }

  // The next line, without its '\n' (and a '\r' before it), into `line`; false at the
  // end of the content. The last line needs no '\n'.
  bool next_line(std::string& line);
  // All of the remaining content; more than `max_bytes` (>= 0) is a UsageError naming
  // the file (a gzip bomb, a file too large for memory).
  std::string read_all(int64_t max_bytes = -1);

 private:
  struct Gzip;  // zlib's stream state

  // Up to `n` bytes of (decompressed) content into `out`; 0 only at the end.
  size_t read(char* out, size_t n);
  size_t read_file(unsigned char* out, size_t n);  // raw bytes; 0 at the end of the file

  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Gzip> gzip_;
  std::vector<unsigned char> head_;  // bytes read to detect gzip, served first (plain files)
  size_t head_pos_ = 0;
  std::string buf_;                  // content read but not yet returned by next_line
  size_t buf_pos_ = 0;
  bool eof_ = false;
};

}  // namespace fsdp::data

// Plain and gzip-compressed data files. See Note [gzip data files] in data_file.h.
#include "data_file.h"

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace fsdp::data {
namespace {

constexpr size_t kChunk = size_t{1} << 20;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

struct DataFileReader::Gzip {
  z_stream zs{};
  bool initialized = false;
  std::vector<unsigned char> in = std::vector<unsigned char>(kChunk);
  uint64_t file_bytes = 0;  // bytes read from the file so far
  uint64_t out_bytes = 0;   // bytes decompressed so far
  int member = 1;           // 1-based, for messages
  bool done = false;

  ~Gzip() {
    if (initialized) inflateEnd(&zs);
  }
  // Compressed bytes consumed by zlib: the offset of the next byte it will read.
  uint64_t offset() const { return file_bytes - zs.avail_in; }
};

DataFileReader::DataFileReader(const std::string& path) : path_(path) {
  const int fd = open_input_file(path, "data file", "give text, .jsonl(.gz) or .bin files (Note [Input files])");
  file_ = ::fdopen(fd, "rb");
  if (file_ == nullptr) {
    const std::string why = errno_text();
    ::close(fd);
    FSDP_FAIL("cannot read data file '", path, "': ", why);
  }
  head_.resize(2);
  size_t got = 0;
  while (got < 2) {
    const size_t n = std::fread(head_.data() + got, 1, 2 - got, file_);
    if (n == 0) break;
    got += n;
  }
  if (std::ferror(file_)) FSDP_FAIL("error reading data file '", path, "': ", errno_text());
  head_.resize(got);
  if (got == 2 && head_[0] == 0x1f && head_[1] == 0x8b) {
    gzip_ = std::make_unique<Gzip>();
    std::copy(head_.begin(), head_.end(), gzip_->in.begin());
    gzip_->zs.next_in = gzip_->in.data();
    gzip_->zs.avail_in = 2;
    gzip_->file_bytes = 2;
    head_.clear();
    // 15 + 16: a 32 KiB window and the gzip wrapper (header, CRC-32 and length).
    FSDP_CHECK(inflateInit2(&gzip_->zs, 15 + 16) == Z_OK, "zlib cannot start decompressing '", path, "'");
    gzip_->initialized = true;
  }
}

DataFileReader::~DataFileReader() {
  if (file_ != nullptr) std::fclose(file_);
}

size_t DataFileReader::read_file(unsigned char* out, size_t n) {
  const size_t got = std::fread(out, 1, n, file_);
  if (got == 0 && std::ferror(file_)) FSDP_FAIL("error reading data file '", path_, "': ", errno_text());
  return got;
}

size_t DataFileReader::read(char* out, size_t n) {
  if (!gzip_) {
    size_t k = 0;
    while (head_pos_ < head_.size() && k < n) out[k++] = static_cast<char>(head_[head_pos_++]);
    return k + read_file(reinterpret_cast<unsigned char*>(out) + k, n - k);
  }
  Gzip& g = *gzip_;
  z_stream& zs = g.zs;
  auto refill = [&] {
    const size_t got = read_file(g.in.data(), g.in.size());
    zs.next_in = g.in.data();
    zs.avail_in = static_cast<uInt>(got);
    g.file_bytes += got;
    return got > 0;
  };
  auto damaged = [&](const std::string& what) {
    FSDP_CHECK(false, "data file '", path_, "' is not a valid gzip file: ", what, " at compressed byte offset ",
               g.offset(), " (gzip member ", g.member, ", after ", g.out_bytes, " bytes decompressed) — the file ",
               "is damaged; fetch it again");
  };
  size_t produced = 0;
  while (produced == 0 && !g.done) {
    if (zs.avail_in == 0 && !refill()) {
      FSDP_CHECK(false, "data file '", path_, "' is truncated: it ends inside gzip member ", g.member,
                 " at compressed byte offset ", g.offset(), " (after ", g.out_bytes,
                 " bytes decompressed) — the file was cut short (an interrupted download?); fetch it again");
    }
    zs.next_out = reinterpret_cast<Bytef*>(out);
    zs.avail_out = static_cast<uInt>(n);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    produced = n - zs.avail_out;
    g.out_bytes += produced;
    if (ret == Z_STREAM_END) {
      // The member ended with its CRC-32 and length verified. Then: the end of the
      // file, zero padding, or the next member.
      for (;;) {
        while (zs.avail_in > 0 && *zs.next_in == 0) {
          ++zs.next_in;
          --zs.avail_in;
        }
        if (zs.avail_in > 0 || !refill()) break;
      }
      if (zs.avail_in == 0) {
        g.done = true;
      } else if (zs.avail_in >= 2 ? (zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b) : zs.next_in[0] == 0x1f) {
        inflateReset(&zs);  // a one-byte tail "1f" fails as truncated in the next member
        ++g.member;
      } else {
        ++g.member;
        damaged("bytes after gzip member " + std::to_string(g.member - 1) + " are not another gzip member");
      }
    } else if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_STREAM_ERROR) {
      std::string why = zs.msg != nullptr ? zs.msg : "invalid data";
      if (why == "incorrect data check") why += " (CRC-32 mismatch)";
      if (why == "incorrect length check") why += " (length mismatch)";
      damaged(why);
    } else if (ret == Z_MEM_ERROR) {
      FSDP_FAIL("zlib ran out of memory decompressing '", path_, "'");
    }
    // Z_OK, or Z_BUF_ERROR with no input left: read more.
  }
  return produced;
}

bool DataFileReader::next_line(std::string& line) {
  for (;;) {
    const size_t nl = buf_.find('\n', buf_pos_);
    if (nl != std::string::npos) {
      line.assign(buf_, buf_pos_, nl - buf_pos_);
      buf_pos_ = nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
    if (eof_) {
      if (buf_pos_ >= buf_.size()) return false;
      line.assign(buf_, buf_pos_, std::string::npos);
      buf_pos_ = buf_.size();
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
    buf_.erase(0, buf_pos_);
    buf_pos_ = 0;
    const size_t old = buf_.size();
    buf_.resize(old + kChunk);
    const size_t got = read(buf_.data() + old, kChunk);
    buf_.resize(old + got);
    if (got == 0) eof_ = true;
  }
}

std::string DataFileReader::read_all(int64_t max_bytes) {
  std::string out = buf_.substr(buf_pos_);
  buf_.clear();
  buf_pos_ = 0;
  while (!eof_) {
    FSDP_CHECK(max_bytes < 0 || static_cast<int64_t>(out.size()) <= max_bytes, "data file '", path_, "' holds more than ",
               max_bytes, " bytes", compressed() ? " once decompressed" : "", ", more than fits in memory beside "
               "training — ", kTooLargeForMemoryFix);
    const size_t old = out.size();
    out.resize(old + kChunk);
    const size_t got = read(out.data() + old, kChunk);
    out.resize(old + got);
    if (got == 0) eof_ = true;
  }
  return out;
}

}  // namespace fsdp::data

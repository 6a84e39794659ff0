// POSIX file helpers for checkpoints: every failure throws fsdp::Failure
// naming the path, the operation and strerror(errno).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::checkpoint::io {

// An owned file descriptor.
class File {
 public:
  File() = default;
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // New file (truncated if it exists), write-only.
  static File create(const std::string& path);
  // Whether open_read follows a symbolic link at the path's last component.
  enum class Links {
    kFollow,  // a file the user named, or one of a model directory (the Hugging Face cache links its files)
    kRefuse,  // a file inside a checkpoint: its files are its own, never links to files elsewhere (issue 50)
  };
  static File open_read(const std::string& path, Links links = Links::kFollow);

  void write_all(const void* data, size_t n);
  // Reads exactly n bytes at `offset`; a short read (the file is shorter than
  // offset + n) throws Failure saying the file is truncated.
  void pread_all(void* out, size_t n, int64_t offset) const;
  void sync();   // fsync
  void close();  // checks close()'s result
  int64_t size() const;
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

 private:
  friend class MappedFile;
  int fd_ = -1;
  std::string path_;
};

// A read-only private mapping of a whole file; pages are read on first touch,
// so a reader that touches a byte range reads only (about) those bytes.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// fsync of a directory, so renames and new entries inside it are durable.
void fsync_dir(const std::string& dir);
// The whole file, read as File::open_read(path, links) reads it.
std::string read_text_file(const std::string& path, File::Links links);
// rename(2): atomic on one file system.
void rename_path(const std::string& from, const std::string& to);
// Moves directory `tmp` to `final` (same parent) and fsyncs the parent. An
// existing `final` is replaced atomically where the file system supports
// renameat2(RENAME_EXCHANGE), else moved aside to .old-<name> first; the
// previous contents are deleted afterwards. An existing .old-<name> is
// removed first only if it carries our marker (UsageError otherwise; see
// Note [Ownership of what we delete] in fsdp/checkpoint/ownership.h).
//
// Note [Marked until in place]. `tmp` carries the ownership marker from its
// creation, and the previous `final` is marked before it moves, so a kill at
// any instant leaves only marked temporaries (or an empty one) behind, which
// the next run removes. With keep_marker false the marker is removed from
// `final` last (an export: the directory is the user's to share); a kill just
// before leaves `final` with the marker, which check_export_dir accepts.
void replace_directory(const std::string& tmp, const std::string& final, bool keep_marker = true);
// Writes `text` to `path` and fsyncs it (not atomic by itself: callers write
// into a temporary directory that is renamed afterwards).
void write_text_file(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);

// Seconds on a monotonic clock.
double now_seconds();

}  // namespace fsdp::checkpoint::io

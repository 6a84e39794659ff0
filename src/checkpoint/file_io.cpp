#include "file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fsdp/checkpoint/ownership.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/remove.h"

namespace fsdp::checkpoint::io {
namespace {

[[noreturn]] void fail_errno(const char* op, const std::string& path) {
  const int e = errno;
  FSDP_FAIL("checkpoint I/O: ", op, " ", path, " failed: ", std::strerror(e),
            e == ENOSPC || e == EFBIG || e == EDQUOT
                ? " — the disk is full (or a quota or file-size limit is reached); free space or write elsewhere"
                : "");
}

}  // namespace

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

File File::create(const std::string& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) fail_errno("create", path);
  return f;
}

File File::open_read(const std::string& path, Links links) {
  File f;
  f.path_ = path;
  // O_NONBLOCK and the kind on the descriptor: a FIFO or a device planted in a
  // checkpoint or an --init-from directory is refused, never waited on or read
  // without end (Note [Input files] in common/files.h).
  const int nofollow = links == Links::kRefuse ? O_NOFOLLOW : 0;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | nofollow);
  if (f.fd_ < 0 && errno == ELOOP && links == Links::kRefuse) {
    FSDP_FAIL(path, " is a symbolic link: a checkpoint's files are its own, and one from elsewhere must not name a "
              "file of this machine; replace the link with the file that belongs there");
  }
  if (f.fd_ < 0) fail_errno("open", path);
  struct stat st {};
  FSDP_CHECK(::fstat(f.fd_, &st) == 0 && S_ISREG(st.st_mode), path, " is ", path_kind(path),
             ", not a regular file — replace it with the file that belongs there");
  ::fcntl(f.fd_, F_SETFL, ::fcntl(f.fd_, F_GETFL) & ~O_NONBLOCK);
  return f;
}

void File::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("write", path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void File::pread_all(void* out, size_t n, int64_t offset) const {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("read", path_);
    }
    if (r == 0) {
      FSDP_FAIL("checkpoint I/O: ", path_, " is truncated: needed bytes [", offset, ", ",
                offset + static_cast<int64_t>(n), ") but the file ends at ", offset + static_cast<int64_t>(done));
    }
    done += static_cast<size_t>(r);
  }
}

void File::sync() {
  if (::fsync(fd_) != 0) fail_errno("fsync", path_);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("close", path_);
}

int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_errno("stat", path_);
  return static_cast<int64_t>(st.st_size);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  File f = File::open_read(path);
  size_ = static_cast<size_t>(f.size());
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd_, 0);
  if (p == MAP_FAILED) fail_errno("mmap", path);
  data_ = static_cast<const uint8_t*>(p);  // the mapping outlives the descriptor
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail_errno("fsync directory", dir);
}

void rename_path(const std::string& from, const std::string& to) {
  if (const int e = rename_entry(from, to); e != 0) {
    FSDP_FAIL("checkpoint I/O: rename of ", from, " to ", to, " failed: ", std::strerror(e));
  }
}

void replace_directory(const std::string& tmp, const std::string& final, bool keep_marker) {
  namespace fs = std::filesystem;
  const fs::path f(final);
  const std::string parent = f.parent_path().empty() ? "." : f.parent_path().string();
  const EntryKind was = entry_kind(final);
  FSDP_CHECK(was != EntryKind::kOther, final, " exists and is not a directory; move it away or choose another path");
  if (was != EntryKind::kNone) {
    const std::string old = (f.parent_path() / (".old-" + f.filename().string())).string();
    remove_owned_directory(old);  // Note [Ownership of what we delete]: never a directory we did not create
    // The previous contents are ours (the caller checked): marked before they
    // move, so wherever a kill leaves them (.tmp-, .old-) they are recognisably
    // ours. A link (a checkpoint linked in from elsewhere) is replaced as a
    // link: nothing is written into, or removed from, what it points to
    // (Note [Removing without following links]).
    if (was == EntryKind::kDirectory && !is_owned_directory(final)) mark_owned(final);
    if (exchange_entries(tmp, final)) {
      rename_path(tmp, old);  // tmp now holds the previous entry
    } else {
      rename_path(final, old);
      rename_path(tmp, final);
    }
    fsync_dir(parent);
    discard_owned_directory(old);
  } else {
    rename_path(tmp, final);
  }
  if (!keep_marker) (void)remove_tree((f / kOwnedMarker).string());
  fsync_dir(parent);
}

void write_text_file(const std::string& path, const std::string& text) {
  File f = File::create(path);
  f.write_all(text.data(), text.size());
  f.sync();
  f.close();
}

std::string read_text_file(const std::string& path) { return read_text_file(path, File::Links::kFollow); }

std::string read_text_file(const std::string& path, File::Links links) {
  File f = File::open_read(path, links);
  const int64_t n = f.size();
  std::string s(static_cast<size_t>(n), '\0');
  if (n > 0) f.pread_all(s.data(), static_cast<size_t>(n), 0);
  return s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace fsdp::checkpoint::io

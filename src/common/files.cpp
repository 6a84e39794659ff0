#include "fsdp/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fsdp/common/error.h"

namespace fsdp {

namespace {

std::string size_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) return detail::cat(bytes >> 30, " GiB");
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) return detail::cat(bytes >> 20, " MiB");
  if (bytes >= 1024 && bytes % 1024 == 0) return detail::cat(bytes >> 10, " KiB");
  return detail::cat(bytes, " bytes");
}

// Reads from `fd` until the end of the file or `limit` bytes (then *more is
// set when at least one byte follows). Returns errno of a failure, else 0.
int read_up_to(int fd, std::string& out, size_t limit, bool* more) {
  char buf[65536];
  *more = false;
  for (;;) {
    const size_t room = limit - out.size();
    const ssize_t n = ::read(fd, buf, room + 1 < sizeof(buf) ? room + 1 : sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return 0;
    const size_t got = static_cast<size_t>(n);
    if (got > room) {
      out.append(buf, room);
      *more = true;
      return 0;
    }
    out.append(buf, got);
  }
}

}  // namespace

std::string path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return "a symbolic link to nothing";
    }
    return errno == ENOENT ? "nothing (it does not exist)" : std::string("unreadable (") + std::strerror(errno) + ")";
  }
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

void require_regular_file(const std::string& path, const std::string& what, const std::string& fix) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return;
  FSDP_CHECK(false, what, " ", path, " is ", path_kind(path), ", not a regular file — ", fix);
}

int open_input_file(const std::string& path, const std::string& what, const std::string& fix) {
  require_regular_file(path, what, fix);
  // O_NONBLOCK: had the path become a FIFO since the check, the open must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    FSDP_CHECK(false, what, " ", path, ": cannot open it (", std::strerror(e), ") — ", fix);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    FSDP_CHECK(false, what, " ", path, " changed into ", path_kind(path), " while it was opened, not a regular file — ",
               fix);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes,
                            const std::string& fix) {
  const int fd = open_input_file(path, what, fix);
  std::string text;
  bool more = false;
  const int e = read_up_to(fd, text, static_cast<size_t>(max_bytes), &more);
  ::close(fd);
  FSDP_CHECK(e == 0, what, " ", path, ": reading it failed (", std::strerror(e), ") — ", fix);
  FSDP_CHECK(!more, what, " ", path, " is larger than ", size_text(max_bytes), " — is it the right file? ", fix);
  return text;
}

std::string read_input_head(const std::string& path, const std::string& what, size_t n, const std::string& fix) {
  const int fd = open_input_file(path, what, fix);
  std::string text;
  bool more = false;
  const int e = read_up_to(fd, text, n, &more);
  ::close(fd);
  FSDP_CHECK(e == 0, what, " ", path, ": reading it failed (", std::strerror(e), ") — ", fix);
  return text;
}

std::string read_system_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  bool more = false;
  const int e = read_up_to(fd, text, static_cast<size_t>(kMaxSystemFileBytes), &more);
  ::close(fd);
  return e == 0 ? text : "";
}

}  // namespace fsdp

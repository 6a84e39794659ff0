#include "fsdp/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fsdp/common/error.h"

namespace fsdp {

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

namespace {

// Closes `fd` on every path out of write_file_atomically.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// write(2) of every byte (it may write fewer than asked); "" or the reason.
std::string write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    done += static_cast<size_t>(n);
  }
  return "";
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  // "" when the temporary file holds every byte on disk, else why not.
  const auto write_tmp = [&]() -> std::string {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) return std::string("creating ") + tmp + ": " + std::strerror(errno);
    if (std::string why = write_all(f.fd, bytes); !why.empty()) return why;
    if (::fsync(f.fd) != 0) return std::string("fsync: ") + std::strerror(errno);
    const int fd = f.fd;
    f.fd = -1;
    return ::close(fd) != 0 ? std::string("close: ") + std::strerror(errno) : std::string();
  };
  std::string why = write_tmp();
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    why = std::string("renaming ") + tmp + ": " + std::strerror(errno);
  }
  if (!why.empty()) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    FSDP_FAIL(what, " ", path, ": writing failed (", why, "); free space on its disk or choose another path");
  }
  // The rename is durable once the directory is: best effort (a directory
  // that cannot be opened for reading still holds the new file).
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace fsdp

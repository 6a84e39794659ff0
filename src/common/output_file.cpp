#include "fsdp/common/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/remove.h"

namespace fsdp {

namespace {

// Opens an existing device or FIFO for writing in place: never created,
// truncated or replaced. A FIFO is opened without blocking: ENXIO means no
// process reads it (a blocking open would wait for one forever).
int open_stream(const std::string& path, const std::string& flag, bool fifo) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) {
    const int e = errno;
    FSDP_CHECK(!(fifo && e == ENXIO), flag, " ", path, " is a FIFO (named pipe) that no process reads; start its "
               "reader first, or give a regular file");
    FSDP_CHECK(false, flag, " ", path, ": cannot open it for writing (", std::strerror(e), "); choose another path");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    ::close(fd);  // replaced meanwhile by something else: write nothing
    FSDP_FAIL(flag, " ", path, " changed while it was being opened; run again");
  }
  if (fifo) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a reader exists: writes may wait for it
  return fd;
}

// Writes all of `text` to `fd`; errno of the first failure, 0 on success.
int write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

[[noreturn]] void fail_write(const std::string& flag, const std::string& path, int e) {
  FSDP_FAIL(flag, " ", path, ": writing failed (", std::strerror(e), "); ",
            e == ENOSPC || e == EFBIG || e == EDQUOT ? "free space on its disk or choose another path"
                                                    : "choose another path");
}

}  // namespace

OutputTarget check_output_target(const std::string& path, const std::string& flag) {
  FSDP_CHECK(!path.empty(), flag, " needs a file name");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    // Missing (or unreachable: the directory checks name that): a new file.
    return OutputTarget::kNew;
  }
  if (::stat(path.c_str(), &st) != 0) {
    FSDP_CHECK(false, flag, " ", path, " is ", path_kind(path), "; writing through it would create a file "
               "elsewhere — remove the link or give another path");
  }
  if (S_ISREG(st.st_mode)) return OutputTarget::kRegular;
  if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return OutputTarget::kStream;
  FSDP_CHECK(false, flag, " ", path, " is ", path_kind(path), ", not a file; ",
             S_ISDIR(st.st_mode) ? "give a file name (in that directory, for example)"
                                 : "it is never written over — give a regular file's path");
  return OutputTarget::kNew;
}

bool may_write_beside(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return true;  // to be created: a regular file
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void write_output_file(const std::string& path, const std::string& text, const std::string& flag) {
  const OutputTarget target = check_output_target(path, flag);
  if (target == OutputTarget::kStream) {
    struct stat st {};
    const bool fifo = ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
    const int fd = open_stream(path, flag, fifo);
    const int e = write_all(fd, text);
    if (::close(fd) != 0 && e == 0) fail_write(flag, path, errno);
    if (e != 0) fail_write(flag, path, e);
    return;
  }
  // A link to a regular file: replace that file, keep the link.
  std::string real = path;
  if (target == OutputTarget::kRegular) {
    std::error_code ec;
    const auto canonical = std::filesystem::canonical(path, ec);
    if (!ec) real = canonical.string();
  }
  const std::string tmp = real + ".tmp-fsdp-" + std::to_string(::getpid());
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0 && S_ISREG(st.st_mode)) (void)remove_tree(tmp);  // a crashed run of this pid's
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    FSDP_CHECK(e != EEXIST, flag, " ", path, ": its temporary ", tmp, " exists and is not a regular file; "
               "remove it or choose another path");
    FSDP_CHECK(false, flag, " ", path, ": cannot create the file (", std::strerror(e), " for ", tmp,
               "); choose a path in a directory you can write to");
  }
  int e = write_all(fd, text);
  if (e == 0 && ::fsync(fd) != 0 && errno != EINVAL) e = errno;
  if (::close(fd) != 0 && e == 0) e = errno;
  if (e == 0) e = rename_entry(tmp, real);
  if (e != 0) {
    (void)remove_tree(tmp);  // created by this call (O_EXCL): ours to remove
    fail_write(flag, path, e);
  }
  // The rename is durable once the directory is: best effort (a directory
  // that cannot be opened for reading still holds the new file).
  const std::filesystem::path parent = std::filesystem::path(real).parent_path();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

OutputTarget check_output_writable(const std::string& path, const std::string& flag) {
  const OutputTarget target = check_output_target(path, flag);
  if (target == OutputTarget::kStream) return target;
  std::string real = path;
  if (target == OutputTarget::kRegular) {
    std::error_code ec;
    const auto canonical = std::filesystem::canonical(path, ec);
    if (!ec) real = canonical.string();
  }
  const std::filesystem::path parent = std::filesystem::path(real).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  struct stat st {};
  FSDP_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), flag, " ", path, ": its directory ", dir, " is ",
             path_kind(dir), ", not a directory — create it first or give another path");
  FSDP_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, flag, " ", path, ": its directory ", dir,
             " is not writable (", std::strerror(errno), ") — give a path in a directory you can write to");
  return target;
}

std::string write_derived_output_file(const std::string& path, const std::string& text, const std::string& flag,
                                      const std::string& marker, const std::string& never) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    struct stat target {}, other {};
    if (::stat(path.c_str(), &target) != 0 || !S_ISREG(target.st_mode)) {
      return detail::cat(path, " is ", path_kind(path), ", not a copy fsdp-cpp wrote: left alone");
    }
    if (!never.empty() && ::stat(never.c_str(), &other) == 0 && other.st_dev == target.st_dev &&
        other.st_ino == target.st_ino) {
      return detail::cat(path, " is the file the options were read from: left alone");
    }
    std::string head;
    try {
      head = read_input_head(path, flag, marker.size(), "");
    } catch (const UsageError&) {
      return detail::cat(path, " cannot be read: left alone");
    }
    if (head != marker) {
      return detail::cat(path, " exists and was not written by fsdp-cpp (it does not start with '", marker,
                         "'): left alone — move it away to get the copy");
    }
  }
  write_output_file(path, text, flag);
  return "";
}

int open_output_fd(const std::string& path, const std::string& flag, StreamMode mode) {
  const OutputTarget target = check_output_target(path, flag);
  if (target == OutputTarget::kStream) {
    FSDP_CHECK(mode != StreamMode::kCreateNew, flag, " ", path, " exists (", path_kind(path),
               "); a new file is needed — give another path");
    struct stat st {};
    return open_stream(path, flag, ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode));
  }
  FSDP_CHECK(mode != StreamMode::kCreateNew || target == OutputTarget::kNew, flag, " ", path,
             " exists; a new file is needed — give another path");
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == StreamMode::kCreateNew ? O_EXCL : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int e = errno;
    FSDP_CHECK(e != EEXIST, flag, " ", path, " appeared while it was being created; give another path");
    FSDP_CHECK(false, flag, " ", path, ": cannot create it (", std::strerror(e),
               "); choose a path in a directory you can write to");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    FSDP_FAIL(flag, " ", path, " changed while it was being opened; run again");
  }
  return fd;
}

void open_output_for_append(std::ofstream& out, const std::string& path, const std::string& flag) {
  const OutputTarget target = check_output_target(path, flag);
  int held = -1;  // a FIFO's write end, held while `out` opens: its reader sees no end of file meanwhile
  if (target == OutputTarget::kStream) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) held = open_stream(path, flag, /*fifo=*/true);
  }
  errno = 0;
  out.open(path, std::ios::app);
  const int e = errno;
  if (held >= 0) ::close(held);
  if (!out.is_open()) {
    FSDP_FAIL(flag, " ", path, ": cannot open it for appending (", e != 0 ? std::strerror(e) : "stream error",
              "); choose another path");
  }
}

}  // namespace fsdp

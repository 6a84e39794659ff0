#include "fsdp/checkpoint/ownership.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "file_io.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/remove.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMarkerText =
    "This directory was created by fsdp-cpp to be renamed or deleted (a save or an export in progress, or left by "
    "an interrupted one). fsdp-cpp removes it when needed; it never removes a directory without this file.\n";

std::string refusal(const std::string& path) {
  return detail::cat(path, " exists but was not created by fsdp-cpp (it has no ", kOwnedMarker,
                     " file), so it is never deleted or overwritten; the program needs this name for a temporary "
                     "directory: move or delete ", path, " by hand and run again");
}

// Nothing but (perhaps) a marker being written: what a crash between creating
// a directory and marking it leaves. Removing it loses nothing.
bool holds_nothing(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != kOwnedMarker) return false;
  }
  return !ec;
}

}  // namespace

void create_owned_directory(const std::string& path) {
  std::error_code ec;
  if (!fs::create_directory(path, ec)) {
    FSDP_FAIL("cannot create directory ", path, ": ", ec ? ec.message() : std::string("it already exists"));
  }
  mark_owned(path);
}

void mark_owned(const std::string& path) {
  // Never through a link: the marker would land in the directory it points to,
  // which is not ours (Note [Removing without following links]).
  FSDP_ASSERT(entry_kind(path) == EntryKind::kDirectory, "mark_owned(", path, "): not a directory of ours");
  io::write_text_file((fs::path(path) / kOwnedMarker).string(), kMarkerText);
}

bool is_owned_directory(const std::string& path) {
  return entry_kind(path) == EntryKind::kDirectory && entry_kind((fs::path(path) / kOwnedMarker).string()) ==
                                                           EntryKind::kOther;
}

void check_removable(const std::string& path) {
  std::error_code ec;
  const EntryKind kind = entry_kind(path);
  if (kind == EntryKind::kNone) return;
  if (kind == EntryKind::kDirectory && (is_owned_directory(path) || holds_nothing(path))) return;
  // Gone meanwhile: another rank's remove_owned_directory finished.
  FSDP_CHECK(!fs::exists(fs::symlink_status(path, ec)), refusal(path));
}

void remove_owned_directory(const std::string& path) {
  check_removable(path);
  // The marker goes last, so that whoever looks meanwhile (another rank
  // checking the directory at start-up) sees a marked or an empty directory.
  if (const std::string why = remove_tree(path, kOwnedMarker); !why.empty()) {
    FSDP_FAIL("cannot remove ", path, ": ", why, "; remove it by hand");
  }
}

bool discard_owned_directory(const std::string& path) noexcept {
  return remove_tree(path, kOwnedMarker).empty();  // a link: only the link
}

void check_writable(const std::string& path, const std::string& flag, bool directory) {
  FSDP_CHECK(!path.empty(), flag, " needs a path");
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  const bool exists = fs::exists(p, ec);
  FSDP_CHECK(!exists || !directory || fs::is_directory(p, ec), flag, " ", path,
             " exists and is not a directory; choose another path");
  fs::path probe = p;
  while (!fs::exists(probe, ec) && probe.has_parent_path() && probe.parent_path() != probe) probe = probe.parent_path();
  if (!exists) {
    FSDP_CHECK(fs::is_directory(probe, ec), flag, " ", path, " cannot be created: ", probe.string(),
               " is not a directory; choose a path in a directory you can write to");
  }
  const int mode = fs::is_directory(probe, ec) ? (W_OK | X_OK) : W_OK;
  if (::access(probe.c_str(), mode) != 0) {
    const int e = errno;
    if (exists) {
      FSDP_CHECK(false, flag, " ", path, " is not writable (", std::strerror(e),
                 "); fix its permissions or choose another path");
    }
    FSDP_CHECK(false, flag, " ", path, " cannot be created: directory ", probe.string(), " is not writable (",
               std::strerror(e), "); choose a path in a directory you can write to");
  }
  // access() says yes to root everywhere and knows nothing of /proc, sysfs or a
  // full inode table: create an entry there and remove it again.
  if (fs::is_directory(probe, ec)) {
    std::string name = (probe / ".fsdp-write-probe-XXXXXX").string();
    if (::mkdtemp(name.data()) == nullptr) {
      const int e = errno;
      FSDP_CHECK(false, flag, " ", path, exists ? " is not writable" : " cannot be created", ": creating an entry in ",
                 probe.string(), " fails (", std::strerror(e), "); choose a path in a directory you can write to");
    }
    (void)remove_tree(name);  // the empty probe this call made
  }
}

DirectoryLock::DirectoryLock(const std::string& lock_path, const std::string& what) : path_(lock_path) {
  // The file is removed on release, so a file we opened may be unlinked (and
  // a new one created) between our open and our flock: retry until the lock
  // we hold is on the file the path names.
  for (;;) {
    // Never through a link, never a device or FIFO (Note [Output targets]): the
    // lock file is written and, on release, removed.
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int e = errno;
      FSDP_CHECK(e != ELOOP, what, ": its lock file ", lock_path, " is a symbolic link, which fsdp-cpp never "
                 "writes through; remove it (fsdp-cpp creates the lock file itself)");
      FSDP_CHECK(false, what, ": cannot create the lock file ", lock_path, " (", std::strerror(e),
                 "); choose a directory you can write to");
    }
    struct stat opened {};
    if (::fstat(fd_, &opened) != 0 || !S_ISREG(opened.st_mode)) {
      ::close(fd_);
      fd_ = -1;
      FSDP_CHECK(false, what, ": its lock file ", lock_path, " is ", path_kind(lock_path), ", not a regular file; "
                 "fsdp-cpp never writes or removes it — move it away (fsdp-cpp creates the lock file itself)");
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      std::string holder;
      try {
        holder = io::read_text_file(lock_path);
      } catch (const std::exception&) {
      }
      while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
      ::close(fd_);
      fd_ = -1;
      FSDP_CHECK(e != EWOULDBLOCK, what, " is in use by another fsdp-cpp process (",
                 holder.empty() ? std::string("pid unknown") : holder, "; lock file ", lock_path,
                 "); wait for it to finish or stop it, or choose another directory");
      FSDP_FAIL(what, ": cannot lock ", lock_path, ": ", std::strerror(e));
    }
    struct stat held {};
    struct stat named {};
    if (::fstat(fd_, &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      break;
    }
    ::close(fd_);
    fd_ = -1;
  }
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const std::string text = detail::cat("pid ", ::getpid(), " on host ", host, "\n");
  // Best effort: the lock is what counts, the text only names its holder.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t w = ::pwrite(fd_, text.data(), text.size(), 0);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // While locked: no other process holds a lock on this file. Only the file we
  // locked is removed, never what replaced it meanwhile.
  struct stat held {};
  struct stat named {};
  if (::fstat(fd_, &held) == 0 && ::lstat(path_.c_str(), &named) == 0 && S_ISREG(named.st_mode) &&
      held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
    (void)remove_tree(path_);
  }
  ::close(fd_);
}

}  // namespace fsdp::checkpoint

#include "fsdp/common/remove.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace fsdp {
namespace {

// Deeper trees are not ours (a checkpoint is two levels deep): refused, not walked.
constexpr int kMaxTreeDepth = 256;

std::string failed(const std::string& shown, int e) { return shown + ": " + std::strerror(e); }

bool remove_at(int dirfd, const std::string& name, const std::string& shown, int depth, const std::string& last,
               std::string& why);

// Removes every entry of the open directory `fd` but `keep`, then `last`.
bool empty_at(int fd, const std::string& shown, int depth, const std::string& keep, const std::string& last,
              std::string& why) {
  const int listing = ::dup(fd);
  if (listing < 0) {
    why = failed(shown, errno);
    return false;
  }
  DIR* d = ::fdopendir(listing);
  if (d == nullptr) {
    why = failed(shown, errno);
    ::close(listing);
    return false;
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != ".." && n != keep && n != last) names.push_back(n);
  }
  const int read_error = errno;
  ::closedir(d);
  if (read_error != 0) {
    why = failed(shown, read_error);
    return false;
  }
  for (const std::string& n : names) {
    if (!remove_at(fd, n, shown + "/" + n, depth + 1, "", why)) return false;
  }
  return last.empty() || last == keep || remove_at(fd, last, shown + "/" + last, depth + 1, "", why);
}

bool remove_at(int dirfd, const std::string& name, const std::string& shown, int depth, const std::string& last,
               std::string& why) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return true;
    why = failed(shown, errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {  // a file, a link (as a link), a node
    if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      why = failed(shown, errno);
      return false;
    }
    return true;
  }
  if (depth >= kMaxTreeDepth) {
    why = shown + ": directories nested deeper than " + std::to_string(kMaxTreeDepth) + " levels";
    return false;
  }
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return true;
    if (e == ELOOP || e == ENOTDIR) return remove_at(dirfd, name, shown, depth + 1, last, why);  // swapped meanwhile
    why = failed(shown, e);
    return false;
  }
  const bool emptied = empty_at(fd, shown, depth, "", last, why);
  ::close(fd);
  if (!emptied) return false;
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    why = failed(shown, errno);
    return false;
  }
  return true;
}

}  // namespace

EntryKind entry_kind(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return EntryKind::kNone;
  if (S_ISLNK(st.st_mode)) return EntryKind::kLink;
  if (S_ISDIR(st.st_mode)) return EntryKind::kDirectory;
  return EntryKind::kOther;
}

std::string remove_tree(const std::string& path, const std::string& last) noexcept {
  try {
    std::string why;
    return remove_at(AT_FDCWD, path, path, 0, last, why) ? std::string() : why;
  } catch (const std::exception& e) {  // std::bad_alloc from a name
    return path + ": " + e.what();
  }
}

std::string remove_contents(const std::string& dir, const std::string& keep) noexcept {
  try {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;  // ELOOP, or ENOTDIR where O_DIRECTORY is checked first
      return entry_kind(dir) == EntryKind::kLink
                 ? dir + " is a symbolic link, which is never followed to remove what it points to"
                 : failed(dir, e);
    }
    std::string why;
    const bool ok = empty_at(fd, dir, 0, keep, "", why);
    ::close(fd);
    return ok ? std::string() : why;
  } catch (const std::exception& e) {
    return dir + ": " + e.what();
  }
}

int rename_entry(const std::string& from, const std::string& to) noexcept {
  return std::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

bool exchange_entries(const std::string& a, const std::string& b) noexcept {
#ifdef RENAME_EXCHANGE
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
#else
  (void)a;
  (void)b;
  return false;
#endif
}

}  // namespace fsdp

// What fsdp-cpp may delete, and who may write a directory.
//
// Note [Ownership of what we delete] (issue 16): the program deletes or
// replaces only what it can tell it created.
//  - A directory it creates only to rename or delete later (.tmp-<name>,
//    .old-<name>, .del-<name> beside a checkpoint or an export) holds the
//    marker file kOwnedMarker from right after its creation. One that exists
//    without the marker (a user's, or another program's) is never removed
//    unless it is empty: the operation is refused with a UsageError naming
//    the path.
//  - A checkpoint is a step_N directory holding manifest.json; a step_N
//    directory without one is never overwritten or deleted
//    (checkpoint/sharded.h).
//  - One writer per directory: a DirectoryLock (flock(2) on a lock file) on
//    --checkpoint-dir for a whole training run, and on an --export-hf target
//    while it is written. A second run is refused, naming the holder's pid.
#pragma once

#include <string>

namespace fsdp::checkpoint {

// The marker file's name inside a directory of ours.
inline constexpr const char* kOwnedMarker = ".fsdp-cpp-owned";

// Creates directory `path` (which must not exist; its parent must) and puts
// the marker in it.
void create_owned_directory(const std::string& path);
// Puts the marker into the existing directory `path` (which this program
// recognises as its own by other means, e.g. a checkpoint's manifest).
void mark_owned(const std::string& path);
bool is_owned_directory(const std::string& path);
// Removes `path` with everything in it if it is a directory holding the
// marker, or an empty one (what a crash right after creating it leaves:
// removing it loses nothing); nothing if it does not exist. UsageError naming
// it, saying to move or delete it by hand, otherwise.
void remove_owned_directory(const std::string& path);
// The same check without removing anything: UsageError unless `path` is
// absent, a directory holding the marker, or an empty directory.
void check_removable(const std::string& path);
// Removes directory `path`, which this process created marked (or marked
// itself), the marker last: a kill at any instant leaves a marked or an empty
// directory, which the next run removes (fs::remove_all removes in no set
// order and could leave files without the marker, blocking every later run).
// Never throws; false when something could not be removed.
bool discard_owned_directory(const std::string& path) noexcept;

// UsageError naming `flag` and `path` unless this process can write `path`
// (a directory when `directory`, else a file): an existing one must be
// writable (and of that kind when a directory); for a missing one, the
// nearest existing ancestor must be a writable directory (it is created
// there later).
void check_writable(const std::string& path, const std::string& flag, bool directory);

// An exclusive lock on a lock file, taken without waiting. The holder's pid
// and host are written into the file; the file is removed on release. The
// kernel releases the lock when the holder dies, so a crash leaves no stale
// lock.
class DirectoryLock {
 public:
  // Locks `lock_path` (created if missing; its directory must exist).
  // UsageError when another process holds it: names `what` (the user's flag
  // and path, e.g. "--checkpoint-dir ck"), the holder's pid when known, and
  // the lock file.
  DirectoryLock(const std::string& lock_path, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace fsdp::checkpoint

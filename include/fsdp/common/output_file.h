// Files fsdp-cpp writes at a path the user names (--profile-file,
// --metrics-file and the configuration copy beside it, the files of
// --tensorboard, fsdp-inspect --write-hf-config).
//
// Note [Output targets]
// A writer never renames over, truncates, replaces or removes anything that is
// not a regular file: a device node or a FIFO given as an output (/dev/null to
// discard it, /dev/stdout, a named pipe another program reads) is written in
// place, and nothing is created beside it. What is already at the path decides:
//  - nothing, or a regular file (a symbolic link to one: that file): written
//    completely to a new temporary beside it (O_EXCL, a name only this
//    process makes: "<name>.tmp-fsdp-<pid>"), then renamed over it, so a
//    reader or a crash sees the old file or the new one, never half;
//  - a character device or a FIFO: opened for writing as it is (no O_CREAT,
//    no O_TRUNC, never renamed or removed); a FIFO nobody reads is an error,
//    not a wait;
//  - a directory, a block device, a socket or a dangling symbolic link:
//    refused, naming the flag, the path and what it is.
// Write errors (a full disk, /dev/full) are Failures naming the flag and path.
#pragma once

#include <fstream>
#include <string>

namespace fsdp {

// What an output path names now.
enum class OutputTarget {
  kNew,      // nothing there: created as a regular file
  kRegular,  // a regular file (or a link to one): replaced atomically
  kStream,   // a character device or a FIFO: written in place
};

// UsageError naming `flag` and `path` when it names something a writer may
// not write (see the Note); else what it is. Checks nothing about the
// directory (checkpoint::check_writable does).
OutputTarget check_output_target(const std::string& path, const std::string& flag);

// Whether files may be put beside `path` (e.g. metrics.config.toml beside
// --metrics-file metrics.jsonl): only when it is or will be a regular file,
// never beside /dev/null or a FIFO.
bool may_write_beside(const std::string& path);

// Writes `text` as the whole content of `path` by the Note's rules.
// UsageError for a target that may not be written, Failure for a write error
// (or a FIFO without a reader); both name `flag` and `path`.
void write_output_file(const std::string& path, const std::string& text, const std::string& flag);

// Opens `out` to append to `path` by the Note's rules (a regular file is
// appended to, never truncated; a device or FIFO written in place; a FIFO
// without a reader is refused instead of blocking). UsageError / Failure as
// write_output_file.
void open_output_for_append(std::ofstream& out, const std::string& path, const std::string& flag);

}  // namespace fsdp

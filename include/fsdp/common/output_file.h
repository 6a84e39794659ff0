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
//
// Derived names: a file whose name the program makes from another (the
// configuration copy metrics.config.toml beside --metrics-file metrics.jsonl,
// config.toml in the --tensorboard directory) is the program's only when
// nothing is there yet or what is there is recognisably its own (it starts
// with the program's marker line); a user's file of that name, a device node
// or the file the run read its options from (--config) is left alone, and the
// run says so (issue 39). docs/checkpoints.md: fsdp-train overwrites only
// what it created.
//
// This is the one writer: tests/common/test_file_access.py holds the sources
// to it (no other code opens a file for writing or renames over one).
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

// check_output_target, and that a new or replaced file can be made beside
// `path` (its directory exists and is writable): before hours of work whose
// result goes there. UsageError naming `flag` and the path.
OutputTarget check_output_writable(const std::string& path, const std::string& flag);

// Writes the derived file `path` (see Derived names) when nothing is there or
// it starts with `marker`, and it is not the file `never` ("" : none). Returns
// "" when written, else why it was left alone (for a warning). Write errors as
// write_output_file.
std::string write_derived_output_file(const std::string& path, const std::string& text, const std::string& flag,
                                      const std::string& marker, const std::string& never);

// How open_output_fd treats what is at the path (see the Note for devices and FIFOs).
enum class StreamMode {
  kCreateNew,  // only a new file (O_EXCL): UsageError when anything is there
  kTruncate,   // a new file, or a regular file (or a link to one) emptied in place: a log restarted
};

// Opens `path` for a stream of writes (a log, an event file) by the Note's
// rules and `mode`; returns the descriptor (O_CLOEXEC), which the caller
// closes. UsageError / Failure as write_output_file.
int open_output_fd(const std::string& path, const std::string& flag, StreamMode mode);

// Opens `out` to append to `path` by the Note's rules (a regular file is
// appended to, never truncated; a device or FIFO written in place; a FIFO
// without a reader is refused instead of blocking). UsageError / Failure as
// write_output_file.
void open_output_for_append(std::ofstream& out, const std::string& path, const std::string& flag);

}  // namespace fsdp

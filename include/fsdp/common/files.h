// What a path names, before a program opens it for reading; and the one
// reader of the files a user names.
//
// Note [Input files]
// Every file fsdp-cpp reads because a user named it (a flag, a config key, a
// file found in a directory the user named) is opened here, and only here:
//  - it must be a regular file (symbolic links followed): a device
//    (/dev/zero), a FIFO without a writer or a socket would make a reader grow
//    without end or block forever, so they are refused up front, by name and
//    kind — the kind is checked before the open (a FIFO would block the open)
//    and again on the descriptor (the path may change in between);
//  - a whole-file read has a size limit per kind of file (kMax*Bytes below),
//    counted while reading, so a file that grows meanwhile is refused too;
//  - errors are UsageErrors naming what the file is for (the flag or the
//    role), the path, what is wrong and what to give instead.
// Files under /proc and /sys that the programs read about themselves go
// through the same reader. Writing is output_file.h's (Note [Output targets]).
// tests/common/test_file_access.py holds the sources to both: no other code
// opens a file for writing, renames over one, or opens one for reading.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fsdp {

// Size limits of whole-file reads, per kind of file.
inline constexpr int64_t kMaxJsonConfigBytes = int64_t{16} << 20;   // config.json, a cluster file, a manifest
inline constexpr int64_t kMaxTokenizerBytes = int64_t{1} << 30;     // tokenizer.json, tokenizer.model, sp.model
inline constexpr int64_t kMaxMetricsFileBytes = int64_t{4} << 30;   // --metrics-file read back on --resume
inline constexpr int64_t kMaxSystemFileBytes = int64_t{1} << 20;    // /proc and /sys

// "a regular file", "a directory", "a character device", "a block device",
// "a FIFO (named pipe)", "a socket", "a symbolic link" (only when dangling:
// links are followed), "nothing (it does not exist)".
std::string path_kind(const std::string& path);

// Throws UsageError unless `path` is a regular file (symbolic links followed):
//   "<what> <path> is a character device, not a regular file — <fix>"
// `what` names the flag or file role ("--data", "tokenizer file"); `fix` says
// what to give instead.
void require_regular_file(const std::string& path, const std::string& what, const std::string& fix);

// Opens regular file `path` for reading (Note [Input files]) and returns its
// descriptor (O_CLOEXEC, blocking reads), which the caller closes. UsageError
// as require_regular_file, or naming the open's error.
int open_input_file(const std::string& path, const std::string& what, const std::string& fix);

// The whole of regular file `path`, at most `max_bytes` (UsageError beyond:
// "<what> <path> is larger than <limit>; <fix>").
std::string read_input_file(const std::string& path, const std::string& what, int64_t max_bytes,
                            const std::string& fix);

// At most the first `n` bytes of regular file `path` (sniffing a format).
std::string read_input_head(const std::string& path, const std::string& what, size_t n, const std::string& fix);

// A file of the system's about this process or machine (/proc, /sys), "" when
// it cannot be read (absent on this kernel, not permitted).
std::string read_system_file(const std::string& path);

}  // namespace fsdp

// What a path names, before a program opens it for reading; and writing a
// file so that nothing a user saved is ever half-written.
//
// Inputs (data, tokenizers, model configs) must be regular files: a device
// (/dev/zero), a FIFO without a writer or a socket would make a reader grow
// without end or block forever, so they are refused up front, by name and kind.
#pragma once

#include <string>
#include <string_view>

namespace fsdp {

// "a regular file", "a directory", "a character device", "a block device",
// "a FIFO (named pipe)", "a socket", "a symbolic link" (only when dangling:
// links are followed), "nothing (it does not exist)".
std::string path_kind(const std::string& path);

// Throws UsageError unless `path` is a regular file (symbolic links followed):
//   "<what> <path> is a character device, not a regular file — <fix>"
// `what` names the flag or file role ("--data", "tokenizer file"); `fix` says
// what to give instead.
void require_regular_file(const std::string& path, const std::string& what, const std::string& fix);

}  // namespace fsdp

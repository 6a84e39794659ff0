// Removing and renaming directory entries without ever following a link.
//
// Note [Removing without following links] (issue 50)
// Every deletion and rename fsdp-cpp makes goes through this file:
// tests/common/test_file_access.py holds the sources to it. A symbolic link,
// wherever it is met — the path itself or an entry below it — is removed as a
// link: nothing it points to is read, written or removed. (A user who links a
// base checkpoint into a fresh --checkpoint-dir to resume from it must find
// the base intact after --keep-last prunes the link.) Directories are walked
// through descriptors opened with O_NOFOLLOW | O_DIRECTORY, one level at a
// time (openat/unlinkat), so a directory swapped for a link while it is being
// emptied is not followed either. rename(2) moves the entry itself (a link
// stays a link), so renames need no such care; they are here so that one
// file holds every call that makes a name disappear.
#pragma once

#include <string>

namespace fsdp {

// The kind of the entry `path` names, without following a final link.
enum class EntryKind { kNone, kLink, kDirectory, kOther };
EntryKind entry_kind(const std::string& path) noexcept;

// Removes `path`: a link or a file is unlinked; a directory is emptied and
// removed, the entry named `last` inside it (if given and present) removed
// after everything else (an ownership marker: a kill at any instant leaves
// the marker with whatever is left). Nothing there is success. Returns "" on
// success, else one line saying what could not be removed and why (errno's
// text); what could be removed is gone.
std::string remove_tree(const std::string& path, const std::string& last = "") noexcept;

// Removes everything inside directory `dir` (never a link: that is an error)
// except the entry named `keep` ("" : none). Returns "" or the reason, as remove_tree.
std::string remove_contents(const std::string& dir, const std::string& keep) noexcept;

// rename(2) of the entry `from` to `to` (replacing what `to` names, a link
// as a link). Returns 0 or the errno value.
int rename_entry(const std::string& from, const std::string& to) noexcept;

// Swaps the entries `a` and `b` atomically (renameat2 RENAME_EXCHANGE, Linux
// 3.15 and later); false where the system cannot.
bool exchange_entries(const std::string& a, const std::string& b) noexcept;

}  // namespace fsdp

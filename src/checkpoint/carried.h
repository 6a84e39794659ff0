// Note [Carried files] (issue 50): the small files a checkpoint takes along,
// read and written (internal to the checkpoint layer; CarriedFile in
// fsdp/checkpoint/types.h is the public side).
//
// A run's --export-hf copies its tokenizer and generation files into the
// export; a conversion of one of its checkpoints, long after the run, must
// write the same. A checkpoint used to record where those files lay (absolute
// paths), so a checkpoint from elsewhere could name any file of this machine
// and have the conversion copy it into a model the user then shares. Now the
// checkpoint holds copies: rank 0 writes each into the checkpoint's carried/
// directory when it saves, and a reader returns only those copies —
//  - names are single path components (no '/', no leading '.'), at most 255 bytes;
//  - each copy is a regular file, never a link (opened O_NOFOLLOW);
//  - in a checkpoint of ours, its size and CRC-32C are the manifest's
//    ("carried": [{"name", "size", "crc32c"}]); a DCP directory written by
//    save_dcp has no manifest: what carried/ holds is taken as it is.
// Anything else is a damaged checkpoint.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/checkpoint/types.h"

namespace fsdp::checkpoint {

inline constexpr const char* kCarriedDir = "carried";

// Whether `name` may name a carried file (see the Note).
bool is_carried_name(const std::string& name);
// Whether `name` is one entry of a directory (DCP's .metadata included): no
// '/', not "." or "..", not empty.
bool is_entry_name(const std::string& name);

// Copies `files` into `dir`/carried/ (created; `dir` is a directory being
// saved, ours) and returns the manifest's list of them. A file's snapshot
// (CarriedFile::content) is written when it has one; otherwise its source is
// read by the bounded input reader (the user named it: a tokenizer file),
// UsageError naming the file when it cannot be read.
nlohmann::json write_carried_files(const std::string& dir, const std::vector<CarriedFile>& files);

// The carried files of checkpoint directory `dir` (named `checkpoint` in
// errors): those `listed` names (the manifest's list; null: whatever
// carried/ holds), each checked as the Note says. DamagedCheckpoint otherwise.
std::vector<CarriedFile> read_carried_files(const std::filesystem::path& dir, const nlohmann::json* listed,
                                            const std::string& checkpoint);

}  // namespace fsdp::checkpoint

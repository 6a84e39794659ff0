// A sharded checkpoint's manifest.json and manifest.crc32c, read and checked
// (internal to the checkpoint layer; sharded.h describes the format). Apart
// from the shard-file payload so that the reader links without the engine: the fuzz
// target tests/fuzz/fuzz_checkpoint_manifest.cpp drives parse_manifest.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fsdp/common/state.h"

namespace fsdp::checkpoint {

constexpr const char* kFormat = "fsdp-cpp/sharded-checkpoint";
constexpr int kVersion = 2;         // written; 1 is read too (sharded.h)
constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestCrc = "manifest.crc32c";

struct SavedSection {
  int64_t unit = 0;
  std::string kind;
  at::ScalarType dtype = at::kFloat;
  int64_t elem_size = 4;
  int64_t flat_begin = 0;
  int64_t numel = 0;
  int64_t offset = 0;
};

struct SavedFile {
  std::string name;
  std::string path;
  int64_t size = 0;
  std::vector<uint32_t> blocks;
  std::vector<SavedSection> sections;
};

struct SavedParam {
  int64_t unit = 0;
  std::vector<int64_t> shape;
  int64_t flat_offset = 0;
  int64_t numel = 0;
};

struct Manifest {
  nlohmann::json json;   // as saved
  nlohmann::json state;  // the owners' metadata by key (version 1 translated); an object
  int64_t step = 0;
  int64_t block_size = 0;
  std::vector<SavedFile> files;
  std::map<std::string, SavedParam> params;
  std::set<std::string> kinds;
};

// 8 lowercase hex digits.
std::string hex32(uint32_t v);
// Per-block checksums travel in the manifest as base64 of their little-endian bytes.
std::string encode_words(const std::vector<uint32_t>& words);

// Hands `owner` its saved metadata (StateOwner::load_state_metadata). What the
// owner finds malformed (MalformedState) is damage of the checkpoint: a
// DamagedCheckpoint naming `checkpoint`, `file` and the owner's key.
void hand_saved_state(StateOwner& owner, const nlohmann::json& saved, const std::string& checkpoint,
                      const std::string& file);

// Reads `dir`/manifest.json, checks it against manifest.crc32c and parses it.
// Throws DamagedCheckpoint naming the checkpoint (dir's name) and the file.
Manifest read_manifest(const std::filesystem::path& dir);
// Parses and checks the text of checkpoint `dir`'s manifest.json (shard file
// paths are dir/name). Throws DamagedCheckpoint for anything malformed.
Manifest parse_manifest(const std::string& text, const std::filesystem::path& dir);

}  // namespace fsdp::checkpoint

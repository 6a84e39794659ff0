// What every checkpoint room shares: the damage error, the I/O count and the
// carried files. The step_N protocol (sharded.h) and its payloads (our shard
// files, dcp.h) both name these, so they live below both: dcp.h includes this
// header, never sharded.h (Note [Checkpoint payloads] in src/checkpoint/payload.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/common/error.h"

namespace fsdp::checkpoint {

// A checkpoint that cannot be used: names the checkpoint and the file.
class DamagedCheckpoint : public Failure {
 public:
  // The message names `checkpoint`, `file` and says `why`.
  DamagedCheckpoint(const std::string& checkpoint, const std::string& file, const std::string& why);
  const std::string& checkpoint() const { return checkpoint_; }  // the checkpoint directory
  const std::string& file() const { return file_; }              // the damaged file in it

 private:
  std::string checkpoint_;
  std::string file_;
};

// The size and duration of a collective save or load.
struct IoStats {
  int64_t bytes = 0;     // read or written, summed over all ranks
  double seconds = 0;    // wall time of the whole collective operation
  // bytes / seconds, in GB/s (0 when no time passed).
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

// A small file a checkpoint takes along (Note [Carried files] in
// src/checkpoint/carried.h): the run's tokenizer and generation files, so that
// a conversion of the checkpoint exports what the run's own --export-hf would
// have. Saved into the checkpoint's carried/ directory; a loaded checkpoint
// names only its own copies (regular files inside it, checksummed).
struct CarriedFile {
  std::string path;  // saving: the file to copy; loaded: its copy inside the checkpoint
  std::string name;  // its name in carried/: one path component
  // Saving: the bytes to write instead of reading `path` at each save (a
  // snapshot taken once, so a save never depends on the file still being there).
  std::shared_ptr<const std::string> content;
};

}  // namespace fsdp::checkpoint

// Fuzz target: a sharded checkpoint's manifest.json (checkpoint::parse_manifest,
// what --resume reads after manifest.crc32c matched). Input: the file's bytes.
// A malformed manifest must be a DamagedCheckpoint (the checkpoint is skipped,
// --resume falls back to an older one). Promises checked on an accepted one:
// every section lies inside its file, and each file has one checksum per block.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fsdp/checkpoint/sharded.h"
#include "fuzz_util.h"
#include "manifest.h"

using fsdp::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fsdp::fuzz::expect_documented_errors<fsdp::checkpoint::DamagedCheckpoint>([&] {
    const fsdp::checkpoint::Manifest m = fsdp::checkpoint::parse_manifest(text, "/fuzz/ckpt/step_00000001");
    fuzz_require(m.block_size > 0, "the checksum block size is positive");
    for (const auto& f : m.files) {
      fuzz_require(f.size >= 0, "file " + f.name + " has a size");
      fuzz_require(static_cast<int64_t>(f.blocks.size()) == f.size / m.block_size + (f.size % m.block_size != 0),
                   "file " + f.name + " has one checksum per block");
      for (const auto& s : f.sections) {
        fuzz_require(s.offset >= 0 && s.numel >= 0 && s.numel <= (f.size - s.offset) / s.elem_size,
                     "a section of " + f.name + " lies inside it");
      }
    }
  });
  return 0;
}

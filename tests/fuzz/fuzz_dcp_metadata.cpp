// Fuzz target: a PyTorch distributed checkpoint's .metadata (checkpoint::dcp::
// parse_metadata over the restricted pickle reader, Note [Restricted pickle]),
// what --resume and --init-from read first from a DCP directory. Input: the
// file's bytes. A malformed or hostile pickle (a foreign class, a cycle, deep
// nesting, a huge length) must be a PickleError naming the file. Promises
// checked on an accepted one: every chunk lies inside its tensor and has a
// storage entry, every element of a tensor lies in exactly one chunk (Note
// [Chunks cover once]), every item a positive length, and writing the metadata back
// and reading it again gives the same tensors.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dcp_format.h"
#include "fuzz_util.h"

using fsdp::fuzz::fuzz_require;
namespace dcp = fsdp::checkpoint::dcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fsdp::fuzz::expect_documented_errors<fsdp::checkpoint::pickle::PickleError>([&] {
    const dcp::Metadata m = dcp::parse_metadata(bytes, ".metadata");
    for (const auto& [fqn, t] : m.tensors) {
      for (const auto& c : t.chunks) {
        fuzz_require(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size(), fqn + ": chunk rank");
        for (size_t d = 0; d < t.size.size(); ++d) {
          fuzz_require(c.offsets[d] + c.sizes[d] <= t.size[d], fqn + ": a chunk lies inside the tensor");
        }
        fuzz_require(m.storage.count({fqn, true, c.offsets}) == 1, fqn + ": a chunk has its storage entry");
      }
    }
    for (const auto& [key, s] : m.storage) fuzz_require(s.length > 0 && s.offset >= 0, key.fqn + ": item range");
    // Note [Chunks cover once]: counted element by element where the tensor is small enough.
    for (const auto& [fqn, t] : m.tensors) {
      int64_t numel = 1;
      for (int64_t s : t.size) numel *= s;
      if (numel > (int64_t{1} << 20)) continue;
      std::vector<uint8_t> seen(static_cast<size_t>(numel), 0);
      for (const auto& c : t.chunks) {
        const int64_t n = c.numel();
        for (int64_t i = 0; i < n; ++i) {  // the chunk's i-th element, row-major, as an index of the tensor
          int64_t rest = i, at = 0, stride = 1;
          for (size_t d = t.size.size(); d-- > 0;) {
            at += (c.offsets[d] + rest % c.sizes[d]) * stride;
            rest /= c.sizes[d];
            stride *= t.size[d];
          }
          fuzz_require(++seen[static_cast<size_t>(at)] == 1, fqn + ": an element held by two chunks");
        }
      }
      for (uint8_t x : seen) fuzz_require(x == 1, fqn + ": an element held by no chunk");
    }
    const dcp::Metadata again = dcp::parse_metadata(dcp::write_metadata(m, "/ckpt", "id"), "rewritten");
    fuzz_require(again.tensors.size() == m.tensors.size() && again.storage.size() == m.storage.size(),
                 "write_metadata keeps every tensor and item");
  });
  return 0;
}

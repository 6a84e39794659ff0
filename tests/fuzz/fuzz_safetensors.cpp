// Fuzz target: a safetensors file (checkpoint::SafetensorsFile, what --init-from
// reads). Input: either the whole file, or, when it starts with '{', the JSON
// header up to the first NUL byte followed by the data section (the target adds
// the 8 length bytes, so mutations of the header keep a consistent length).
// Promises checked on a file it accepts: every tensor's byte range lies inside
// the data section, and each tensor can be copied out and read as floats.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fuzz_util.h"

using fsdp::fuzz::fuzz_require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file(reinterpret_cast<const char*>(data), size);
  if (size > 0 && data[0] == '{') {
    const size_t nul = file.find('\0');
    const std::string header = file.substr(0, nul);
    const std::string body = nul == std::string::npos ? std::string() : file.substr(nul + 1);
    const uint64_t n = header.size();
    file.assign(8, '\0');
    std::memcpy(file.data(), &n, 8);  // little-endian host (safetensors.h)
    file += header;
    file += body;
  }
  const std::string path = fsdp::fuzz::write_scratch("model.safetensors", file);
  fsdp::fuzz::expect_documented_errors([&] {
    const fsdp::checkpoint::SafetensorsFile f(path);
    const int64_t data_size = static_cast<int64_t>(file.size()) - f.data_offset();
    fuzz_require(f.data_offset() >= 8 && data_size >= 0, "the header lies inside the file");
    for (const auto& e : f.entries()) {
      fuzz_require(0 <= e.begin && e.begin <= e.end && e.end <= data_size, "tensor '" + e.name + "' lies in the data");
      fuzz_require(f.find(e.name) != nullptr, "tensor '" + e.name + "' can be found by name");
      const at::Tensor t = f.tensor(e.name);
      fuzz_require(t.numel() == e.numel(), "tensor '" + e.name + "' has its shape's element count");
      if (e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "F64") {
        const int64_t count = std::min<int64_t>(e.numel(), 64);
        std::vector<float> out(static_cast<size_t>(count));
        f.read_as_float(e, 0, count, out.data());
        f.read_as_float(e, e.numel() - count, count, out.data());
      }
    }
  });
  return 0;
}

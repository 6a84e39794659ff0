// Fuzz target: one item of a DCP data file (__R_N.distcp): a torch.save archive
// (a zip read by LibTorch's PyTorchStreamReader through a bounded reader of
// the item's bytes) whose data.pkl goes through the restricted pickle reader;
// a string value (the owners' metadata, fsdp_cpp.state) is then read as JSON
// by the bounded reader. Input: the item's bytes. Anything malformed must be a PickleError naming
// the item. Promises checked on an accepted tensor: its storage record lies
// inside the item and holds the tensor's elements; every read stays inside the
// item.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "dcp_format.h"
#include "fsdp/common/json_input.h"
#include "fuzz_util.h"

using fsdp::fuzz::fuzz_require;
namespace dcp = fsdp::checkpoint::dcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int64_t length = static_cast<int64_t>(size);
  const dcp::ReadAt read = [&](int64_t offset, int64_t n, void* dst) {
    fuzz_require(offset >= 0 && n >= 0 && offset <= length - n, "reads stay inside the item");
    std::memcpy(dst, data + offset, static_cast<size_t>(n));
  };
  fsdp::fuzz::expect_documented_errors<fsdp::checkpoint::pickle::PickleError>([&] {
    const dcp::TensorRecord r = dcp::read_tensor_item(read, length, "item");
    int64_t numel = 1;
    for (int64_t s : r.size) numel *= s;
    const int64_t elem = static_cast<int64_t>(c10::elementSize(r.dtype));
    fuzz_require(r.storage_offset >= 0 && numel <= r.storage_numel - r.storage_offset, "the tensor fits its storage");
    fuzz_require(r.data_offset >= 0 && r.data_offset + r.storage_numel * elem <= length, "the storage lies inside");
  });
  fsdp::fuzz::expect_documented_errors<fsdp::checkpoint::pickle::PickleError>([&] {
    const dcp::PyValue v = dcp::read_value_item(read, length, "item");
    // A string item is what fsdp_cpp.state is: JSON, read by the bounded reader as the loader reads it.
    std::string why;
    if (v.kind == fsdp::checkpoint::pickle::Kind::kStr) (void)fsdp::parse_json_input(v.s, why);
  });
  return 0;
}

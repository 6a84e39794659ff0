// Hugging Face safetensors files, read and written here (no external library).
//
// Format (https://github.com/huggingface/safetensors, "Format"):
//   [8 bytes]  N, unsigned little-endian: the header's length in bytes
//   [N bytes]  a JSON object, UTF-8, padded with spaces (0x20) to a multiple of 8:
//                { "<tensor name>": { "dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end] },
//                  ...,
//                  "__metadata__": { "format": "pt", ... } }      (optional, strings only)
//   [rest]     the tensors' raw bytes, row-major, little-endian; data_offsets are
//              relative to the start of this section (byte 8 + N of the file).
// Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL (element sizes 8 4 2 2 8 4 2 1 1 1).
//
// The reader checks what Hugging Face's reader checks and names the file in
// every error (UsageError: the file is the user's input): the file holds the 8
// length bytes; N <= 100,000,000 and 8 + N <= file size; the header is a JSON
// object; every entry has a known dtype, a shape of non-negative integers and
// data_offsets [begin, end] with begin <= end; end - begin == numel * element
// size; end <= the data section's size; no two tensors' byte ranges overlap.
// (Unlike Hugging Face's reader, gaps between tensors are accepted.)
//
// Host byte order must be little-endian (x86-64, aarch64): data is used as is.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::checkpoint {

namespace io {
class MappedFile;
}

// Element size of a safetensors dtype name; UsageError for an unknown one.
int64_t safetensors_dtype_size(const std::string& dtype);
// "F32" <-> at::kFloat, "BF16" <-> at::kBFloat16, "F16" <-> at::kHalf, "F64", "I64", ... .
std::string safetensors_dtype(at::ScalarType t);
at::ScalarType scalar_type_of(const std::string& dtype);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;  // row-major
  int64_t begin = 0;           // byte offsets in the data section
  int64_t end = 0;
  int64_t numel() const;
};

// A read-only view of one safetensors file (memory-mapped: only the bytes that
// are read are loaded from disk).
class SafetensorsFile {
 public:
  // Maps and validates `path` (see the file comment). UsageError naming the
  // file and the problem; Failure if it cannot be opened.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in the order of its bytes in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  // nullptr when there is no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Byte offset of the data section in the file (8 + N).
  int64_t data_offset() const { return data_offset_; }

  // The raw bytes of `e` (valid while this object lives).
  const uint8_t* bytes(const SafetensorsEntry& e) const;
  // Elements [first, first + count) of `e` in row-major order, converted to
  // fp32 into out[0, count). Floating dtypes only (F64, F32, F16, BF16); reads
  // only those elements' bytes. UsageError for other dtypes; InternalError if
  // the range is outside the tensor.
  void read_as_float(const SafetensorsEntry& e, int64_t first, int64_t count, float* out) const;
  // A copy of the whole tensor in its own dtype.
  at::Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<io::MappedFile> map_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  int64_t data_offset_ = 0;
};

struct SafetensorsSpec {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
};

// Writes one safetensors file as a stream: the header (every tensor's name,
// dtype and shape, known up front) first, then the tensors' bytes in the order
// of `specs`. The caller writes into a temporary location and renames it (the
// writer itself only creates, writes and fsyncs `path`).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor in `specs` order must be `name`; `values` (any floating
  // dtype, `numel` elements, any shape) is converted to its dtype (fp32 ->
  // bf16/f16 rounds to nearest even, as torch's .to()). InternalError if the
  // name or size does not match the plan.
  void write(const std::string& name, const at::Tensor& values);
  // Fsyncs and closes; InternalError if a tensor was not written.
  void finish();
  // Total file size (known from the start).
  int64_t file_size() const { return file_size_; }
  // The encoded header (8 length bytes + JSON + padding), for tests.
  static std::string encode_header(const std::vector<SafetensorsSpec>& specs,
                                   const std::map<std::string, std::string>& metadata);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t file_size_ = 0;
};

// Writes `tensors` (name, tensor in the dtype to store) to `path` in one go.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace fsdp::checkpoint

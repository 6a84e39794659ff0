// The files of a PyTorch distributed checkpoint (DCP) directory, read and
// written without the engine (internal to the checkpoint layer; dcp.h
// describes the format; tests/fuzz/fuzz_dcp_metadata.cpp drives the readers).
//
// .metadata: a pickle (pickle.h) of torch.distributed.checkpoint.metadata.Metadata:
//   state_dict_metadata: {fqn: TensorStorageMetadata(properties=TensorProperties(dtype, ...),
//                                                    size=torch.Size, chunks=[ChunkStorageMetadata(offsets, sizes)])
//                              | BytesStorageMetadata()}
//   planner_data: {fqn: (path, parts, ...)}      (the flattened key's place in the nested state dict)
//   storage_data: {MetadataIndex(fqn, offset=torch.Size | None, index): _StorageInfo(relative_path, offset, length)}
//   storage_meta: StorageMeta(checkpoint_id, save_id, load_id, modules), version: "1.0.0"
// Each item (a chunk of a tensor, or a non-tensor value) is a torch.save
// archive (a zip: archive/data.pkl, .format_version, .storage_alignment,
// byteorder, data/0, version, .data/serialization_id) of `length` bytes at
// `offset` in `relative_path` (__<rank>_<n>.distcp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/pickle.h"

namespace fsdp::checkpoint::dcp {

inline constexpr const char* kMetadataFile = ".metadata";

// A box of a tensor: offsets and sizes per dimension (none for a 0-d tensor).
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
};

struct TensorMeta {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
};

// Where one item lies.
struct StorageInfo {
  std::string relative_path;
  int64_t offset = 0;
  int64_t length = 0;
};

// The key of an item: a tensor chunk by its offsets, a non-tensor value (bytes) by its name alone.
struct ItemKey {
  std::string fqn;
  bool tensor = true;
  std::vector<int64_t> offsets;
  bool operator<(const ItemKey& o) const;
};

struct Metadata {
  std::map<std::string, TensorMeta> tensors;                    // tensor items by flattened key
  std::vector<std::string> bytes;                               // non-tensor items' keys
  std::map<std::string, std::vector<std::string>> planner_data; // key -> its path (ints as decimal strings)
  std::map<ItemKey, StorageInfo> storage;
  std::string version;  // "1.0.0"
};

// The classes a .metadata file may name (and nothing else).
const pickle::AllowList& metadata_allow_list();
// The classes a torch.save archive's data.pkl may name.
const pickle::AllowList& item_allow_list();

// Parses .metadata's bytes; `origin` names the file in errors. Checks every
// tensor's chunks lie inside it and hold a storage entry, and every storage
// entry's range is sane. Throws pickle::PickleError.
Metadata parse_metadata(const std::string& bytes, const std::string& origin);
// The pickle (protocol 4) that dcp.load accepts for `m`; `checkpoint_id` is StorageMeta's.
std::string write_metadata(const Metadata& m, const std::string& checkpoint_id, const std::string& save_id);

// "float32" <-> at::kFloat, ... (torch's dtype names).
at::ScalarType dtype_from_name(const std::string& name);  // Undefined for others
std::string dtype_to_name(at::ScalarType t);

// A value held by a non-tensor item (float, int, bool, None, str, tuples and
// lists of them), decoded from its data.pkl.
struct PyValue {
  pickle::Kind kind = pickle::Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<PyValue> items;  // tuple, list
};

// What a tensor item's archive holds: its data.pkl's tensor and where the
// storage's bytes lie in the archive.
struct TensorRecord {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;     // elements
  int64_t storage_numel = 0;      // elements
  int64_t data_offset = 0;        // bytes from the archive's start to data/<key>
};

// Reads an item archive of `length` bytes through `read(offset, n, dst)` (a
// bounded reader of the item's bytes): its directory, data.pkl and, for a
// tensor, the offset of its storage record. Throws pickle::PickleError naming
// `origin`.
using ReadAt = std::function<void(int64_t offset, int64_t n, void* dst)>;
TensorRecord read_tensor_item(const ReadAt& read, int64_t length, const std::string& origin);
PyValue read_value_item(const ReadAt& read, int64_t length, const std::string& origin);

// Where an archive's bytes go, in order.
using Sink = std::function<void(const void* data, size_t n)>;
// A torch.save archive of a contiguous CPU tensor (what torch.save(tensor) writes).
void write_tensor_item(const at::Tensor& t, const Sink& sink);
// A torch.save archive of a non-tensor value.
void write_value_item(const PyValue& v, const Sink& sink);

}  // namespace fsdp::checkpoint::dcp

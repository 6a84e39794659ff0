#include "fsdp/checkpoint/dcp.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "carried.h"
#include "dcp_format.h"
#include "file_io.h"
#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/json_input.h"
#include "manifest.h"
#include "payload.h"
#include "shard_position.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateKey = "fsdp_cpp.state";  // the owners' metadata, a JSON string
constexpr int64_t kWindow = 64 << 20;                // bytes per read
constexpr int64_t kGap = 4096;                       // runs closer than this share a read

// ---- keys (Note [DCP keys]) ---------------------------------------------------------

std::string saved_name(const DcpNames& n, const std::string& ours) { return n.name ? n.name(ours) : ours; }

std::string model_key(const std::string& saved) { return "model." + saved; }
std::string slot_key(const std::string& saved, const std::string& kind) {
  return "optimizer.state." + saved + "." + kind;
}

// A flattened key's place in the nested state dict (planner_data), as
// dcp.save's flatten_state_dict records it.
std::vector<std::string> key_path(const std::string& key, DcpLayout layout) {
  auto rest = [&](const std::string& prefix) { return key.substr(prefix.size()); };
  if (key.rfind("model.", 0) == 0) return {"model", rest("model.")};
  if (layout == DcpLayout::kTorchtitan && key.rfind("optimizer.", 0) == 0) return {"optimizer", rest("optimizer.")};
  if (key.rfind("optimizer.state.", 0) == 0) {
    const std::string r = rest("optimizer.state.");
    const size_t dot = r.rfind('.');
    return {"optimizer", "state", r.substr(0, dot), r.substr(dot + 1)};
  }
  if (key.rfind("optimizer.param_groups.", 0) == 0) {
    const std::string r = rest("optimizer.param_groups.");
    const size_t dot = r.find('.');
    return {"optimizer", "param_groups", r.substr(0, dot), r.substr(dot + 1)};
  }
  if (key.rfind("train_state.", 0) == 0) return {"train_state", rest("train_state.")};
  return {key};
}

// ---- boxes of a contiguous element range (Note [DCP resharding]) ----------------------

struct Box {
  std::vector<int64_t> offsets, sizes;
  int64_t flat_begin = 0;  // its first element's row-major index in the tensor
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
};

// Row-major elements [lo, hi) of a tensor of `shape` as at most 2*ndim-1 boxes, in order.
void boxes_of(const std::vector<int64_t>& shape, size_t dim, int64_t lo, int64_t hi, std::vector<int64_t>& prefix,
              int64_t base, std::vector<Box>* out) {
  if (lo >= hi) return;
  auto box = [&](std::vector<int64_t> offs, std::vector<int64_t> sizes, int64_t flat) {
    Box b;
    b.offsets = prefix;
    b.offsets.insert(b.offsets.end(), offs.begin(), offs.end());
    b.sizes.assign(prefix.size(), 1);
    b.sizes.insert(b.sizes.end(), sizes.begin(), sizes.end());
    b.flat_begin = flat;
    out->push_back(std::move(b));
  };
  if (dim + 1 == shape.size()) {
    box({lo}, {hi - lo}, base + lo);
    return;
  }
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  int64_t r0 = lo / inner;
  const int64_t r1 = hi / inner;
  auto recurse = [&](int64_t row, int64_t a, int64_t b) {
    prefix.push_back(row);
    boxes_of(shape, dim + 1, a, b, prefix, base + row * inner, out);
    prefix.pop_back();
  };
  if (r0 == (hi - 1) / inner) {  // within one row
    recurse(r0, lo - r0 * inner, hi - r0 * inner);
    return;
  }
  if (lo % inner != 0) recurse(r0++, lo % inner, inner);
  if (r1 > r0) {
    std::vector<int64_t> offs(shape.size() - dim, 0), sizes(shape.begin() + static_cast<std::ptrdiff_t>(dim), shape.end());
    offs[0] = r0;
    sizes[0] = r1 - r0;
    box(offs, sizes, base + r0 * inner);
  }
  if (hi % inner != 0) recurse(r1, 0, hi % inner);
}

// The boxes of elements [lo, hi) of a tensor of `shape`, each split where
// `row` maps consecutive rows apart, with its offsets in the saved order.
std::vector<Box> saved_boxes(const std::vector<int64_t>& shape, int64_t lo, int64_t hi,
                             const std::function<int64_t(int64_t)>& row = nullptr) {
  std::vector<Box> plain;
  if (shape.empty()) {
    if (lo < hi) plain.push_back(Box{{}, {}, 0});
    return plain;
  }
  std::vector<int64_t> prefix;
  boxes_of(shape, 0, lo, hi, prefix, 0, &plain);
  if (!row || shape.size() < 2) return plain;
  int64_t inner = 1;
  for (size_t d = 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<Box> out;
  for (const Box& b : plain) {
    int64_t r = b.offsets[0];
    const int64_t end = r + b.sizes[0];
    while (r < end) {
      int64_t e = r + 1;
      while (e < end && row(e) == row(e - 1) + 1) ++e;
      Box s = b;
      s.offsets[0] = row(r);
      s.sizes[0] = e - r;
      s.flat_begin = b.flat_begin + (r - b.offsets[0]) * inner;
      out.push_back(std::move(s));
      r = e;
    }
  }
  return out;
}

// ---- what this rank holds -----------------------------------------------------------

// One tensor of the state dict: for a parameter, its local part (this rank's
// flat range of it) in the model's shard or an owner's slot.
struct LocalPart {
  std::string key;             // the saved key
  std::string ours;            // our parameter name
  std::vector<int64_t> shape;  // the parameter's
  at::Tensor shard;            // the unit's 1-D local tensor (param or slot)
  int64_t shard_begin = 0;     // index in `shard` of the param's element `lo`
  int64_t lo = 0, hi = 0;      // the param's row-major elements held here
  bool required = true;        // a slot the checkpoint must have
  bool is_param = true;
};

struct Slots {
  std::vector<std::pair<std::string, std::vector<at::Tensor>>> by_kind;  // kind -> per unit (undefined: none)
  std::map<std::string, bool> required;
};

// Every owner's slots by kind and unit (Note [State seam]: a slot shadows a shard).
Slots collect_slots(ShardedModel& model, const std::vector<StateOwner*>& owners) {
  const std::vector<ShardRef> shards = model.shards();
  std::map<const void*, size_t> unit_of;
  for (size_t u = 0; u < shards.size(); ++u) {
    if (shards[u].param.numel() > 0) unit_of[shards[u].param.data_ptr()] = u;
  }
  Slots out;
  for (StateOwner* owner : owners) {
    for (StateSlot& slot : owner->state_slots()) {
      if (slot.value.numel() == 0 && slot.shadows.numel() == 0) continue;  // a unit without elements here
      const auto u = slot.shadows.numel() > 0 ? unit_of.find(slot.shadows.data_ptr()) : unit_of.end();
      FSDP_CHECK(u != unit_of.end(), "DCP: state owner '", owner->state_key(), "' has a '", slot.kind,
                 "' slot that shadows no local shard of the model; build it from model.shards()");
      auto it = std::find_if(out.by_kind.begin(), out.by_kind.end(), [&](const auto& k) { return k.first == slot.kind; });
      if (it == out.by_kind.end()) {
        out.by_kind.emplace_back(slot.kind, std::vector<at::Tensor>(shards.size()));
        it = out.by_kind.end() - 1;
      }
      it->second[u->second] = slot.value;
      out.required[slot.kind] = slot.required;
    }
  }
  return out;
}

// Every local part: parameters, then each slot kind's.
std::vector<LocalPart> local_parts(ShardedModel& model, const Slots& slots, const DcpNames& names, bool with_slots) {
  const std::vector<ShardRef> shards = model.shards();
  const auto& units = model.units();
  std::vector<LocalPart> out;
  auto add = [&](const std::string& kind, size_t u, const at::Tensor& shard, bool required) {
    const int64_t a = units[u].shard_offset, b = a + units[u].shard_numel;
    for (const auto& p : units[u].params) {
      const int64_t lo = std::max(a, p.flat_offset), hi = std::min(b, p.flat_offset + p.numel);
      if (lo >= hi) continue;
      LocalPart part;
      const std::string saved = saved_name(names, p.name);
      part.key = kind.empty() ? model_key(saved) : slot_key(saved, kind);
      part.ours = p.name;
      part.shape = p.shape;
      part.shard = shard;
      part.shard_begin = lo - a;
      part.lo = lo - p.flat_offset;
      part.hi = hi - p.flat_offset;
      part.required = required;
      part.is_param = kind.empty();
      out.push_back(std::move(part));
    }
  };
  for (size_t u = 0; u < units.size(); ++u) add("", u, shards[u].param, true);
  if (with_slots) {
    for (const auto& [kind, per_unit] : slots.by_kind) {
      for (size_t u = 0; u < units.size(); ++u) {
        if (per_unit[u].defined()) add(kind, u, per_unit[u], slots.required.at(kind));
      }
    }
  }
  return out;
}

// The optimizer owner's metadata (null without one).
nlohmann::json optimizer_metadata(const std::vector<StateOwner*>& owners) {
  for (StateOwner* o : owners) {
    if (o->state_key() == "optimizer") return o->state_metadata();
  }
  return nullptr;
}

dcp::PyValue py_of(const nlohmann::json& j, int depth = 0) {
  FSDP_CHECK(depth < 16, "DCP: a parameter group value nests too deep");
  dcp::PyValue v;
  using pickle::Kind;
  if (j.is_null()) {
    v.kind = Kind::kNone;
  } else if (j.is_boolean()) {
    v.kind = Kind::kBool;
    v.b = j.get<bool>();
  } else if (j.is_number_integer()) {
    v.kind = Kind::kInt;
    v.i = j.get<int64_t>();
  } else if (j.is_number()) {
    v.kind = Kind::kFloat;
    v.f = j.get<double>();
  } else if (j.is_string()) {
    v.kind = Kind::kStr;
    v.s = j.get<std::string>();
  } else if (j.is_array()) {
    v.kind = Kind::kTuple;  // PyTorch's betas are a tuple
    for (const auto& x : j) v.items.push_back(py_of(x, depth + 1));
  } else {
    FSDP_CHECK(false, "DCP: a parameter group value ", j.dump(), " has no Python form here");
  }
  return v;
}

// ---- writing -------------------------------------------------------------------------

// One written item, as rank 0 needs it for .metadata.
nlohmann::json item_record(const std::string& key, bool tensor, const Box& box, const std::vector<int64_t>& size,
                           at::ScalarType dtype, const std::string& file, int64_t offset, int64_t length) {
  nlohmann::json r = {{"key", key}, {"tensor", tensor}, {"file", file}, {"offset", offset}, {"length", length}};
  if (tensor) {
    r["offsets"] = box.offsets;
    r["sizes"] = box.sizes;
    r["size"] = size;
    r["dtype"] = dcp::dtype_to_name(dtype);
  }
  return r;
}

std::string rank_file(int rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

// This rank's torch_save file; returns the records of its items.
nlohmann::json write_torch_save(const std::string& dir, int rank, const std::vector<std::pair<LocalPart, Box>>& chunks,
                                const std::vector<std::pair<std::string, dcp::PyValue>>& values,
                                const std::vector<std::pair<std::string, at::Tensor>>& scalars, int64_t* bytes) {
  const std::string name = rank_file(rank);
  io::File f = io::File::create((fs::path(dir) / name).string());
  int64_t at = 0;
  const dcp::Sink sink = [&](const void* p, size_t n) {
    f.write_all(p, n);
    at += static_cast<int64_t>(n);
  };
  nlohmann::json records = nlohmann::json::array();
  for (const auto& [key, v] : values) {
    const int64_t begin = at;
    dcp::write_value_item(v, sink);
    records.push_back(item_record(key, false, {}, {}, at::kFloat, name, begin, at - begin));
  }
  for (const auto& [key, t] : scalars) {
    const int64_t begin = at;
    dcp::write_tensor_item(t, sink);
    records.push_back(item_record(key, true, Box{}, {}, t.scalar_type(), name, begin, at - begin));
  }
  for (const auto& [part, box] : chunks) {
    const at::Tensor t = part.shard.narrow(0, part.shard_begin + (box.flat_begin - part.lo), box.numel())
                             .to(at::kCPU)
                             .contiguous()
                             .view(box.sizes);
    const int64_t begin = at;
    dcp::write_tensor_item(t, sink);
    records.push_back(item_record(part.key, true, box, part.shape, t.scalar_type(), name, begin, at - begin));
  }
  f.sync();
  f.close();
  *bytes = at;
  return records;
}

// This rank's safetensors files (HuggingFaceStorageWriter(save_distributed=True)'s
// layout): the k-th box of every tensor in file k, its offsets in DCP_SHARDING_INFO.
nlohmann::json write_safetensors(const std::string& dir, int rank, const std::vector<std::pair<LocalPart, Box>>& chunks,
                                 const std::string& state_json, int64_t* bytes) {
  std::vector<std::vector<const std::pair<LocalPart, Box>*>> files;
  std::map<std::string, size_t> seen;  // key -> boxes so far
  for (const auto& c : chunks) {
    const size_t k = seen[c.first.key]++;
    if (files.size() <= k) files.resize(k + 1);
    files[k].push_back(&c);
  }
  if (files.empty() && rank == 0) files.resize(1);  // rank 0 carries the owners' metadata
  nlohmann::json records = nlohmann::json::array();
  *bytes = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    char name[96];
    std::snprintf(name, sizeof(name), "shard-%05d-model-%05zu-of-%05zu.safetensors", rank + 1, k + 1, files.size());
    std::vector<SafetensorsSpec> specs;
    nlohmann::json info = nlohmann::json::object();
    for (const auto* c : files[k]) {
      specs.push_back({c->first.key, safetensors_dtype(c->first.shard.scalar_type()), c->second.sizes});
      info[c->first.key] = {{"saved_offsets", c->second.offsets}};
    }
    std::map<std::string, std::string> meta = {
        {"DCP_SHARDING_INFO", info.dump()}, {"DCP_VERSION", "1.0"}, {"format", "pt"}};
    if (rank == 0 && k == 0) meta[kStateKey] = state_json;
    SafetensorsWriter w((fs::path(dir) / name).string(), specs, meta);
    for (const auto* c : files[k]) {
      const LocalPart& p = c->first;
      w.write(p.key, p.shard.narrow(0, p.shard_begin + (c->second.flat_begin - p.lo), c->second.numel()).to(at::kCPU));
    }
    w.finish();
    *bytes += w.file_size();
    records.push_back({{"file", name}});
  }
  return records;
}

// Rank 0: .metadata from every rank's records.
void write_metadata_file(const std::string& dir, const std::vector<nlohmann::json>& all, DcpLayout layout) {
  dcp::Metadata m;
  m.version = "1.0.0";
  for (const auto& records : all) {
    for (const auto& r : records) {
      const std::string key = r.at("key");
      dcp::StorageInfo s{r.at("file"), r.at("offset"), r.at("length")};
      if (!r.at("tensor").get<bool>()) {
        m.bytes.push_back(key);
        m.storage[{key, false, {}}] = s;
      } else {
        dcp::TensorMeta& t = m.tensors[key];
        t.dtype = dcp::dtype_from_name(r.at("dtype"));
        t.size = r.at("size").get<std::vector<int64_t>>();
        dcp::Chunk c{r.at("offsets").get<std::vector<int64_t>>(), r.at("sizes").get<std::vector<int64_t>>()};
        m.storage[{key, true, c.offsets}] = s;
        t.chunks.push_back(std::move(c));
      }
      m.planner_data[key] = key_path(key, layout);
    }
  }
  std::random_device rd;
  char id[40];
  std::snprintf(id, sizeof(id), "%08x-%04x-4%03x-8%03x-%08x%04x", rd(), rd() & 0xffff, rd() & 0xfff, rd() & 0xfff,
                rd(), rd() & 0xffff);
  io::write_text_file((fs::path(dir) / dcp::kMetadataFile).string(), dcp::write_metadata(m, dir, id));
}

// ---- reading -------------------------------------------------------------------------

// One saved chunk of a tensor and where its row-major data lies.
struct Source {
  std::string key;               // the tensor's saved key
  size_t file = 0;               // index into Catalog::files
  int64_t item_offset = 0;       // torch_save: the archive's place in the file
  int64_t item_length = 0;
  int64_t data_offset = -1;      // the chunk's first element's byte in the file (-1: not resolved yet)
  at::ScalarType dtype = at::kFloat;
  dcp::Chunk chunk;
};

struct SavedTensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  std::vector<size_t> sources;  // into Catalog::sources, sorted by the chunk's first offset
  int64_t max_rows = 0;         // the largest chunk extent along dimension 0
};

// What a DCP directory holds, from .metadata or from the safetensors headers.
struct Catalog {
  DcpFormat format = DcpFormat::kTorchSave;
  std::vector<std::string> files;  // paths
  std::vector<Source> sources;
  std::map<std::string, SavedTensor> tensors;
  std::map<std::string, dcp::StorageInfo> values;  // non-tensor items (torch_save)
  std::string state_json;                          // fsdp_cpp.state (safetensors: from a header)
};

class Damage {
 public:
  explicit Damage(std::string checkpoint) : checkpoint_(std::move(checkpoint)) {}
  template <class... A>
  [[noreturn]] void operator()(const std::string& file, const A&... why) const {
    throw DamagedCheckpoint(checkpoint_, file, detail::cat(why...));
  }

 private:
  std::string checkpoint_;
};

// A JSON object held in a checkpoint file (a metadata string, an item), read
// by the bounded reader (fsdp/common/json_input.h): anything else is damage.
nlohmann::json json_object_of(const std::string& text, const std::string& file, const std::string& what,
                              const Damage& damaged) {
  std::string why;
  std::optional<nlohmann::json> j = parse_json_input(text, why);
  if (!j) damaged(file, what, " is not valid JSON: ", why);
  if (!j->is_object()) damaged(file, what, " is not a JSON object");
  return std::move(*j);
}

size_t file_index(Catalog& c, const std::string& path) {
  const auto it = std::find(c.files.begin(), c.files.end(), path);
  if (it != c.files.end()) return static_cast<size_t>(it - c.files.begin());
  c.files.push_back(path);
  return c.files.size() - 1;
}

void finish_catalog(Catalog& c) {
  for (auto& [key, t] : c.tensors) {
    std::sort(t.sources.begin(), t.sources.end(), [&](size_t a, size_t b) {
      const auto& x = c.sources[a].chunk.offsets;
      const auto& y = c.sources[b].chunk.offsets;
      return x < y;
    });
    for (size_t i : t.sources) {
      if (!c.sources[i].chunk.sizes.empty()) t.max_rows = std::max(t.max_rows, c.sources[i].chunk.sizes[0]);
    }
  }
}

Catalog catalog_torch_save(const fs::path& dir, const Damage& damaged) {
  Catalog c;
  std::string bytes;
  constexpr int64_t kMaxMetadata = int64_t{1} << 30;  // a 70B model's is a few MB
  std::error_code ec;
  const auto size = fs::file_size(dir / dcp::kMetadataFile, ec);
  if (!ec && static_cast<int64_t>(size) > kMaxMetadata) {
    damaged(dcp::kMetadataFile, "has ", size, " bytes, more than the ", kMaxMetadata, " this reader reads");
  }
  try {
    bytes = io::read_text_file((dir / dcp::kMetadataFile).string(), io::File::Links::kRefuse);
  } catch (const std::exception& e) {
    damaged(dcp::kMetadataFile, "cannot be read (", e.what(), ")");
  }
  dcp::Metadata m;
  try {
    m = dcp::parse_metadata(bytes, dcp::kMetadataFile);
  } catch (const pickle::PickleError& e) {
    damaged(dcp::kMetadataFile, e.what());
  }
  for (const auto& [key, t] : m.tensors) {
    SavedTensor& s = c.tensors[key];
    s.dtype = t.dtype;
    s.size = t.size;
    for (const dcp::Chunk& ch : t.chunks) {
      const dcp::StorageInfo& where = m.storage.at({key, true, ch.offsets});
      Source src;
      src.key = key;
      src.file = file_index(c, (dir / where.relative_path).string());
      src.item_offset = where.offset;
      src.item_length = where.length;
      src.dtype = t.dtype;
      src.chunk = ch;
      c.sources.push_back(std::move(src));
      s.sources.push_back(c.sources.size() - 1);
    }
  }
  for (const std::string& key : m.bytes) c.values[key] = m.storage.at({key, false, {}});
  finish_catalog(c);
  return c;
}

Catalog catalog_safetensors(const fs::path& dir, const Damage& damaged) {
  Catalog c;
  c.format = DcpFormat::kSafetensors;
  std::vector<fs::path> paths;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  for (const fs::path& path : paths) {
    const std::string name = path.filename().string();
    if (fs::is_symlink(path, ec)) damaged(name, "is a symbolic link, not a file of the checkpoint's own");
    try {
      SafetensorsFile f(path.string());
      nlohmann::json info = nlohmann::json::object();
      const auto it = f.metadata().find("DCP_SHARDING_INFO");
      if (it != f.metadata().end()) {
        info = json_object_of(it->second, name, "its DCP_SHARDING_INFO", damaged);
      }
      if (const auto st = f.metadata().find(kStateKey); st != f.metadata().end()) c.state_json = st->second;
      const size_t fi = file_index(c, path.string());
      for (const SafetensorsEntry& e : f.entries()) {
        Source src;
        src.key = e.name;
        src.file = fi;
        src.dtype = scalar_type_of(e.dtype);
        src.chunk.sizes = e.shape;
        src.chunk.offsets.assign(e.shape.size(), 0);
        if (info.contains(e.name)) {
          const nlohmann::json& o = info[e.name].value("saved_offsets", nlohmann::json());
          if (!o.is_array() || o.size() != e.shape.size()) damaged(name, "saved_offsets of '", e.name, "' are malformed");
          for (size_t d = 0; d < o.size(); ++d) {
            if (!o[d].is_number_integer() || o[d].get<int64_t>() < 0 || o[d].get<int64_t>() > (int64_t{1} << 40)) {
              damaged(name, "saved_offsets of '", e.name, "' are not offsets: ", o[d].dump());
            }
            src.chunk.offsets[d] = o[d].get<int64_t>();
          }
        }
        src.data_offset = f.data_offset() + e.begin;
        SavedTensor& t = c.tensors[e.name];
        if (t.sources.empty()) {
          t.dtype = src.dtype;
          t.size.assign(e.shape.size(), 0);
        }
        if (t.size.size() != e.shape.size() || t.dtype != src.dtype) {
          damaged(name, "'", e.name, "' has another rank or dtype than in the other files");
        }
        for (size_t d = 0; d < e.shape.size(); ++d) t.size[d] = std::max(t.size[d], src.chunk.offsets[d] + e.shape[d]);
        c.sources.push_back(std::move(src));
        t.sources.push_back(c.sources.size() - 1);
      }
    } catch (const DamagedCheckpoint&) {
      throw;
    } catch (const std::exception& e) {
      damaged(name, e.what());
    }
  }
  // The chunks of each tensor must fill it exactly (as .metadata's are checked).
  for (const auto& [key, t] : c.tensors) {
    int64_t numel = 1, covered = 0;
    for (int64_t s : t.size) numel *= s;
    for (size_t i : t.sources) covered += c.sources[i].chunk.numel();
    if (covered != numel) {
      damaged(c.files[c.sources[t.sources[0]].file], "the chunks of '", key, "' hold ", covered, " elements, the "
              "tensor has ", numel, " (a file is missing, or chunks overlap)");
    }
  }
  finish_catalog(c);
  return c;
}

// Open files of a checkpoint, each checked to hold what an item needs.
class Files {
 public:
  Files(const Catalog& c, const Damage& damaged) : c_(c), damaged_(damaged), open_(c.files.size()) {}

  void read(size_t f, int64_t offset, int64_t n, void* dst) {
    io::File& file = get(f);
    if (offset < 0 || n < 0 || offset > file.size() - n) {
      damaged_(name(f), "is ", file.size(), " bytes long, but the checkpoint needs bytes [", offset, ", ", offset + n,
               ") of it (truncated, or a wrong offset in ", dcp::kMetadataFile, ")");
    }
    try {
      file.pread_all(dst, static_cast<size_t>(n), offset);
    } catch (const std::exception& e) {
      damaged_(name(f), strip_rank_tag(e.what()));
    }
  }
  std::string name(size_t f) const { return fs::path(c_.files[f]).filename().string(); }

 private:
  io::File& get(size_t f) {
    if (!open_[f].is_open()) {
      try {
        open_[f] = io::File::open_read(c_.files[f], io::File::Links::kRefuse);
      } catch (const std::exception& e) {
        damaged_(name(f), "cannot be read: ", strip_rank_tag(e.what()));
      }
    }
    return open_[f];
  }
  const Catalog& c_;
  const Damage& damaged_;
  std::vector<io::File> open_;
};

// The data offset of a torch_save source, from its archive's directory.
void resolve(Source& s, Files& files, const Damage& damaged) {
  const std::string& key = s.key;
  if (s.data_offset >= 0) return;
  const dcp::ReadAt read = [&](int64_t off, int64_t n, void* dst) { files.read(s.file, s.item_offset + off, n, dst); };
  dcp::TensorRecord r;
  try {
    r = dcp::read_tensor_item(read, s.item_length, "item '" + key + "'");
  } catch (const pickle::PickleError& e) {
    damaged(files.name(s.file), e.what());
  }
  if (r.dtype != s.dtype || r.size != s.chunk.sizes) {
    damaged(files.name(s.file), "item '", key, "' holds a ", c10::toString(r.dtype), " tensor of shape ",
            c10::IntArrayRef(r.size), ", ", dcp::kMetadataFile, " says ", c10::toString(s.dtype), " ",
            c10::IntArrayRef(s.chunk.sizes));
  }
  s.data_offset = s.item_offset + r.data_offset + r.storage_offset * static_cast<int64_t>(c10::elementSize(r.dtype));
}

// Elements of a source going to a local tensor.
struct Run {
  size_t source = 0;
  int64_t src_elem = 0;  // in the chunk, row-major
  int64_t count = 0;
  at::Tensor dst;        // 1-D
  int64_t dst_offset = 0;
};

// The names of the files holding tensor `t`'s chunks, in order ("a.safetensors, b.safetensors").
std::string chunk_files(const SavedTensor& t, const Catalog& c) {
  std::set<std::string> names;
  for (size_t s : t.sources) names.insert(fs::path(c.files[c.sources[s].file]).filename().string());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Note [DCP resharding]: this part's elements, line by line along the last
// dimension, from the saved chunks that hold them.
void plan_part(const LocalPart& p, const SavedTensor& t, const Catalog& c, const DcpNames& names,
               const Damage& damaged, std::vector<Run>* out) {
  const size_t nd = p.shape.size();
  const int64_t last = nd == 0 ? 1 : p.shape.back();
  std::vector<int64_t> prefix(nd > 0 ? nd - 1 : 0), saved(prefix.size());
  std::vector<std::pair<int64_t, int64_t>> segments;  // [lo, hi) of the line held by each chunk
  for (int64_t e = p.lo; e < p.hi;) {
    const int64_t line = e / last;
    const int64_t c0 = e % last;
    const int64_t c1 = std::min(last, c0 + (p.hi - e));
    int64_t rest = line;
    for (size_t d = prefix.size(); d-- > 0;) {
      prefix[d] = rest % p.shape[d];
      rest /= p.shape[d];
    }
    saved = prefix;
    if (!saved.empty() && names.row && nd >= 2) saved[0] = names.row(p.ours, prefix[0], p.shape[0]);
    // Chunks whose first offset could hold saved[0]: sorted by offsets, scan back at most max_rows.
    auto contains = [&](const dcp::Chunk& ch) {
      for (size_t d = 0; d < saved.size(); ++d) {
        if (saved[d] < ch.offsets[d] || saved[d] >= ch.offsets[d] + ch.sizes[d]) return false;
      }
      return true;
    };
    size_t hi_idx = t.sources.size();
    if (!saved.empty()) {
      hi_idx = static_cast<size_t>(
          std::upper_bound(t.sources.begin(), t.sources.end(), saved[0],
                           [&](int64_t r, size_t s) { return r < c.sources[s].chunk.offsets[0]; }) -
          t.sources.begin());
    }
    segments.clear();
    for (size_t k = hi_idx; k-- > 0;) {
      const Source& src = c.sources[t.sources[k]];
      const dcp::Chunk& ch = src.chunk;
      if (!saved.empty() && ch.offsets[0] + t.max_rows <= saved[0]) break;
      if (nd == 0 || !contains(ch)) continue;
      const int64_t lo = std::max(c0, ch.offsets.back()), hi = std::min(c1, ch.offsets.back() + ch.sizes.back());
      if (lo >= hi) continue;
      segments.emplace_back(lo, hi);
      int64_t idx = 0;
      for (size_t d = 0; d < saved.size(); ++d) idx = idx * ch.sizes[d] + (saved[d] - ch.offsets[d]);
      idx = idx * ch.sizes.back() + (lo - ch.offsets.back());
      Run r{t.sources[k], idx, hi - lo, p.shard, p.shard_begin + (line * last + lo) - p.lo};
      if (!out->empty()) {
        Run& q = out->back();
        if (q.source == r.source && q.src_elem + q.count == r.src_elem && q.dst.is_same(r.dst) &&
            q.dst_offset + q.count == r.dst_offset) {
          q.count += r.count;
          continue;
        }
      }
      out->push_back(std::move(r));
    }
    // Note [Chunks cover once] (src/checkpoint/dcp_format.cpp): every element of the line
    // held exactly once, whatever the metadata's own check could afford.
    if (nd > 0) {
      std::sort(segments.begin(), segments.end());
      int64_t at = c0;
      // Where the chunks are described: .metadata, or the safetensors files' DCP_SHARDING_INFO.
      const std::string where = c.format == DcpFormat::kTorchSave ? std::string(dcp::kMetadataFile)
                                                                  : chunk_files(t, c);
      for (const auto& [lo, hi] : segments) {
        if (lo != at) {
          damaged(where, "the chunks of '", p.key, "' ", lo < at ? "overlap" : "leave a gap", " at row ", line,
                  ", column ", std::min(lo, at), " (chunks must cover the tensor exactly once)");
        }
        at = hi;
      }
      if (at != c1) {
        damaged(where, "the chunks of '", p.key, "' leave a gap at row ", line, ", column ", at,
                " (chunks must cover the tensor exactly once)");
      }
    }
    e = line * last + c1;
  }
}

// Reads every run, in windows of at most kWindow bytes per file; returns the bytes read.
int64_t read_runs(std::vector<Run>& runs, Catalog& c, Files& files) {
  std::sort(runs.begin(), runs.end(), [&](const Run& a, const Run& b) {
    const Source& x = c.sources[a.source];
    const Source& y = c.sources[b.source];
    const int64_t ox = x.data_offset + a.src_elem * static_cast<int64_t>(c10::elementSize(x.dtype));
    const int64_t oy = y.data_offset + b.src_elem * static_cast<int64_t>(c10::elementSize(y.dtype));
    return std::tie(x.file, ox) < std::tie(y.file, oy);
  });
  auto begin_of = [&](const Run& r) {
    const Source& s = c.sources[r.source];
    return s.data_offset + r.src_elem * static_cast<int64_t>(c10::elementSize(s.dtype));
  };
  auto end_of = [&](const Run& r) {
    return begin_of(r) + r.count * static_cast<int64_t>(c10::elementSize(c.sources[r.source].dtype));
  };
  std::vector<uint8_t> buffer;
  int64_t bytes = 0;
  at::NoGradGuard no_grad;
  size_t i = 0;
  while (i < runs.size()) {
    const size_t f = c.sources[runs[i].source].file;
    const int64_t w0 = begin_of(runs[i]);
    int64_t w1 = end_of(runs[i]);
    size_t j = i + 1;
    while (j < runs.size() && c.sources[runs[j].source].file == f && begin_of(runs[j]) <= w1 + kGap &&
           end_of(runs[j]) - w0 <= kWindow) {
      w1 = std::max(w1, end_of(runs[j++]));
    }
    if (j == i + 1 && w1 - w0 > kWindow) {
      // One run larger than a window: read it in pieces straight into place.
      const Run& r = runs[i];
      const Source& s = c.sources[r.source];
      const int64_t elem = static_cast<int64_t>(c10::elementSize(s.dtype));
      const int64_t per = std::max<int64_t>(1, kWindow / elem);
      for (int64_t k = 0; k < r.count; k += per) {
        const int64_t n = std::min(per, r.count - k);
        buffer.resize(static_cast<size_t>(n * elem));
        files.read(f, begin_of(r) + k * elem, n * elem, buffer.data());
        r.dst.narrow(0, r.dst_offset + k, n).copy_(at::from_blob(buffer.data(), {n}, at::TensorOptions().dtype(s.dtype)));
      }
      bytes += w1 - w0;
      ++i;
      continue;
    }
    buffer.resize(static_cast<size_t>(w1 - w0));
    files.read(f, w0, w1 - w0, buffer.data());
    for (size_t k = i; k < j; ++k) {
      const Run& r = runs[k];
      const Source& s = c.sources[r.source];
      const at::Tensor src = at::from_blob(buffer.data() + (begin_of(r) - w0), {r.count}, at::TensorOptions().dtype(s.dtype));
      r.dst.narrow(0, r.dst_offset, r.count).copy_(src);
    }
    bytes += w1 - w0;
    i = j;
  }
  return bytes;
}

// Weights are finite: a NaN or inf loaded here would surface steps later as
// a NaN loss far from its cause (as a Hugging Face directory's are checked,
// checkpoint/safetensors.h). The first one found is named with its files.
void check_finite(const std::vector<LocalPart>& parts, const Catalog& c, const Damage& damaged) {
  at::NoGradGuard no_grad;
  for (const LocalPart& p : parts) {
    if (!p.is_param || p.hi <= p.lo) continue;
    const at::Tensor v = p.shard.narrow(0, p.shard_begin, p.hi - p.lo);
    if (at::isfinite(v).all().item<bool>()) continue;
    const int64_t i = at::logical_not(at::isfinite(v)).nonzero()[0].item<int64_t>();
    const double x = v[i].item<double>();
    const auto it = c.tensors.find(p.key);
    const std::string names = it != c.tensors.end() ? chunk_files(it->second, c) : std::string();
    damaged(names.empty() ? std::string(dcp::kMetadataFile) : names, "tensor '", p.key, "' holds ",
            std::isnan(x) ? "NaN" : "inf", " (element ", p.lo + i, "): the weights are damaged; save them again from "
            "a run that had finite weights");
  }
}

// A 0-d tensor item's value (a step count).
double read_scalar(Catalog& c, const SavedTensor& t, Files& files, const std::string& key, const Damage& damaged) {
  if (t.sources.size() != 1 || !t.size.empty()) damaged(dcp::kMetadataFile, "'", key, "' is not a scalar");
  Source& s = c.sources[t.sources[0]];
  resolve(s, files, damaged);
  at::Tensor v = at::empty({}, at::TensorOptions().dtype(s.dtype));
  files.read(s.file, s.data_offset, static_cast<int64_t>(v.nbytes()), v.data_ptr());
  return v.to(at::kDouble).item<double>();
}

}  // namespace

DcpLayout parse_dcp_layout(const std::string& text, const std::string& flag) {
  if (text == "torch") return DcpLayout::kTorch;
  if (text == "torchtitan") return DcpLayout::kTorchtitan;
  FSDP_CHECK(false, flag, " '", text, "': expected torch (FSDP2 with get_state_dict) or torchtitan");
  return DcpLayout::kTorch;
}

DcpFormat parse_dcp_format(const std::string& text, const std::string& flag) {
  if (text == "torch_save") return DcpFormat::kTorchSave;
  if (text == "safetensors") return DcpFormat::kSafetensors;
  FSDP_CHECK(false, flag, " '", text, "': expected torch_save (DCP's default) or safetensors");
  return DcpFormat::kTorchSave;
}

bool is_dcp_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / dcp::kMetadataFile, ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) == 0 && e.path().extension() == ".safetensors") return true;
  }
  return false;
}

DcpLayout detect_dcp_layout(const std::string& dir) {
  const fs::path root(dir);
  const Damage damaged(root.filename().string());
  std::error_code ec;
  const Catalog c = fs::is_regular_file(root / dcp::kMetadataFile, ec) ? catalog_torch_save(root, damaged)
                                                                      : catalog_safetensors(root, damaged);
  for (const auto& [key, t] : c.tensors) {
    const std::string tail = "tok_embeddings.weight";
    if (key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0) {
      return DcpLayout::kTorchtitan;
    }
  }
  return DcpLayout::kTorch;
}

std::function<RankStatus()> prepare_dcp_write(const std::string& dir, ShardedModel& model,
                                              const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                              const DcpSaveOptions& options, std::shared_ptr<Stager> stager) {
  FSDP_CHECK(options.layout != DcpLayout::kTorchtitan || options.names.name,
             "DCP: the torchtitan layout needs the model family's torchtitan names (DcpSaveOptions::names)");
  const ShardPosition pos = shard_position(model, group);
  const int rank = group.rank();
  const bool lead = rank == 0;
  const Slots slots = collect_slots(model, owners);
  std::vector<LocalPart> parts = local_parts(model, slots, options.names, /*with_slots=*/true);
  if (options.format == DcpFormat::kSafetensors) {
    // HuggingFaceStorageWriter saves a model's own state dict: its keys carry no "model." prefix.
    for (LocalPart& p : parts) {
      if (p.is_param) p.key = p.key.substr(6);
    }
  }
  std::vector<std::pair<LocalPart, Box>> chunks;
  if (pos.writer) {
    for (const LocalPart& p : parts) {
      stager->add(p.shard);
      std::function<int64_t(int64_t)> row;
      if (options.names.row && p.shape.size() >= 2) {
        row = [&, rows = p.shape[0]](int64_t r) { return options.names.row(p.ours, r, rows); };
      }
      for (Box& b : saved_boxes(p.shape, p.lo, p.hi, row)) chunks.emplace_back(p, std::move(b));
    }
  }
  // Rank 0: the owners' metadata, and PyTorch's per-parameter step and parameter groups.
  nlohmann::json state = nlohmann::json::object();
  for (StateOwner* o : owners) state[o->state_key()] = o->state_metadata();
  std::vector<std::pair<std::string, dcp::PyValue>> values;
  std::vector<std::pair<std::string, at::Tensor>> scalars;
  if (lead) {
    dcp::PyValue text;
    text.kind = pickle::Kind::kStr;
    text.s = state.dump();
    values.emplace_back(kStateKey, text);
    const nlohmann::json opt = optimizer_metadata(owners);
    // Parameters with optimizer state: those of units with a slot.
    std::vector<std::string> trained;
    const auto& units = model.units();
    for (size_t u = 0; u < units.size(); ++u) {
      bool has = false;
      for (const auto& [kind, per_unit] : slots.by_kind) has = has || per_unit[u].defined();
      if (!has) continue;
      for (const auto& p : units[u].params) trained.push_back(saved_name(options.names, p.name));
    }
    if (opt.is_object() && opt.contains("step")) {
      const at::Tensor step = at::scalar_tensor(static_cast<double>(opt["step"].get<int64_t>()), at::kFloat);
      for (const std::string& n : trained) scalars.emplace_back(slot_key(n, "step"), step);
      if (options.layout == DcpLayout::kTorchtitan) {
        scalars.emplace_back("train_state.step", at::scalar_tensor(opt["step"].get<int64_t>(), at::kInt));
      }
    }
    if (opt.is_object() && opt.contains("torch") && opt["torch"].is_object()) {
      // PyTorch's parameter group (torch.optim's names), one group over every trained parameter.
      dcp::PyValue params;
      params.kind = pickle::Kind::kList;
      for (const std::string& n : trained) {
        dcp::PyValue x;
        x.kind = pickle::Kind::kStr;
        x.s = n;
        params.items.push_back(x);
      }
      if (options.layout == DcpLayout::kTorch) {
        for (const auto& [k, v] : opt["torch"].items()) values.emplace_back("optimizer.param_groups.0." + k, py_of(v));
        values.emplace_back("optimizer.param_groups.0.params", params);
      } else {  // flatten_optimizer_state_dict: per parameter
        for (const std::string& n : trained) {
          for (const auto& [k, v] : opt["torch"].items()) {
            values.emplace_back("optimizer.param_groups." + n + "." + k, py_of(v));
          }
        }
      }
    }
  }
  if (!pos.writer && !lead) {
    return [] { return RankStatus::success(nlohmann::json{{"records", nlohmann::json::array()}, {"bytes", 0}}.dump()); };
  }
  // The write reads the chunks' tensors through the stager (Note [Save phases]).
  return [dir, rank, format = options.format, chunks = std::move(chunks), values = std::move(values),
          scalars = std::move(scalars), state_json = state.dump(), stager]() {
    int64_t written = 0;
    nlohmann::json records;
    RankStatus mine = RankStatus::capture([&] {
      std::vector<std::pair<LocalPart, Box>> staged = chunks;
      for (auto& c : staged) c.first.shard = (*stager)(c.first.shard);
      records = format == DcpFormat::kTorchSave ? write_torch_save(dir, rank, staged, values, scalars, &written)
                                                : write_safetensors(dir, rank, staged, state_json, &written);
    });
    if (mine.ok()) mine = RankStatus::success(nlohmann::json{{"records", records}, {"bytes", written}}.dump());
    return mine;
  };
}

int64_t finish_dcp_write(const std::string& dir, const Agreement& all, const DcpSaveOptions& options, bool lead) {
  int64_t total = 0;
  std::vector<nlohmann::json> every;
  for (const RankStatus& r : all.ranks()) {
    const nlohmann::json j = r.payload_json();
    total += j.at("bytes").get<int64_t>();
    every.push_back(j.at("records"));
  }
  if (lead) {
    if (options.format == DcpFormat::kTorchSave) write_metadata_file(dir, every, options.layout);
    io::fsync_dir(dir);
  }
  return total;
}

IoStats write_dcp_files(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                        comm::ProcessGroup& group, const DcpSaveOptions& options) {
  const double t0 = io::now_seconds();
  const bool lead = group.rank() == 0;
  std::function<RankStatus()> write;
  RankStatus mine = RankStatus::capture(
      [&] { write = prepare_dcp_write(dir, model, owners, group, options, std::make_shared<Stager>()); });
  if (mine.ok()) mine = write();
  // Every file is written and fsynced before rank 0 writes .metadata (Note [Checkpoint commit]).
  const Agreement all = agree(group, mine);
  all.raise_if_failed("saving DCP checkpoint " + dir + " failed");
  int64_t total = 0;
  RankStatus committed = RankStatus::capture([&] { total = finish_dcp_write(dir, all, options, lead); });
  agree(group, committed).raise_if_failed("saving DCP checkpoint " + dir + " failed");
  return IoStats{total, io::now_seconds() - t0};
}

void check_dcp_target(const std::string& dir, const std::string& flag) {
  const fs::path final = fs::absolute(fs::path(dir)).lexically_normal();
  FSDP_CHECK(final.has_filename() && final.filename() != "." && final.filename() != "..", flag, " ", dir,
             " must name a directory to create, not the current or a parent directory");
  std::error_code ec;
  // The checkpoint is renamed into place at DIR: at a symbolic link that would
  // replace the user's link, not fill the directory it names (as --export-hf).
  FSDP_CHECK(!fs::is_symlink(fs::symlink_status(final, ec)), flag, " ", dir, " is a symbolic link (to ",
             fs::read_symlink(final, ec).string(), "); a DCP save replaces the directory at its path, which would "
             "replace the link — give the directory's own path");
  const bool exists = fs::exists(fs::symlink_status(final, ec));
  FSDP_CHECK(!exists || (fs::is_directory(final, ec) && fs::is_empty(final, ec)) || is_owned_directory(final.string()),
             flag, " ", dir, " exists and is neither empty nor a directory this program wrote; choose a new directory");
}

IoStats save_dcp(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                 comm::ProcessGroup& group, const DcpSaveOptions& options) {
  const fs::path final = fs::absolute(fs::path(dir)).lexically_normal();
  const fs::path tmp = final.parent_path() / (".tmp-" + final.filename().string());
  RankStatus prepared;
  if (group.rank() == 0) {
    prepared = RankStatus::capture([&] {
      check_dcp_target(dir, "DCP output");
      fs::create_directories(final.parent_path());
      remove_owned_directory(tmp.string());
      create_owned_directory(tmp.string());
    });
  }
  agree(group, prepared).raise_if_failed("saving DCP checkpoint " + dir + " failed");
  IoStats io;
  try {
    io = write_dcp_files(tmp.string(), model, owners, group, options);
  } catch (...) {
    if (group.rank() == 0 && is_owned_directory(tmp.string())) discard_owned_directory(tmp.string());
    throw;
  }
  RankStatus committed;
  if (group.rank() == 0) {
    committed = RankStatus::capture([&] {
      write_carried_files(tmp.string(), options.carried);
      io::replace_directory(tmp.string(), final.string());
    });
  }
  agree(group, committed).raise_if_failed("saving DCP checkpoint " + dir + " failed");
  return io;
}

DcpLoadResult load_dcp(const std::string& dir, ShardedModel& model, const std::vector<StateOwner*>& owners,
                       comm::ProcessGroup& group, const DcpLoadOptions& options) {
  const double t0 = io::now_seconds();
  const fs::path root(dir);
  const std::string name = root.filename().string();
  const Damage damaged(name.empty() ? dir : name);
  DcpLoadResult result;
  int64_t bytes_read = 0;
  nlohmann::json state;
  RankStatus status = RankStatus::capture([&] {
    std::error_code ec;
    FSDP_CHECK(fs::is_directory(root, ec), "DCP checkpoint ", dir, " is not a directory");
    FSDP_CHECK(is_dcp_dir(dir), dir, " holds no PyTorch distributed checkpoint (no ", dcp::kMetadataFile,
               ", no shard-*.safetensors); write one with torch.distributed.checkpoint.save");
    Catalog c = fs::is_regular_file(root / dcp::kMetadataFile, ec) ? catalog_torch_save(root, damaged)
                                                                    : catalog_safetensors(root, damaged);
    result.format = c.format;
    result.carried = read_carried_files(root, nullptr, name.empty() ? dir : name);
    Files files(c, damaged);
    const Slots slots = collect_slots(model, owners);
    bool with_slots = options.load_optimizer;
    if (with_slots && options.optimizer_if_present) {
      with_slots = std::any_of(c.tensors.begin(), c.tensors.end(),
                               [](const auto& t) { return t.first.rfind("optimizer.state.", 0) == 0; });
    }
    result.optimizer_loaded = with_slots;
    std::vector<LocalPart> parts = local_parts(model, slots, options.names, with_slots);
    // Model keys: "model.<name>" (a {"model": ...} state dict) or "<name>" (a model's own state dict).
    bool prefixed = true;
    if (!parts.empty() && c.tensors.count(parts.front().key) == 0 &&
        c.tensors.count(parts.front().key.substr(6)) == 1) {
      prefixed = false;
    }
    result.layout = options.names.name ? DcpLayout::kTorchtitan : DcpLayout::kTorch;
    {
      at::NoGradGuard no_grad;
      for (LocalPart& p : parts) {
        if (!prefixed && p.is_param) p.key = p.key.substr(6);
        p.shard.zero_();  // padding, and slots the checkpoint lacks (not required)
      }
    }
    std::vector<Run> runs;
    std::string example = c.tensors.empty() ? std::string("none") : c.tensors.begin()->first;
    for (const LocalPart& p : parts) {
      const auto it = c.tensors.find(p.key);
      if (it == c.tensors.end()) {
        FSDP_CHECK(!p.is_param, "DCP checkpoint ", dir, " has no tensor '", p.key, "' for parameter '", p.ours,
                   "' (it holds ", c.tensors.size(), " tensors, e.g. '", example, "'): another model, or another "
                   "layout (DcpLoadOptions::names for torch's or torchtitan's keys)");
        FSDP_CHECK(!p.required, "DCP checkpoint ", dir, " holds no optimizer state '", p.key, "', so it cannot "
                   "resume training; load its weights with DcpLoadOptions::load_optimizer = false instead");
        continue;
      }
      const SavedTensor& t = it->second;
      FSDP_CHECK(t.size == p.shape, "DCP checkpoint ", dir, " holds a different model: '", p.key, "' has shape ",
                 c10::IntArrayRef(t.size), " there but ", c10::IntArrayRef(p.shape), " in this model (parameter '",
                 p.ours, "')");
      plan_part(p, t, c, options.names, damaged, &runs);  // Note [Chunks cover once]
    }
    for (const Run& r : runs) resolve(c.sources[r.source], files, damaged);
    bytes_read = read_runs(runs, c, files);
    check_finite(parts, c, damaged);
    // The step count: PyTorch's per-parameter step (the same for all), else torchtitan's train_state.step.
    if (with_slots) {
      for (const LocalPart& p : parts) {
        if (p.is_param) continue;
        const std::string key = p.key.substr(0, p.key.rfind('.')) + ".step";
        if (const auto it = c.tensors.find(key); it != c.tensors.end()) {
          result.optimizer_step = static_cast<int64_t>(read_scalar(c, it->second, files, key, damaged));
          break;
        }
      }
      if (const auto it = c.tensors.find("train_state.step"); result.optimizer_step < 0 && it != c.tensors.end()) {
        result.optimizer_step = static_cast<int64_t>(read_scalar(c, it->second, files, "train_state.step", damaged));
      }
    }
    // The owners' metadata when we wrote the checkpoint.
    std::string text = c.state_json;
    if (const auto it = c.values.find(kStateKey); it != c.values.end()) {
      const dcp::StorageInfo& where = it->second;
      const size_t f = file_index(c, (root / where.relative_path).string());
      Files more(c, damaged);
      const dcp::ReadAt read = [&](int64_t off, int64_t n, void* dst) { more.read(f, where.offset + off, n, dst); };
      try {
        const dcp::PyValue v = dcp::read_value_item(read, where.length, kStateKey);
        if (v.kind == pickle::Kind::kStr) text = v.s;
      } catch (const pickle::PickleError& e) {
        damaged(where.relative_path, e.what());
      }
    }
    if (!text.empty()) {
      state = json_object_of(text, kStateKey, "the owners' metadata", damaged);
    }
  });
  const Agreement all = agree(group, status);
  if (!all.ok()) {
    const RankStatus& d = all.decision();
    if (d.kind == RankStatus::Kind::kDamaged) {
      const std::string prefix = detail::cat("checkpoint ", name, " is damaged: file ", d.file, ": ");
      const std::string why = d.message.rfind(prefix, 0) == 0 ? d.message.substr(prefix.size()) : d.message;
      throw DamagedCheckpoint(name, d.file, detail::cat(why, " (found by rank ", all.deciding_rank(), ")"));
    }
    all.raise_if_failed("loading DCP checkpoint " + dir + " failed");
  }
  if (result.optimizer_loaded && state.is_object()) {
    for (StateOwner* o : owners) {
      const std::string key = o->state_key();
      hand_saved_state(*o, state.contains(key) ? state[key] : nlohmann::json(), name, kStateKey);
    }
  }
  at::Tensor total = at::full({1}, static_cast<double>(bytes_read), at::kDouble);
  if (group.size() > 1) group.all_reduce(total, comm::ReduceOp::kSum)->wait();
  result.state = state;
  result.io = IoStats{static_cast<int64_t>(total.item<double>()), io::now_seconds() - t0};
  return result;
}

}  // namespace fsdp::checkpoint

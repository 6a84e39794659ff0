#include "dcp_format.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <tuple>

namespace fsdp::checkpoint::dcp {

using pickle::Kind;
using pickle::PickleError;
using pickle::Value;

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";
constexpr int64_t kMaxDataPkl = 64 << 20;  // bytes of an item's data.pkl
constexpr int64_t kMaxDims = 16;

const std::vector<std::pair<at::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, std::string>> names = {
      {at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kHalf, "float16"}, {at::kDouble, "float64"},
      {at::kLong, "int64"},    {at::kInt, "int32"},         {at::kShort, "int16"},  {at::kChar, "int8"},
      {at::kByte, "uint8"},    {at::kBool, "bool"}};
  return names;
}

// torch.FloatStorage, ...: the legacy typed storages torch.save names.
const std::vector<std::pair<at::ScalarType, std::string>>& storage_names() {
  static const std::vector<std::pair<at::ScalarType, std::string>> names = {
      {at::kFloat, "FloatStorage"}, {at::kBFloat16, "BFloat16Storage"}, {at::kHalf, "HalfStorage"},
      {at::kDouble, "DoubleStorage"}, {at::kLong, "LongStorage"}, {at::kInt, "IntStorage"},
      {at::kShort, "ShortStorage"}, {at::kChar, "CharStorage"}, {at::kByte, "ByteStorage"},
      {at::kBool, "BoolStorage"}};
  return names;
}

template <class... A>
[[noreturn]] void bad(const std::string& origin, const A&... why) {
  throw PickleError(detail::cat(origin, ": ", why...));
}

const Value& need(const Value* v, const std::string& origin, const std::string& what) {
  if (v == nullptr) bad(origin, "has no ", what);
  return *v;
}

// An object made from class `name` of `module`.
bool is_object(const Value& v, const char* module, const char* name) {
  return v.kind == Kind::kObject && v.cls->s == module && v.cls->name == name;
}

void expect_object(const Value& v, const char* module, const char* name, const std::string& origin,
                   const std::string& what) {
  if (!is_object(v, module, name)) {
    bad(origin, what, " is a ", v.kind == Kind::kObject ? v.global_name() : pickle::kind_name(v.kind), ", not ",
        module, ".", name);
  }
}

int64_t int_of(const Value& v, const std::string& origin, const std::string& what) {
  if (v.kind != Kind::kInt) bad(origin, what, " is a ", pickle::kind_name(v.kind), ", not an int");
  return v.i;
}

// torch.Size((a, b, ...)) -> {a, b, ...}
std::vector<int64_t> size_of(const Value& v, const std::string& origin, const std::string& what) {
  const Value* t = &v;
  if (v.kind == Kind::kObject) {
    expect_object(v, "torch", "Size", origin, what);
    if (v.items.size() != 1) bad(origin, what, ": torch.Size of ", v.items.size(), " arguments");
    t = v.items[0];
  }
  if (t->kind != Kind::kTuple && t->kind != Kind::kList) bad(origin, what, " is not a torch.Size or tuple");
  if (static_cast<int64_t>(t->items.size()) > kMaxDims) bad(origin, what, " has ", t->items.size(), " dimensions");
  std::vector<int64_t> out;
  for (const Value* x : t->items) {
    const int64_t n = int_of(*x, origin, what);
    if (n < 0) bad(origin, what, " has a negative entry ", n);
    out.push_back(n);
  }
  return out;
}

at::ScalarType dtype_of(const Value& v, const std::string& origin, const std::string& what) {
  if (v.kind != Kind::kGlobal || v.s != "torch") bad(origin, what, " is not a torch dtype");
  const at::ScalarType t = dtype_from_name(v.name);
  if (t == at::ScalarType::Undefined) bad(origin, what, " torch.", v.name, " is not a dtype this reader supports");
  return t;
}

// The checked product of `sizes` (elements), or an error for an overflow.
int64_t product(const std::vector<int64_t>& sizes, const std::string& origin, const std::string& what) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / 8 / s) bad(origin, what, " is too large");
    n *= s;
  }
  return n;
}

// Note [Materialized volume] (issue 50)
// A pickle's values form a graph, not a tree: memo GET and DUP share a value
// for two bytes, so a 124-byte pickle reaches 2^60 leaves when its values are
// walked as a tree (a tuple of two references to the tuple before, 60 times).
// What a reader copies out of the values (entries, chunks, strings) is
// therefore bounded by the input's own size times a margin no pickle that
// Python writes comes near: Python shares a value only where one object is
// referenced twice (a dtype, a class), never to repeat a tensor's metadata.
class Budget {
 public:
  Budget(size_t input_bytes, const std::string& origin)
      : limit_(kFactor * static_cast<int64_t>(input_bytes) + kSlack), left_(limit_), origin_(origin) {}
  // `n` more values or bytes copied out.
  void spend(int64_t n) {
    left_ -= n;
    if (left_ < 0) {
      bad(origin_, "its values would expand to more than ", limit_, " entries and bytes (", kFactor,
          " times the pickle's size): values shared through the memo so that reading them copies far more than the "
          "file holds — a damaged or hostile pickle, not one PyTorch writes");
    }
  }

 private:
  static constexpr int64_t kFactor = 16;
  static constexpr int64_t kSlack = 4096;
  int64_t limit_;
  int64_t left_;
  std::string origin_;
};

// Note [Chunks cover once] (issue 50): a tensor's chunks hold each element
// exactly once. Their element count equal to the tensor's is not enough —
// chunks that overlap and leave a gap hold as many — but with it, pairwise
// disjoint chunks cover the tensor. Checked here by a sweep along the first
// dimension (a chunk is compared only with those whose rows it meets: one
// neighbour for a row-sharded tensor, the tensor-parallel degree for a 2-D
// layout) within a budget of comparisons; a layout past the budget is left
// to the loader, which checks every line it reads (dcp.cpp, plan_part), so
// no layout loads a gap or an overlap either way.
void check_disjoint(const std::string& what, const std::vector<Chunk>& chunks, const std::string& origin,
                    int64_t& budget) {
  if (chunks.size() < 2 || chunks[0].offsets.empty()) return;
  std::vector<const Chunk*> order;
  for (const Chunk& c : chunks) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Chunk* a, const Chunk* b) { return a->offsets < b->offsets; });
  auto meet = [](const Chunk& a, const Chunk& b) {
    for (size_t d = 0; d < a.offsets.size(); ++d) {
      if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
    }
    return a.numel() > 0 && b.numel() > 0;
  };
  auto at = [](const Chunk& c) {
    std::string s;
    for (int64_t x : c.offsets) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return "(" + s + ")";
  };
  std::vector<const Chunk*> active;  // chunks whose rows reach the current one's first row
  for (const Chunk* c : order) {
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](const Chunk* a) { return a->offsets[0] + a->sizes[0] <= c->offsets[0]; }),
                 active.end());
    for (const Chunk* a : active) {
      if (--budget < 0) return;  // the loader's line check covers the rest
      if (meet(*a, *c)) {
        bad(origin, what, ": its chunks at offsets ", at(*a), " and ", at(*c), " overlap (chunks must cover the "
            "tensor exactly once)");
      }
    }
    active.push_back(c);
  }
}

}  // namespace

int64_t Chunk::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool ItemKey::operator<(const ItemKey& o) const {
  return std::tie(fqn, tensor, offsets) < std::tie(o.fqn, o.tensor, o.offsets);
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [t, n] : dtype_names()) {
    if (n == name) return t;
  }
  return at::ScalarType::Undefined;
}

std::string dtype_to_name(at::ScalarType t) {
  for (const auto& [d, n] : dtype_names()) {
    if (d == t) return n;
  }
  FSDP_CHECK(false, "DCP: tensors of dtype ", t, " are not supported");
  return "";
}

const pickle::AllowList& metadata_allow_list() {
  static const pickle::AllowList allowed = [] {
    pickle::AllowList a = {{kMetadataModule, "Metadata"},
                           {kMetadataModule, "TensorStorageMetadata"},
                           {kMetadataModule, "BytesStorageMetadata"},
                           {kMetadataModule, "ChunkStorageMetadata"},
                           {kMetadataModule, "TensorProperties"},
                           {kMetadataModule, "MetadataIndex"},
                           {kMetadataModule, "StorageMeta"},
                           {kMetadataModule, "_MEM_FORMAT_ENCODING"},
                           {kFilesystemModule, "_StorageInfo"},
                           {"torch", "Size"},
                           {"torch.serialization", "_get_layout"},
                           {"builtins", "getattr"},
                           {"__builtin__", "getattr"},  // protocol 2 names builtins as Python 2 did
                           {"collections", "OrderedDict"},
                           {"pathlib", "PosixPath"},
                           {"pathlib", "PurePosixPath"},
                           {"pathlib", "WindowsPath"},
                           {"pathlib", "PureWindowsPath"}};
    for (const auto& [t, n] : dtype_names()) a.insert({"torch", n});
    return a;
  }();
  return allowed;
}

const pickle::AllowList& item_allow_list() {
  static const pickle::AllowList allowed = [] {
    pickle::AllowList a = {{"torch._utils", "_rebuild_tensor_v2"}, {"collections", "OrderedDict"}};
    for (const auto& [t, n] : storage_names()) a.insert({"torch", n});
    return a;
  }();
  return allowed;
}

Metadata parse_metadata(const std::string& bytes, const std::string& origin) {
  const pickle::Pickled p = pickle::read(bytes, metadata_allow_list(), origin);
  const Value& root = *p.root;
  expect_object(root, kMetadataModule, "Metadata", origin, "the pickled object");
  Budget budget(bytes.size(), origin);  // Note [Materialized volume]
  int64_t comparisons = 1'000'000 + 64 * static_cast<int64_t>(bytes.size() / 16);  // Note [Chunks cover once]
  Metadata m;
  const Value& sdm = need(root.get("state_dict_metadata"), origin, "state_dict_metadata");
  if (sdm.kind != Kind::kDict) bad(origin, "state_dict_metadata is not a dict");
  for (size_t k = 0; k + 1 < sdm.items.size(); k += 2) {
    const std::string& fqn = sdm.items[k]->as_str("a state_dict_metadata key");
    const Value& v = *sdm.items[k + 1];
    budget.spend(1 + static_cast<int64_t>(fqn.size()));
    const std::string what = "state_dict_metadata['" + fqn + "']";
    if (is_object(v, kMetadataModule, "BytesStorageMetadata")) {
      m.bytes.push_back(fqn);
      continue;
    }
    expect_object(v, kMetadataModule, "TensorStorageMetadata", origin, what);
    TensorMeta t;
    const Value& props = need(v.get("properties"), origin, what + ".properties");
    expect_object(props, kMetadataModule, "TensorProperties", origin, what + ".properties");
    const Value* dtype = nullptr;
    if (props.state != nullptr && props.state->kind == Kind::kTuple && !props.state->items.empty()) {
      dtype = props.state->items[0];  // __getstate__: (dtype, layout, requires_grad, memory format, pin_memory)
    } else {
      dtype = props.get("dtype");  // written without __getstate__
    }
    t.dtype = dtype_of(need(dtype, origin, what + ".properties.dtype"), origin, what + ".properties.dtype");
    t.size = size_of(need(v.get("size"), origin, what + ".size"), origin, what + ".size");
    const int64_t numel = product(t.size, origin, what + ".size");
    const Value& chunks = need(v.get("chunks"), origin, what + ".chunks");
    if (chunks.kind != Kind::kList) bad(origin, what, ".chunks is not a list");
    int64_t covered = 0;
    for (const Value* c : chunks.items) {
      expect_object(*c, kMetadataModule, "ChunkStorageMetadata", origin, what + ".chunks[]");
      budget.spend(1 + 2 * static_cast<int64_t>(t.size.size()));
      Chunk ch;
      ch.offsets = size_of(need(c->get("offsets"), origin, what + " chunk offsets"), origin, what + " chunk offsets");
      ch.sizes = size_of(need(c->get("sizes"), origin, what + " chunk sizes"), origin, what + " chunk sizes");
      if (ch.offsets.size() != t.size.size() || ch.sizes.size() != t.size.size()) {
        bad(origin, what, " has a chunk of ", ch.sizes.size(), " dimensions in a tensor of ", t.size.size());
      }
      for (size_t d = 0; d < t.size.size(); ++d) {
        if (ch.offsets[d] > t.size[d] || ch.sizes[d] > t.size[d] - ch.offsets[d]) {
          bad(origin, what, " has a chunk outside the tensor in dimension ", d, " (offset ", ch.offsets[d], ", size ",
              ch.sizes[d], ", tensor ", t.size[d], ")");
        }
      }
      covered += product(ch.sizes, origin, what + " chunk");
      if (covered > numel) bad(origin, what, ": its chunks hold more than the tensor's ", numel, " elements (they overlap)");
      t.chunks.push_back(std::move(ch));
    }
    if (covered != numel) {
      bad(origin, what, ": its chunks hold ", covered, " elements, the tensor has ", numel,
          " (chunks overlap or leave a gap)");
    }
    check_disjoint(what, t.chunks, origin, comparisons);  // Note [Chunks cover once]
    m.tensors[fqn] = std::move(t);
  }
  if (const Value* pd = root.get("planner_data"); pd != nullptr && pd->kind == Kind::kDict) {
    for (size_t k = 0; k + 1 < pd->items.size(); k += 2) {
      const Value& path = *pd->items[k + 1];
      if (pd->items[k]->kind != Kind::kStr || (path.kind != Kind::kTuple && path.kind != Kind::kList)) continue;
      std::vector<std::string> parts;
      budget.spend(1 + static_cast<int64_t>(pd->items[k]->s.size()));
      for (const Value* x : path.items) {
        budget.spend(1 + static_cast<int64_t>(x->s.size()));
        if (x->kind == Kind::kStr) {
          parts.push_back(x->s);
        } else if (x->kind == Kind::kInt) {
          parts.push_back(std::to_string(x->i));
        }
      }
      m.planner_data[pd->items[k]->s] = parts;
    }
  }
  const Value& sd = need(root.get("storage_data"), origin, "storage_data");
  if (sd.kind != Kind::kDict) bad(origin, "storage_data is not a dict (", pickle::kind_name(sd.kind), ")");
  for (size_t k = 0; k + 1 < sd.items.size(); k += 2) {
    const Value& idx = *sd.items[k];
    const Value& info = *sd.items[k + 1];
    expect_object(idx, kMetadataModule, "MetadataIndex", origin, "a storage_data key");
    expect_object(info, kFilesystemModule, "_StorageInfo", origin, "a storage_data value");
    ItemKey key;
    key.fqn = need(idx.get("fqn"), origin, "MetadataIndex.fqn").as_str("MetadataIndex.fqn");
    const Value* off = idx.get("offset");
    key.tensor = off != nullptr && off->kind != Kind::kNone;
    if (key.tensor) key.offsets = size_of(*off, origin, "MetadataIndex('" + key.fqn + "').offset");
    StorageInfo s;
    s.relative_path = need(info.get("relative_path"), origin, "_StorageInfo.relative_path").as_str("relative_path");
    budget.spend(1 + static_cast<int64_t>(key.fqn.size() + key.offsets.size() + s.relative_path.size()));
    s.offset = int_of(need(info.get("offset"), origin, "_StorageInfo.offset"), origin, "_StorageInfo.offset");
    s.length = int_of(need(info.get("length"), origin, "_StorageInfo.length"), origin, "_StorageInfo.length");
    if (const Value* tr = info.get("transform_descriptors");
        tr != nullptr && tr->kind != Kind::kNone && !tr->items.empty()) {
      bad(origin, "item '", key.fqn, "' is stored through a stream transform (a DCP extension such as compression), "
          "which this reader does not support; save without _extensions");
    }
    if (s.relative_path.empty() || s.relative_path.find('/') != std::string::npos || s.relative_path[0] == '.') {
      bad(origin, "item '", key.fqn, "' lies in '", s.relative_path, "', not a file of the checkpoint directory");
    }
    if (s.offset < 0 || s.length <= 0) bad(origin, "item '", key.fqn, "' has offset ", s.offset, ", length ", s.length);
    m.storage[key] = s;
  }
  for (const auto& [fqn, t] : m.tensors) {
    for (const Chunk& c : t.chunks) {
      if (m.storage.count({fqn, true, c.offsets}) == 0) {
        bad(origin, "the chunk of '", fqn, "' at offsets (", c.offsets.size() ? std::to_string(c.offsets[0]) : "",
            c.offsets.size() > 1 ? ", ..." : "", ") has no storage entry");
      }
    }
  }
  for (const std::string& fqn : m.bytes) {
    if (m.storage.count({fqn, false, {}}) == 0) bad(origin, "the value '", fqn, "' has no storage entry");
  }
  if (const Value* v = root.get("version"); v != nullptr && v->kind == Kind::kStr) m.version = v->s;
  return m;
}

std::string write_metadata(const Metadata& m, const std::string& checkpoint_id, const std::string& save_id) {
  pickle::Builder b;
  auto g = [&](const char* name) { return b.global(kMetadataModule, name); };
  auto size = [&](const std::vector<int64_t>& s) {
    std::vector<const Value*> xs;
    for (int64_t x : s) xs.push_back(b.integer(x));
    return b.object(b.global("torch", "Size"), b.tuple({b.tuple(xs)}));
  };
  auto dataclass = [&](const Value* cls, std::vector<const Value*> fields) {
    return b.object(cls, b.tuple({}), b.dict(std::move(fields)), /*newobj=*/true);
  };
  // state_dict_metadata: tensors and values in the order of the flattened state dict's keys.
  std::vector<const Value*> sdm;
  for (const auto& [fqn, t] : m.tensors) {
    std::vector<const Value*> chunks;
    for (const Chunk& c : t.chunks) {
      chunks.push_back(dataclass(g("ChunkStorageMetadata"),
                                 {b.str("offsets"), size(c.offsets), b.str("sizes"), size(c.sizes)}));
    }
    const Value* contiguous =
        b.object(b.global("builtins", "getattr"), b.tuple({g("_MEM_FORMAT_ENCODING"), b.str("TORCH_CONTIGUOUS_FORMAT")}));
    const Value* props = b.object(
        g("TensorProperties"), b.tuple({}),
        b.tuple({b.global("torch", dtype_to_name(t.dtype)),
                 b.object(b.global("torch.serialization", "_get_layout"), b.tuple({b.str("torch.strided")})),
                 b.boolean(false), contiguous, b.boolean(false)}),
        /*newobj=*/true);
    sdm.push_back(b.str(fqn));
    sdm.push_back(dataclass(g("TensorStorageMetadata"), {b.str("properties"), props, b.str("size"), size(t.size),
                                                          b.str("chunks"), b.list(chunks)}));
  }
  for (const std::string& fqn : m.bytes) {
    sdm.push_back(b.str(fqn));
    sdm.push_back(b.object(g("BytesStorageMetadata"), b.tuple({}), nullptr, /*newobj=*/true));
  }
  std::vector<const Value*> planner;
  for (const auto& [fqn, parts] : m.planner_data) {
    std::vector<const Value*> xs;
    for (const std::string& p : parts) {
      const bool digits = !p.empty() && p.size() < 10 && p.find_first_not_of("0123456789") == std::string::npos;
      xs.push_back(digits ? b.integer(std::stoll(p)) : b.str(p));  // list indices are ints
    }
    planner.push_back(b.str(fqn));
    planner.push_back(b.tuple(xs));
  }
  std::vector<const Value*> storage;
  std::map<std::string, int64_t> index;  // chunk index within its tensor
  for (const auto& [key, s] : m.storage) {
    std::vector<const Value*> idx = {b.str("fqn"), b.str(key.fqn)};
    if (key.tensor) {
      int64_t i = 0;
      const auto t = m.tensors.find(key.fqn);
      if (t != m.tensors.end()) {
        for (size_t c = 0; c < t->second.chunks.size(); ++c) {
          if (t->second.chunks[c].offsets == key.offsets) i = static_cast<int64_t>(c);
        }
      }
      idx.insert(idx.end(), {b.str("index"), b.integer(i), b.str("offset"), size(key.offsets)});
    } else {
      idx.insert(idx.end(), {b.str("index"), b.none(), b.str("offset"), b.none()});
    }
    storage.push_back(dataclass(g("MetadataIndex"), idx));
    storage.push_back(dataclass(b.global(kFilesystemModule, "_StorageInfo"),
                                {b.str("relative_path"), b.str(s.relative_path), b.str("offset"), b.integer(s.offset),
                                 b.str("length"), b.integer(s.length)}));
  }
  const Value* meta = dataclass(
      g("StorageMeta"), {b.str("checkpoint_id"), b.object(b.global("pathlib", "PosixPath"), b.tuple({b.str(checkpoint_id)})),
                         b.str("save_id"), b.str(save_id), b.str("load_id"), b.none(), b.str("modules"), b.list({})});
  const Value* root = dataclass(g("Metadata"), {b.str("state_dict_metadata"), b.dict(sdm), b.str("planner_data"),
                                               b.dict(planner), b.str("storage_data"), b.dict(storage),
                                               b.str("storage_meta"), meta, b.str("version"), b.str(m.version)});
  return pickle::write(*root, 4);
}

// ---- torch.save archives ----------------------------------------------------------

namespace {

// The bytes of one item, through the caller's bounded reader.
class ItemAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  ItemAdapter(const ReadAt& read, int64_t length) : read_(read), length_(length) {}
  size_t size() const override { return static_cast<size_t>(length_); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= static_cast<uint64_t>(length_)) return 0;
    n = std::min<size_t>(n, static_cast<size_t>(length_ - static_cast<int64_t>(pos)));
    read_(static_cast<int64_t>(pos), static_cast<int64_t>(n), buf);
    return n;
  }

 private:
  const ReadAt& read_;
  int64_t length_;
};

// Runs f on the archive's reader; a zip error becomes a PickleError naming `origin`.
template <class F>
auto with_archive(const ReadAt& read, int64_t length, const std::string& origin, F&& f) {
  try {
    caffe2::serialize::PyTorchStreamReader zip(std::make_shared<ItemAdapter>(read, length));
    return f(zip);
  } catch (const c10::Error& e) {
    bad(origin, "not a torch.save archive (", e.what_without_backtrace(), ")");
  }
}

std::string data_pkl(caffe2::serialize::PyTorchStreamReader& zip, const std::string& origin) {
  if (!zip.hasRecord("data.pkl")) bad(origin, "the archive has no data.pkl");
  const int64_t n = static_cast<int64_t>(zip.getRecordSize("data.pkl"));
  if (n > kMaxDataPkl) bad(origin, "data.pkl of ", n, " bytes (at most ", kMaxDataPkl, ")");
  std::string s(static_cast<size_t>(n), '\0');
  zip.getRecord("data.pkl", s.data(), s.size());
  return s;
}

PyValue py_value(const Value& v, const std::string& origin, int depth, Budget& budget) {
  if (depth > pickle::kMaxDepth) bad(origin, "a value nested deeper than ", pickle::kMaxDepth, " levels");
  budget.spend(1 + static_cast<int64_t>(v.s.size()));  // Note [Materialized volume]
  PyValue out;
  out.kind = v.kind;
  switch (v.kind) {
    case Kind::kNone: break;
    case Kind::kBool: out.b = v.b; break;
    case Kind::kInt: out.i = v.i; break;
    case Kind::kFloat: out.f = v.f; break;
    case Kind::kStr:
    case Kind::kBytes: out.s = v.s; break;
    case Kind::kTuple:
    case Kind::kList:
      for (const Value* x : v.items) out.items.push_back(py_value(*x, origin, depth + 1, budget));
      break;
    default: bad(origin, "holds a ", pickle::kind_name(v.kind), " where a plain value was expected");
  }
  return out;
}

const Value* py_to_pickle(pickle::Builder& b, const PyValue& v, int depth) {
  FSDP_CHECK(depth < pickle::kMaxDepth, "DCP: a value nested deeper than ", pickle::kMaxDepth, " levels");
  std::vector<const Value*> xs;
  switch (v.kind) {
    case Kind::kNone: return b.none();
    case Kind::kBool: return b.boolean(v.b);
    case Kind::kInt: return b.integer(v.i);
    case Kind::kFloat: return b.real(v.f);
    case Kind::kStr: return b.str(v.s);
    case Kind::kBytes: return b.bytes(v.s);
    case Kind::kTuple:
    case Kind::kList:
      for (const PyValue& x : v.items) xs.push_back(py_to_pickle(b, x, depth + 1));
      return v.kind == Kind::kTuple ? b.tuple(xs) : b.list(xs);
    default: break;
  }
  FSDP_ASSERT(false, "DCP: cannot write a ", pickle::kind_name(v.kind));
  return nullptr;
}

// torch.save's records around data.pkl, as torch.serialization._save writes them.
// The sink's error (a full disk: it names the file and says so) is what the
// caller gets. It must not pass through the zip writer: thrown from inside
// miniz, it left the writer's position behind, and the writer's next record
// replaced it with "unexpected pos 704 vs 598" (issue 50). So the first error
// is kept, the writer is told every byte went (nothing more is written), and
// the error is raised once the archive is done.
void archive(const std::string& pkl, const at::Tensor* data, const Sink& sink) {
  std::exception_ptr failed;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* p, size_t n) {
      if (failed) return n;
      try {
        sink(p, n);
      } catch (...) {
        failed = std::current_exception();
      }
      return n;
    });
    zip.writeRecord("data.pkl", pkl.data(), pkl.size());
    zip.writeRecord(".format_version", "1", 1);
    zip.writeRecord(".storage_alignment", "64", 2);
    zip.writeRecord("byteorder", "little", 6);
    if (data != nullptr) zip.writeRecord("data/0", data->data_ptr(), static_cast<size_t>(data->nbytes()));
    zip.writeEndOfFile();
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

TensorRecord read_tensor_item(const ReadAt& read, int64_t length, const std::string& origin) {
  return with_archive(read, length, origin, [&](caffe2::serialize::PyTorchStreamReader& zip) {
    const std::string pkl = data_pkl(zip, origin);
    const pickle::Pickled p = pickle::read(pkl, item_allow_list(), origin + " data.pkl");
    const Value& t = *p.root;
    if (!is_object(t, "torch._utils", "_rebuild_tensor_v2") || t.items.size() < 4) {
      bad(origin, "data.pkl holds ", t.global_name(), ", not a tensor (torch._utils._rebuild_tensor_v2)");
    }
    const Value& pid = *t.items[0];
    if (pid.kind != Kind::kPersistent || pid.items[0]->kind != Kind::kTuple || pid.items[0]->items.size() != 5) {
      bad(origin, "data.pkl: the tensor's storage is not a persistent id ('storage', type, key, location, numel)");
    }
    const auto& id = pid.items[0]->items;
    if (id[0]->kind != Kind::kStr || id[0]->s != "storage" || id[1]->kind != Kind::kGlobal) {
      bad(origin, "data.pkl: the tensor's storage id is malformed");
    }
    TensorRecord r;
    r.dtype = at::ScalarType::Undefined;
    for (const auto& [d, n] : storage_names()) {
      if (id[1]->name == n) r.dtype = d;
    }
    if (r.dtype == at::ScalarType::Undefined) bad(origin, "data.pkl: storage type ", id[1]->global_name());
    const std::string key = id[2]->as_str("the storage key");
    r.storage_numel = int_of(*id[4], origin, "the storage's size");
    r.storage_offset = int_of(*t.items[1], origin, "the storage offset");
    r.size = size_of(*t.items[2], origin, "the tensor's size");
    r.stride = size_of(*t.items[3], origin, "the tensor's stride");
    if (r.size.size() != r.stride.size()) bad(origin, "data.pkl: size and stride differ in length");
    const int64_t numel = product(r.size, origin, "the tensor");  // checked before the strides multiply sizes
    int64_t expect = 1;  // every partial product is at most numel (an empty tensor has no layout to check)
    for (size_t d = r.size.size(); numel > 0 && d-- > 0;) {
      if (r.size[d] != 1 && r.stride[d] != expect) {
        bad(origin, "holds a tensor that is not contiguous (stride ", r.stride[d], " in dimension ", d, "); this "
            "reader reads row-major chunks, as DCP writes them");
      }
      expect *= r.size[d];
    }
    const int64_t elem = static_cast<int64_t>(c10::elementSize(r.dtype));
    if (r.storage_numel > length / elem) bad(origin, "data.pkl: a storage of ", r.storage_numel, " elements in an item of ", length, " bytes");
    if (r.storage_numel < 0 || r.storage_offset < 0 || numel > r.storage_numel - r.storage_offset) {
      bad(origin, "data.pkl: a tensor of ", numel, " elements at offset ", r.storage_offset, " in a storage of ",
          r.storage_numel);
    }
    const std::string record = "data/" + key;
    if (key.empty() || key.find('/') != std::string::npos || !zip.hasRecord(record)) {
      bad(origin, "the archive has no record ", record, " for the tensor's storage");
    }
    const int64_t bytes = static_cast<int64_t>(zip.getRecordSize(record));
    if (bytes != r.storage_numel * elem) {
      bad(origin, "record ", record, " has ", bytes, " bytes, the storage needs ", r.storage_numel * elem);
    }
    r.data_offset = static_cast<int64_t>(zip.getRecordOffset(record));
    if (r.data_offset < 0 || r.data_offset > length - bytes) bad(origin, "record ", record, " lies outside the item");
    return r;
  });
}

PyValue read_value_item(const ReadAt& read, int64_t length, const std::string& origin) {
  return with_archive(read, length, origin, [&](caffe2::serialize::PyTorchStreamReader& zip) {
    const std::string pkl = data_pkl(zip, origin);
    const pickle::Pickled p = pickle::read(pkl, {}, origin + " data.pkl");
    Budget budget(pkl.size(), origin + " data.pkl");
    return py_value(*p.root, origin, 0, budget);
  });
}

void write_tensor_item(const at::Tensor& t, const Sink& sink) {
  FSDP_ASSERT(t.device().is_cpu() && t.is_contiguous(), "DCP: an item tensor must be contiguous on the CPU");
  std::string storage;
  for (const auto& [d, n] : storage_names()) {
    if (d == t.scalar_type()) storage = n;
  }
  FSDP_CHECK(!storage.empty(), "DCP: tensors of dtype ", t.scalar_type(), " are not supported");
  pickle::Builder b;
  std::vector<const Value*> size, stride;
  for (int64_t s : t.sizes()) size.push_back(b.integer(s));
  for (int64_t s : t.strides()) stride.push_back(b.integer(s));
  const Value* id = b.tuple({b.str("storage"), b.global("torch", storage), b.str("0"), b.str("cpu"), b.integer(t.numel())});
  const Value* root = b.object(
      b.global("torch._utils", "_rebuild_tensor_v2"),
      b.tuple({b.persistent(id), b.integer(0), b.tuple(size), b.tuple(stride), b.boolean(false),
               b.object(b.global("collections", "OrderedDict"), b.tuple({}))}));
  archive(pickle::write(*root, 2), &t, sink);
}

void write_value_item(const PyValue& v, const Sink& sink) {
  pickle::Builder b;
  archive(pickle::write(*py_to_pickle(b, v, 0), 2), nullptr, sink);
}

}  // namespace fsdp::checkpoint::dcp

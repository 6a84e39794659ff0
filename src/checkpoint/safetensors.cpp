#include "fsdp/checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "file_io.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/json_input.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

namespace fsdp::checkpoint {
namespace {

constexpr int64_t kMaxHeader = 100'000'000;  // Hugging Face's limit

struct DtypeInfo {
  const char* name;
  int64_t size;
  at::ScalarType type;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", 8, at::kDouble}, {"F32", 4, at::kFloat}, {"F16", 2, at::kHalf}, {"BF16", 2, at::kBFloat16},
    {"I64", 8, at::kLong},   {"I32", 4, at::kInt},   {"I16", 2, at::kShort}, {"I8", 1, at::kChar},
    {"U8", 1, at::kByte},    {"BOOL", 1, at::kBool},
};

const DtypeInfo* find_dtype(const std::string& s) {
  for (const auto& d : kDtypes) {
    if (s == d.name) return &d;
  }
  return nullptr;
}

std::string dtype_list() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

}  // namespace

int64_t safetensors_dtype_size(const std::string& dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  FSDP_CHECK(d != nullptr, "unknown safetensors dtype '", dtype, "'; known: ", dtype_list());
  return d->size;
}

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.name;
  }
  FSDP_CHECK(false, "dtype ", t, " has no safetensors name; use one of ", dtype_list());
  return "";
}

at::ScalarType scalar_type_of(const std::string& dtype) {
  const DtypeInfo* d = find_dtype(dtype);
  FSDP_CHECK(d != nullptr, "unknown safetensors dtype '", dtype, "'; known: ", dtype_list());
  return d->type;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- reader ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // Before opening: opening a FIFO blocks until something writes to it.
  require_regular_file(path, "safetensors file", "give the weights as regular .safetensors files");
  map_ = std::make_unique<io::MappedFile>(path);
  const int64_t size = static_cast<int64_t>(map_->size());
  auto bad = [&](const auto&... why) {
    detail::throw_usage(detail::cat("safetensors file ", path, " is malformed: ", why...,
                                    " — the file is damaged, truncated or not a safetensors file"));
  };
  if (size < 8) bad("it has ", size, " bytes, fewer than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, map_->data(), 8);
  if (n > static_cast<uint64_t>(kMaxHeader)) bad("header length ", n, " exceeds the limit of ", kMaxHeader, " bytes");
  if (static_cast<int64_t>(n) > size - 8) {
    bad("header length ", n, " exceeds the file (", size, " bytes, so at most ", size - 8, ")");
  }
  data_offset_ = 8 + static_cast<int64_t>(n);
  const int64_t data_size = size - data_offset_;
  const char* hp = reinterpret_cast<const char*>(map_->data() + 8);
  if (n == 0 || hp[0] != '{') bad("the header does not start with '{'");
  std::string why;
  std::optional<nlohmann::json> parsed = parse_json_input(std::string_view(hp, n), why);
  if (!parsed) bad("the header is not valid JSON (", why, ")");
  const nlohmann::json header = std::move(*parsed);
  if (!header.is_object()) bad("the header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__ value '", m.key(), "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad("entry '", key, "' is not an object");
    SafetensorsEntry e;
    e.name = key;
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("tensor '", key, "' has no string 'dtype'");
    e.dtype = v["dtype"].get<std::string>();
    const DtypeInfo* d = find_dtype(e.dtype);
    if (d == nullptr) bad("tensor '", key, "' has unknown dtype '", e.dtype, "' (known: ", dtype_list(), ")");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("tensor '", key, "' has no 'shape' array");
    for (const auto& x : v["shape"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) bad("tensor '", key, "' has a bad shape entry ", x.dump());
      e.shape.push_back(x.get<int64_t>());
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      bad("tensor '", key, "' has no 'data_offsets' [begin, end]");
    }
    for (const auto& x : v["data_offsets"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) bad("tensor '", key, "' has bad data_offsets ", v["data_offsets"].dump());
    }
    e.begin = v["data_offsets"][0].get<int64_t>();
    e.end = v["data_offsets"][1].get<int64_t>();
    if (e.begin > e.end) bad("tensor '", key, "' has data_offsets [", e.begin, ", ", e.end, "] with begin > end");
    int64_t expect = d->size;  // bytes; a shape whose size overflows is refused (tests/fuzz found it)
    for (int64_t x : e.shape) {
      if (__builtin_mul_overflow(expect, x, &expect)) {
        bad("tensor '", key, "' has shape ", shape_str(e.shape), ", whose size in bytes overflows 64 bits");
      }
    }
    if (e.end - e.begin != expect) {
      bad("tensor '", key, "' (", e.dtype, " ", shape_str(e.shape), ") needs ", expect, " bytes but data_offsets [",
          e.begin, ", ", e.end, "] hold ", e.end - e.begin);
    }
    if (e.end > data_size) {
      bad("tensor '", key, "' data_offsets [", e.begin, ", ", e.end, "] are out of range: the data section has ",
          data_size, " bytes");
    }
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < entries_.size(); ++i) {
    const auto& a = entries_[i - 1];
    const auto& b = entries_[i];
    if (b.begin < a.end) {
      bad("tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", b.name, "' [", b.begin, ", ", b.end,
          ") overlap");
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const uint8_t* SafetensorsFile::bytes(const SafetensorsEntry& e) const {
  return map_->data() + data_offset_ + e.begin;
}

void SafetensorsFile::read_as_float(const SafetensorsEntry& e, int64_t first, int64_t count, float* out) const {
  FSDP_ASSERT(first >= 0 && count >= 0 && first + count <= e.numel(), "elements [", first, ", ", first + count,
              ") outside tensor '", e.name, "' of ", e.numel(), " elements");
  const uint8_t* p = bytes(e);
  if (e.dtype == "F32") {
    // An empty tensor's bytes may be nowhere: memcpy from null is undefined even for 0 bytes.
    if (count > 0) std::memcpy(out, p + first * 4, static_cast<size_t>(count) * 4);
  } else if (e.dtype == "BF16") {
    const uint8_t* q = p + first * 2;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b;
      std::memcpy(&b, q + i * 2, 2);
      out[i] = bf16_to_float(b);
    }
  } else if (e.dtype == "F16") {
    const uint8_t* q = p + first * 2;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b;
      std::memcpy(&b, q + i * 2, 2);
      out[i] = static_cast<float>(c10::Half(b, c10::Half::from_bits()));
    }
  } else if (e.dtype == "F64") {
    const uint8_t* q = p + first * 8;
    for (int64_t i = 0; i < count; ++i) {
      double v;
      std::memcpy(&v, q + i * 8, 8);
      out[i] = static_cast<float>(v);
    }
  } else {
    FSDP_CHECK(false, "tensor '", e.name, "' in ", path_, " has dtype ", e.dtype,
               "; model weights must be F32, BF16, F16 or F64");
  }
  // Weights are finite: a NaN or inf here would surface steps later as a NaN loss
  // blamed on the learning rate. (F64 values past float's range become inf.)
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) {
      FSDP_CHECK(false, "tensor '", e.name, "' in ", path_, " holds ", std::isnan(out[i]) ? "NaN" : "inf",
                 " at element ", first + i, e.dtype == "F64" ? " (or an F64 value outside float's range)" : "",
                 " — the weights are damaged; export them again from a run that had finite weights");
    }
  }
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  FSDP_CHECK(e != nullptr, "safetensors file ", path_, " has no tensor '", name, "'");
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(scalar_type_of(e->dtype)));
  if (e->end > e->begin) std::memcpy(t.data_ptr(), bytes(*e), static_cast<size_t>(e->end - e->begin));
  return t;
}

// ---- writer ------------------------------------------------------------------------

struct SafetensorsWriter::Impl {
  std::string path;
  std::vector<SafetensorsSpec> specs;
  io::File file;
  size_t next = 0;
};

std::string SafetensorsWriter::encode_header(const std::vector<SafetensorsSpec>& specs,
                                             const std::map<std::string, std::string>& metadata) {
  nlohmann::json h = nlohmann::json::object();
  int64_t off = 0;
  for (const auto& s : specs) {
    FSDP_CHECK(s.name != "__metadata__", "a tensor cannot be named __metadata__");
    FSDP_CHECK(!h.contains(s.name), "tensor '", s.name, "' is listed twice");
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    const int64_t n = numel * safetensors_dtype_size(s.dtype);
    h[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t len = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + json;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : impl_(std::make_unique<Impl>()) {
  const std::string header = encode_header(specs, metadata);
  file_size_ = static_cast<int64_t>(header.size());
  for (const auto& s : specs) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    file_size_ += numel * safetensors_dtype_size(s.dtype);
  }
  impl_->path = path;
  impl_->specs = std::move(specs);
  impl_->file = io::File::create(path);
  impl_->file.write_all(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const std::string& name, const at::Tensor& values) {
  FSDP_ASSERT(impl_->next < impl_->specs.size(), "safetensors writer for ", impl_->path, ": tensor '", name,
              "' beyond the ", impl_->specs.size(), " planned");
  const SafetensorsSpec& s = impl_->specs[impl_->next];
  FSDP_ASSERT(s.name == name, "safetensors writer for ", impl_->path, ": expected tensor '", s.name, "' next, got '",
              name, "'");
  int64_t numel = 1;
  for (int64_t d : s.shape) numel *= d;
  FSDP_ASSERT(values.numel() == numel, "tensor '", name, "' has ", values.numel(), " elements, planned ", numel);
  const at::Tensor t = values.to(at::kCPU).to(scalar_type_of(s.dtype)).contiguous();
  impl_->file.write_all(t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  ++impl_->next;
}

void SafetensorsWriter::finish() {
  FSDP_ASSERT(impl_->next == impl_->specs.size(), "safetensors writer for ", impl_->path, ": ", impl_->next, " of ",
              impl_->specs.size(), " tensors written");
  impl_->file.sync();
  impl_->file.close();
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, safetensors_dtype(t.scalar_type()), t.sizes().vec()});
  SafetensorsWriter w(path, specs, metadata);
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

}  // namespace fsdp::checkpoint

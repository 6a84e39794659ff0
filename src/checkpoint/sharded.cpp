#include "fsdp/checkpoint/sharded.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "carried.h"
#include "file_io.h"
#include "fsdp/checkpoint/ownership.h"
#include "manifest.h"
#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/remove.h"
#include "progress.h"
#include "save_job.h"
#include "shard_position.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kIoChunk = 16 << 20;  // bytes per write()/pread() call

// ---- small encodings ----------------------------------------------------------------

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    default: break;
  }
  FSDP_ASSERT(false, "checkpoint state tensor of unsupported dtype ", t);
  return "";
}

// ---- the state to save: per unit, named 1-D tensors of shard_numel elements ----------

struct UnitState {
  std::vector<std::pair<std::string, at::Tensor>> kinds;  // "param" first
  std::set<std::string> required;                         // kinds a load must find (for this unit)
};

// The model's shards ("param") and every owner's slots, by unit. A slot
// belongs to the unit whose shard it shadows (Note [State seam]).
std::vector<UnitState> collect_state(ShardedModel& model, const std::vector<StateOwner*>& owners) {
  const std::vector<ShardRef> shards = model.shards();
  const auto& units = model.units();
  FSDP_ASSERT(shards.size() == units.size(), shards.size(), " shards for ", units.size(), " units");
  std::vector<UnitState> out(units.size());
  std::map<const void*, size_t> unit_of;  // shard storage -> unit
  for (size_t u = 0; u < units.size(); ++u) {
    out[u].kinds.emplace_back("param", shards[u].param);
    out[u].required.insert("param");
    if (shards[u].param.numel() > 0) unit_of[shards[u].param.data_ptr()] = u;
  }
  std::set<std::string> keys;
  std::map<std::string, std::string> kind_owner;  // kind -> owner key
  kind_owner["param"] = "model";
  for (StateOwner* owner : owners) {
    FSDP_CHECK(owner != nullptr, "checkpoint: a null state owner");
    const std::string key = owner->state_key();
    FSDP_CHECK(keys.insert(key).second, "checkpoint: two state owners have the key '", key, "'; give each its own");
    for (StateSlot& slot : owner->state_slots()) {
      if (slot.value.numel() == 0 && slot.shadows.numel() == 0) continue;  // a unit without elements here
      auto [it, fresh] = kind_owner.emplace(slot.kind, key);
      FSDP_CHECK(it->second == key, "checkpoint: state owners '", it->second, "' and '", key, "' both have slots of kind '",
                 slot.kind, "'; a section is named by its kind, so kinds must differ between owners");
      (void)fresh;
      const auto u = slot.shadows.numel() > 0 ? unit_of.find(slot.shadows.data_ptr()) : unit_of.end();
      FSDP_CHECK(u != unit_of.end(), "checkpoint: state owner '", key, "' has a '", slot.kind, "' slot that shadows "
                 "no local shard of the model; build it from model.shards() (e.g. add_shards(model.shards()))");
      FSDP_CHECK(slot.value.numel() == units[u->second].shard_numel && slot.value.dim() == 1,
                 "checkpoint: state owner '", key, "' slot '", slot.kind, "' of unit '", units[u->second].name,
                 "' has shape ", slot.value.sizes(), ", expected (", units[u->second].shard_numel, ")");
      for (const auto& k : out[u->second].kinds) {
        FSDP_CHECK(k.first != slot.kind, "checkpoint: state owner '", key, "' has two '", slot.kind, "' slots for unit '",
                   units[u->second].name, "'");
      }
      out[u->second].kinds.emplace_back(slot.kind, slot.value);
      if (slot.required) out[u->second].required.insert(slot.kind);
    }
  }
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& [kind, t] : out[u].kinds) {
      FSDP_ASSERT(t.dim() == 1 && t.numel() == units[u].shard_numel, "unit ", u, " ", kind, " has shape ",
                  t.sizes(), ", expected (", units[u].shard_numel, ")");
    }
  }
  return out;
}

std::string shard_file_name(int64_t index, int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05lld-of-%05lld.bin", static_cast<long long>(index),
                static_cast<long long>(count));
  return buf;
}

// Streams bytes into a file, computing the whole-file and per-block CRC-32C.
class ChecksummedWriter {
 public:
  ChecksummedWriter(const std::string& path, int64_t block_size) : file_(io::File::create(path)), block_(block_size) {}

  void write(const uint8_t* p, int64_t n) {
    file_.write_all(p, static_cast<size_t>(n));
    crc_ = crc32c_extend(crc_, p, static_cast<size_t>(n));
    while (n > 0) {
      const int64_t take = std::min(n, block_ - in_block_);
      block_crc_ = crc32c_extend(block_crc_, p, static_cast<size_t>(take));
      in_block_ += take;
      p += take;
      n -= take;
      size_ += take;
      if (in_block_ == block_) flush_block();
    }
  }

  void finish() {
    if (in_block_ > 0) flush_block();
    file_.sync();
    file_.close();
  }

  int64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }
  const std::vector<uint32_t>& blocks() const { return blocks_; }

 private:
  void flush_block() {
    blocks_.push_back(block_crc_);
    block_crc_ = 0;
    in_block_ = 0;
  }

  io::File file_;
  int64_t block_;
  int64_t size_ = 0;
  int64_t in_block_ = 0;
  uint32_t crc_ = 0;
  uint32_t block_crc_ = 0;
  std::vector<uint32_t> blocks_;
};

// Reads each tensor through `stage` (its staged copy, or itself: Note [Save phases]).
nlohmann::json write_shard_file(const std::string& path, const std::vector<UnitState>& state,
                                const std::vector<UnitInfo>& units, const ShardPosition& pos, int64_t block_size,
                                const Stager& stage, io::Progress& progress) {
  ChecksummedWriter w(path, block_size);
  nlohmann::json sections = nlohmann::json::array();
  for (size_t u = 0; u < state.size(); ++u) {
    for (const auto& [kind, live] : state[u].kinds) {
      const at::Tensor tensor = stage(live);
      const at::Tensor t = tensor.device().is_cpu() ? tensor.contiguous() : tensor.to(at::kCPU).contiguous();
      sections.push_back({{"unit", u},
                          {"kind", kind},
                          {"dtype", dtype_name(t.scalar_type())},
                          {"flat_begin", pos.index * units[u].shard_numel},
                          {"numel", t.numel()},
                          {"offset", w.size()}});
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
      for (int64_t i = 0; i < n; i += kIoChunk) {
        const int64_t c = std::min(kIoChunk, n - i);
        w.write(p + i, c);
        progress.add(c);
      }
    }
  }
  w.finish();
  return {{"name", fs::path(path).filename().string()},
          {"size", w.size()},
          {"crc32c", hex32(w.crc())},
          {"shard_index", pos.index},
          {"block_crc32c", encode_words(w.blocks())},
          {"sections", sections}};
}

// ---- what is ours in --checkpoint-dir (Note [Ownership of what we delete]) -----------

constexpr const char* kLockFile = ".lock";

// N of "step_N" (8 or more digits), else nothing.
std::optional<int64_t> step_of(const std::string& name) {
  const std::string prefix = "step_";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() < 8 || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

// What interrupted saves leave: .tmp-step_N, .old-step_N and .del-step_N directories.
std::vector<fs::path> stale_temporaries(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* prefix : {".tmp-step_", ".old-step_", ".del-step_"}) {
      if (name.rfind(prefix, 0) == 0) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A save of step_N may replace an existing checkpoint step_N, never anything else of that name.
void check_checkpoint_name_free(const fs::path& final) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final, ec))) return;
  // A checkpoint linked in from elsewhere counts as one: a save replaces the link, never what it names.
  FSDP_CHECK(fs::is_directory(final, ec) && fs::exists(final / kManifest, ec), "cannot save ",
             final.string(), ": it exists and is not a checkpoint (no ", kManifest, "), and this program never "
             "overwrites what it did not write; move it out of --checkpoint-dir ", final.parent_path().string(),
             " and resume");
}

// ---- manifest -----------------------------------------------------------------------

// Every parameter of the model must be in the checkpoint with the same shape,
// and the checkpoint must hold no other parameters.
void check_compatible(const Manifest& m, const std::vector<UnitInfo>& units, const std::string& name) {
  std::set<std::string> seen;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      seen.insert(p.name);
      auto it = m.params.find(p.name);
      FSDP_CHECK(it != m.params.end(), "checkpoint ", name, " holds a different model: it has no parameter '", p.name,
                 "' ", shape_str(p.shape), "; resume with the model it was saved with (its config is in ", name, "/",
                 kManifest, ") or use another --checkpoint-dir");
      FSDP_CHECK(it->second.shape == p.shape, "checkpoint ", name, " holds a different model: parameter '", p.name,
                 "' has shape ", shape_str(it->second.shape), " there but ", shape_str(p.shape),
                 " in this model; resume with the model it was saved with (its config is in ", name, "/", kManifest,
                 ") or use another --checkpoint-dir");
    }
  }
  for (const auto& [pname, sp] : m.params) {
    FSDP_CHECK(seen.count(pname) == 1, "checkpoint ", name, " holds a different model: its parameter '", pname, "' ",
               shape_str(sp.shape), " is not in this model; resume with the model it was saved with or use another "
               "--checkpoint-dir");
  }
}

// Every state kind this run requires of a unit must be in the checkpoint for
// each of the unit's parameters. A kind the checkpoint lacks altogether
// (parameters only, or another optimizer) cannot resume training. A
// parameter frozen when the checkpoint was saved has no optimizer state in
// it: training it now would start its moments at zero under the run's step
// count, and AdamW's bias correction at step N assumes moments averaged over N
// steps: its updates would be up to ~6x too large for hundreds of steps. Such
// a resume is refused. The other way round (trainable then, frozen now) only
// leaves state this run does not use, and is allowed.
void check_required_kinds(const Manifest& m, const std::vector<UnitInfo>& units, const std::vector<UnitState>& state,
                          const std::string& name) {
  std::set<std::pair<int64_t, std::string>> saved;  // (saved unit, kind)
  for (const auto& f : m.files) {
    for (const auto& s : f.sections) saved.insert({s.unit, s.kind});
  }
  for (size_t u = 0; u < units.size(); ++u) {
    for (const std::string& kind : state[u].required) {
      if (kind == "param") continue;  // check_compatible
      FSDP_CHECK(m.kinds.count(kind) == 1, "checkpoint ", name, " holds no ", kind, " state; it cannot resume "
                 "training with this optimizer (resume with the one it was saved with, or start a new run from its "
                 "weights: --export-hf, then --init-from)");
      for (const auto& p : units[u].params) {
        FSDP_CHECK(saved.count({m.params.at(p.name).unit, kind}) == 1, "checkpoint ", name,
                   " was saved with parameter '", p.name, "' frozen, so it holds no optimizer state for it, but this "
                   "run trains it; resume with the --freeze and --lora-* flags it was saved with, or start a new run "
                   "from its weights (--export-hf, then --init-from)");
      }
    }
  }
}

// One contiguous byte range of a saved file going to one contiguous element
// range of a local state tensor.
struct ReadRequest {
  size_t file = 0;
  int64_t byte_offset = 0;
  int64_t count = 0;  // elements
  at::ScalarType src_dtype = at::kFloat;
  int64_t src_elem = 4;
  at::Tensor dst;     // 1-D local state tensor
  int64_t dst_offset = 0;
};

// Note [Resharding on load]. The saved and the current layouts share only
// parameter names and shapes. A parameter p (numel n) sits at flat offset f in
// its current unit and at f' in its saved unit. This rank's new shard covers
// [a, b) of the current unit's padded flat index space, so it needs p's
// elements [max(a, f), min(b, f + n)) - f: one contiguous range of p's
// row-major data, found at the same offsets from f' in the saved unit. Each
// saved file holds a contiguous range [k S', (k+1) S') of each saved unit's
// padded flat index space (one section per kind), so the range splits into at
// most ceil(size / S') + 1 byte ranges, one per file it touches. Consecutive
// parameters of one unit are consecutive in both layouts, so their ranges
// merge: with an unchanged layout each rank reads exactly one range per unit,
// kind and file. Padding (flat indices >= numel) is never read; it is zeroed.
std::vector<ReadRequest> plan_reads(const Manifest& m, const std::vector<UnitInfo>& units,
                                    const std::vector<UnitState>& state) {
  // (saved unit, kind) -> sections in files
  struct Where {
    size_t file;
    const SavedSection* section;
  };
  std::map<std::pair<int64_t, std::string>, std::vector<Where>> index;
  for (size_t f = 0; f < m.files.size(); ++f) {
    for (const auto& s : m.files[f].sections) index[{s.unit, s.kind}].push_back({f, &s});
  }
  std::vector<ReadRequest> out;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitInfo& ui = units[u];
    const int64_t lo_shard = ui.shard_offset;
    const int64_t hi_shard = ui.shard_offset + ui.shard_numel;
    // Kind by kind, parameter by parameter: consecutive parameters are
    // consecutive in the saved files too, so their requests merge.
    for (const auto& [kind, dst] : state[u].kinds) {
      for (const auto& p : ui.params) {
        const int64_t lo = std::max(lo_shard, p.flat_offset);
        const int64_t hi = std::min(hi_shard, p.flat_offset + p.numel);
        if (lo >= hi) continue;
        const SavedParam& sp = m.params.at(p.name);
        // param-local [x, y) -> saved flat [sfo + x, sfo + y)
        const int64_t s_lo = sp.flat_offset + (lo - p.flat_offset);
        const int64_t s_hi = sp.flat_offset + (hi - p.flat_offset);
        auto it = index.find({sp.unit, kind});
        if (it == index.end()) continue;  // a kind the checkpoint lacks stays zero
        for (const Where& w : it->second) {
          const SavedSection& s = *w.section;
          const int64_t a = std::max(s_lo, s.flat_begin);
          const int64_t b = std::min(s_hi, s.flat_begin + s.numel);
          if (a >= b) continue;
          ReadRequest r;
          r.file = w.file;
          r.byte_offset = s.offset + (a - s.flat_begin) * s.elem_size;
          r.count = b - a;
          r.src_dtype = s.dtype;
          r.src_elem = s.elem_size;
          r.dst = dst;
          r.dst_offset = (lo - lo_shard) + (a - s_lo);
          if (!out.empty()) {
            ReadRequest& q = out.back();
            if (q.file == r.file && q.dst.is_same(r.dst) && q.src_dtype == r.src_dtype &&
                q.byte_offset + q.count * q.src_elem == r.byte_offset && q.dst_offset + q.count == r.dst_offset) {
              q.count += r.count;
              continue;
            }
          }
          out.push_back(r);
        }
      }
    }
  }
  return out;
}

// Reads what `reads` need of one file: the requests' byte ranges widened to
// whole checksum blocks, merged where they touch, in windows of at most 64 MiB
// (each byte is read once), every block verified against the manifest before
// its bytes are used. Returns the bytes read.
int64_t read_file_ranges(const std::vector<const ReadRequest*>& reads, const SavedFile& f, int64_t block_size,
                         const std::string& checkpoint, std::vector<uint8_t>& buffer, io::Progress& progress) {
  io::File file;
  try {
    file = io::File::open_read(f.path, io::File::Links::kRefuse);
  } catch (const std::exception& e) {
    throw DamagedCheckpoint(checkpoint, f.name, e.what());
  }
  const int64_t window_blocks = std::max<int64_t>(1, (64 << 20) / block_size);
  auto first_block = [&](const ReadRequest* r) { return r->byte_offset / block_size; };
  auto end_block = [&](const ReadRequest* r) {
    return (r->byte_offset + r->count * r->src_elem + block_size - 1) / block_size;
  };
  int64_t bytes = 0;
  at::NoGradGuard no_grad;
  size_t i = 0;
  while (i < reads.size()) {
    // A span: requests whose block ranges overlap or touch.
    int64_t b0 = first_block(reads[i]);
    int64_t b1 = end_block(reads[i]);
    size_t j = i + 1;
    while (j < reads.size() && first_block(reads[j]) <= b1) b1 = std::max(b1, end_block(reads[j++]));
    for (int64_t wb = b0; wb < b1; wb += window_blocks) {
      const int64_t bn = std::min(window_blocks, b1 - wb);
      const int64_t off = wb * block_size;
      const int64_t len = std::min(bn * block_size, f.size - off);
      buffer.resize(static_cast<size_t>(len));
      try {
        file.pread_all(buffer.data(), static_cast<size_t>(len), off);
      } catch (const std::exception& e) {
        throw DamagedCheckpoint(checkpoint, f.name, strip_rank_tag(e.what()));
      }
      for (int64_t k = 0; k < bn; ++k) {
        const int64_t bo = k * block_size;
        const int64_t bl = std::min(block_size, len - bo);
        const uint32_t c = crc32c(buffer.data() + bo, static_cast<size_t>(bl));
        const uint32_t want = f.blocks[static_cast<size_t>(wb + k)];
        if (c != want) {
          throw DamagedCheckpoint(checkpoint, f.name,
                                  detail::cat("checksum mismatch in bytes [", off + bo, ", ", off + bo + bl,
                                              "): CRC-32C ", hex32(c), ", manifest says ", hex32(want)));
        }
      }
      // Copy out every request's part of this window.
      for (size_t q = i; q < j; ++q) {
        const ReadRequest& r = *reads[q];
        const int64_t begin = r.byte_offset;
        const int64_t end = r.byte_offset + r.count * r.src_elem;
        const int64_t from = std::max(begin, off);
        const int64_t to = std::min(end, off + len);
        if (from >= to) continue;
        const int64_t first_elem = (from - begin) / r.src_elem;
        const int64_t n_elem = (to - from) / r.src_elem;
        const at::Tensor src =
            at::from_blob(buffer.data() + (from - off), {n_elem}, at::TensorOptions().dtype(r.src_dtype));
        r.dst.narrow(0, r.dst_offset + first_elem, n_elem).copy_(src);
      }
      bytes += len;
      progress.add(len);
    }
    i = j;
  }
  return bytes;
}

// When the ranks' reports of loading checkpoint `name` (at `path`) are not
// all ok: the deciding usage error, else the damage (as this checkpoint's, so
// load_latest_checkpoint falls back on every rank), else the failure.
void raise_agreed(const Agreement& all, const std::string& name, const std::string& path) {
  if (all.ok()) return;
  const RankStatus& d = all.decision();
  const int r = all.deciding_rank();
  switch (d.kind) {
    case RankStatus::Kind::kUsage: detail::throw_usage(d.message);  // the same on every rank
    case RankStatus::Kind::kDamaged: {
      const std::string prefix = detail::cat("checkpoint ", name, " is damaged: file ", d.file, ": ");
      const std::string why = d.message.rfind(prefix, 0) == 0 ? d.message.substr(prefix.size()) : d.message;
      throw DamagedCheckpoint(name, d.file, detail::cat(why, " (found by rank ", r, ")"));
    }
    default: FSDP_FAIL("loading checkpoint ", path, " failed on rank ", r, ": ", d.message);
  }
}

// A step_N saved with SaveOptions::dcp: its manifest is checked as any
// checkpoint's (the model, each DCP file's size), the rest is the DCP reader's.
// The manifest's carried files (an empty list when it names none).
const nlohmann::json* carried_list(const Manifest& m) {
  static const nlohmann::json kNone = nlohmann::json::array();
  return m.json.contains("carried") ? &m.json.at("carried") : &kNone;
}

LoadResult load_dcp_checkpoint(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                               comm::ProcessGroup& group, const LoadOptions& options) {
  const fs::path dir(path);
  const std::string name = dir.filename().string();
  Manifest m;
  std::vector<CarriedFile> carried;
  const RankStatus status = RankStatus::capture([&] {
    m = read_manifest(dir);
    check_compatible(m, model.units(), name);
    if (!m.json.contains("dcp")) throw DamagedCheckpoint(name, kManifest, "names no DCP files, but the directory holds some");
    const nlohmann::json& dcp = m.json["dcp"];
    if (!dcp.is_object() || !dcp.contains("files") || !dcp["files"].is_array()) {
      throw DamagedCheckpoint(name, kManifest, "\"dcp\" does not list the DCP files");
    }
    for (const auto& f : dcp["files"]) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !is_entry_name(f["name"].get<std::string>()) ||
          !f.contains("size") || !f["size"].is_number_unsigned()) {
        throw DamagedCheckpoint(name, kManifest, "a DCP file entry is not {\"name\", \"size\"}: " + f.dump());
      }
      const std::string file = f["name"].get<std::string>();
      std::error_code ec;
      if (fs::is_symlink(dir / file, ec)) throw DamagedCheckpoint(name, file, "is a symbolic link, not a file of its own");
      const auto size = fs::file_size(dir / file, ec);
      if (ec) throw DamagedCheckpoint(name, file, "cannot be read: " + ec.message());
      if (size != f["size"].get<uint64_t>()) {
        throw DamagedCheckpoint(name, file, detail::cat("has ", size, " bytes, the manifest says ", f["size"].dump()));
      }
    }
    carried = read_carried_files(dir, carried_list(m), name);
  });
  raise_agreed(agree(group, status), name, path);
  DcpLoadOptions dl;
  if (m.json["dcp"].contains("layout") && m.json["dcp"]["layout"] == "torchtitan") {
    FSDP_CHECK(options.dcp_names != nullptr, "checkpoint ", path, " was saved with torchtitan's names; loading it "
               "needs the model family's torchtitan names (LoadOptions::dcp_names)");
    dl.names = *options.dcp_names;
  }
  const DcpLoadResult d = load_dcp(path, model, owners, group, dl);
  LoadResult result;
  result.loaded = true;
  result.step = m.step;
  result.path = path;
  result.manifest = m.json;
  result.state = m.state;
  const nlohmann::json ts = result.saved(kTrainerKey);
  result.trainer_state = ts.is_object() ? ts : nlohmann::json::object();
  result.io = d.io;
  result.carried = std::move(carried);
  return result;
}

}  // namespace

// ---- public --------------------------------------------------------------------------

ShardPosition shard_position(const ShardedModel& model, const comm::ProcessGroup& group) {
  ShardPosition p;
  for (const auto& u : model.units()) {
    if (u.shard_numel > 0) {
      p.count = u.padded_numel / u.shard_numel;
      p.index = u.shard_offset / u.shard_numel;
      break;
    }
  }
  const ShardingStrategy s = model.options().strategy;
  if (s == ShardingStrategy::kHybridShard && model.replicate_group()) {
    p.writer = model.replicate_group()->rank() == 0;
  } else if (p.count == 1) {
    p.writer = group.rank() == 0;  // replicated (NO_SHARD, or a world of one)
  } else {
    p.writer = true;
  }
  return p;
}

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored) {
  std::vector<CheckpointInfo> out;
  std::vector<std::string> skipped;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::optional<int64_t> step = step_of(name);
    if (!step) continue;
    if (!e.is_directory(ec)) {
      skipped.push_back(name + " (not a directory)");
    } else if (!fs::exists(e.path() / kManifest, ec)) {
      skipped.push_back(detail::cat(name, " (no ", kManifest, ")"));
    } else {
      out.push_back({*step, e.path().string()});
    }
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
  std::sort(skipped.begin(), skipped.end());
  if (ignored != nullptr) *ignored = std::move(skipped);
  return out;
}

void check_checkpoint_dir(const std::string& dir) {
  std::vector<std::string> foreign;
  list_checkpoints(dir, &foreign);
  if (!foreign.empty()) {
    std::string names;
    for (const auto& f : foreign) names += (names.empty() ? "" : ", ") + f;
    FSDP_CHECK(false, "--checkpoint-dir ", dir, " holds ", names, ": named like a checkpoint but not one (a partial "
               "copy, a checkpoint whose ", kManifest, " was lost, or other files). A save could need that name, "
               "and this program never overwrites or deletes what it did not write: move ",
               foreign.size() == 1 ? "it" : "them", " out of ", dir, " (or restore the ", kManifest, ") and run again");
  }
  for (const auto& p : stale_temporaries(dir)) check_removable(p.string());
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  const std::vector<fs::path> doomed = stale_temporaries(dir);
  for (const auto& p : doomed) check_removable(p.string());  // all or nothing
  std::vector<std::string> removed;
  for (const auto& p : doomed) {
    remove_owned_directory(p.string());
    removed.push_back(p.filename().string());
  }
  return removed;
}

CheckpointDirHold open_checkpoint_dir(const std::string& dir, comm::ProcessGroup& group) {
  CheckpointDirHold hold;
  RankStatus refused;
  if (group.rank() == 0) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) FSDP_FAIL("cannot create --checkpoint-dir ", dir, ": ", ec.message());
      hold.lock = std::make_unique<DirectoryLock>((fs::path(dir) / kLockFile).string(), "--checkpoint-dir " + dir);
      check_checkpoint_dir(dir);
      hold.removed = remove_stale_temporaries(dir);
    } catch (const std::exception& e) {
      refused = RankStatus::of(e);
      hold.lock.reset();
    }
  }
  agree(group, refused).raise_if_failed("opening --checkpoint-dir " + dir + " failed");
  return hold;
}

SaveJob begin_save(const std::string& dir, int64_t step, ShardedModel& model, const std::vector<StateOwner*>& owners,
                   comm::ProcessGroup& group, const SaveOptions& options) {
  FSDP_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  FSDP_CHECK(options.block_size >= 64 && options.block_size % 64 == 0,
             "checkpoint block size must be a positive multiple of 64 bytes, got ", options.block_size);
  SaveJob job;
  job.t0 = io::now_seconds();
  job.dir = dir;
  job.step = step;
  job.name = checkpoint_name(step);
  const fs::path root(dir);
  job.tmp = (root / (".tmp-" + job.name)).string();
  job.final = (root / job.name).string();
  job.rank = group.rank();
  job.lead = group.rank() == 0;
  job.options = options;
  if (options.dcp != nullptr) {
    job.dcp = std::make_shared<DcpSaveOptions>(*options.dcp);
    job.options.dcp = job.dcp.get();
  }
  job.stager = std::make_shared<Stager>();

  // 1. Rank 0 prepares an empty temporary directory (Note [Ownership of what
  // we delete]: a step_N that is not a checkpoint is never replaced).
  RankStatus prepared;
  if (job.lead) {
    prepared = RankStatus::capture([&] {
      fs::create_directories(root);
      check_checkpoint_name_free(job.final);
      remove_owned_directory(job.tmp);  // left by a crashed save of the same step
      create_owned_directory(job.tmp);
    });
  }
  agree(group, prepared).raise_if_failed("saving checkpoint " + job.final + ": creating " + job.tmp + " failed");

  // 2. What this rank writes (Note [Save phases]), and the manifest as it is
  // now: the owners' metadata changes with every step.
  const RankStatus collected = RankStatus::capture([&] {
    if (job.dcp) {
      job.write = prepare_dcp_write(job.tmp, model, owners, group, *job.dcp, job.stager);
    } else {
      std::vector<UnitState> state = collect_state(model, owners);
      const ShardPosition pos = shard_position(model, group);
      if (!pos.writer) {
        job.write = [] { return RankStatus::success(); };
      } else {
        int64_t total = 0;
        for (auto& u : state) {
          for (auto& k : u.kinds) {
            job.stager->add(k.second);
            total += k.second.numel() * static_cast<int64_t>(k.second.element_size());
          }
        }
        const std::string path = (fs::path(job.tmp) / shard_file_name(pos.index, pos.count)).string();
        job.write = [state = std::move(state), units = model.units(), pos, path, total, stager = job.stager,
                     name = job.name, block = options.block_size, progress = options.progress]() {
          io::Progress bar("saving " + name, total, progress);
          RankStatus written;
          try {
            written = RankStatus::success(write_shard_file(path, state, units, pos, block, *stager, bar).dump());
          } catch (const std::exception& e) {
            written = RankStatus::failure(strip_rank_tag(e.what()));  // whatever it was, the save failed
          }
          bar.finish();
          return written;
        };
      }
    }
    if (job.lead) {
      nlohmann::json units = nlohmann::json::array();
      for (const auto& u : model.units()) {
        nlohmann::json params = nlohmann::json::array();
        for (const auto& p : u.params) {
          params.push_back({{"name", p.name}, {"shape", p.shape}, {"flat_offset", p.flat_offset}, {"numel", p.numel}});
        }
        units.push_back({{"name", u.name},
                         {"numel", u.numel},
                         {"padded_numel", u.padded_numel},
                         {"shard_numel", u.shard_numel},
                         {"params", params}});
      }
      nlohmann::json saved_state = nlohmann::json::object();
      for (StateOwner* owner : owners) saved_state[owner->state_key()] = owner->state_metadata();
      const ShardPosition p0 = shard_position(model, group);
      const int64_t replicas = model.replicate_group() ? model.replicate_group()->size()
                                                       : (p0.count == 1 ? group.size() : 1);
      job.manifest = {{"format", kFormat},
                      {"version", kVersion},
                      {"step", step},
                      {"world_size", group.size()},
                      {"shard_group_size", p0.count},
                      {"replicate_group_size", replicas},
                      {"strategy", to_string(model.options().strategy)},
                      {"state", saved_state},
                      {"units", units},
                      {"checksum", {{"algorithm", "crc32c"}, {"block_size", options.block_size}}}};
      if (job.dcp) {
        job.manifest["dcp"] = {{"layout", job.dcp->layout == DcpLayout::kTorch ? "torch" : "torchtitan"},
                               {"format", job.dcp->format == DcpFormat::kTorchSave ? "torch_save" : "safetensors"}};
      }
    }
  });
  const Agreement all = agree(group, collected);
  if (!all.ok()) {
    if (job.lead && is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // the marker last
    all.raise_if_failed("saving checkpoint " + job.final + " failed (the previous checkpoints are untouched)");
  }
  return job;
}

SaveResult commit_save(SaveJob& job, const RankStatus& written, comm::ProcessGroup& group) {
  const Agreement records = agree(group, written);
  if (!records.ok()) {
    if (job.lead && is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // the marker last
    records.raise_if_failed("saving checkpoint " + job.final + " failed (the previous checkpoints are untouched)");
  }

  // Note [Checkpoint commit]. A checkpoint becomes visible by one rename of its
  // directory, after (a) every writer wrote and fsynced its file inside
  // .tmp-step_N, (b) the ranks exchanged sizes and checksums (all_gather: no
  // rank reaches the commit before every file is durable), (c) rank 0 wrote and
  // fsynced manifest.json and manifest.crc32c and fsynced the directory. The
  // parent is fsynced after the rename, so a power loss after save_checkpoint
  // returns cannot undo it. A crash before the rename leaves only .tmp-step_N,
  // which no reader takes for a checkpoint (list_checkpoints wants step_N with
  // a manifest) and remove_stale_temporaries deletes; a crash after it leaves a
  // complete checkpoint. An existing step_N (a run that fell back to an older
  // step and reached N again) is swapped out atomically (replace_directory).
  // An asynchronous save (async_save.h) commits the same way, later.
  const fs::path root(job.dir);
  int64_t bytes = 0;
  nlohmann::json files = nlohmann::json::array();
  if (!job.dcp) {
    for (const auto& r : records.ranks()) {
      if (r.payload.empty()) continue;  // not a writer
      nlohmann::json f = r.payload_json();
      bytes += f.at("size").get<int64_t>();
      files.push_back(std::move(f));
    }
    std::sort(files.begin(), files.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("shard_index").get<int64_t>() < b.at("shard_index").get<int64_t>();
    });
  }
  SaveResult result;
  result.path = job.final;
  RankStatus committed;
  if (job.lead) {
    try {
      nlohmann::json m = job.manifest;
      m["files"] = files;
      if (job.dcp) {
        finish_dcp_write(job.tmp, records, *job.dcp, /*lead=*/true);  // .metadata, fsync
        nlohmann::json dcp_files = nlohmann::json::array();
        for (const auto& e : fs::directory_iterator(job.tmp)) {
          const std::string n = e.path().filename().string();
          if (n == kOwnedMarker || n == kCarriedDir) continue;
          dcp_files.push_back({{"name", n}, {"size", static_cast<int64_t>(e.file_size())}});
          bytes += static_cast<int64_t>(e.file_size());
        }
        std::sort(dcp_files.begin(), dcp_files.end(),
                  [](const nlohmann::json& a, const nlohmann::json& b) { return a.at("name") < b.at("name"); });
        m["dcp"]["files"] = dcp_files;
      }
      if (!job.options.carried.empty()) m["carried"] = write_carried_files(job.tmp, job.options.carried);
      const std::string text = m.dump(1) + "\n";
      io::write_text_file((fs::path(job.tmp) / kManifest).string(), text);
      io::write_text_file((fs::path(job.tmp) / kManifestCrc).string(), hex32(crc32c(text.data(), text.size())) + "\n");
      bytes += static_cast<int64_t>(text.size()) + 9;
      io::fsync_dir(job.tmp);
      io::replace_directory(job.tmp, job.final);
      // keep_last: delete the oldest complete checkpoints, only now that the new one is complete.
      // Only checkpoints older than this one count: newer ones can only be
      // leftovers of a run this one fell back from (damaged); they are left alone.
      if (job.options.keep_last > 0) {
        std::vector<CheckpointInfo> all;
        for (const auto& c : list_checkpoints(job.dir)) {
          if (c.step <= job.step) all.push_back(c);
        }
        for (size_t i = static_cast<size_t>(job.options.keep_last); i < all.size(); ++i) {
          const fs::path doomed(all[i].path);
          if (entry_kind(doomed.string()) == EntryKind::kLink) {
            // A checkpoint linked in from elsewhere: the link goes, what it points
            // to stays (Note [Removing without following links]).
            if (const std::string why = remove_tree(doomed.string()); !why.empty()) {
              FSDP_FAIL("cannot remove the link ", doomed.string(), ": ", why);
            }
            io::fsync_dir(root.string());
            result.pruned.push_back(doomed.filename().string());
            continue;
          }
          const fs::path del = root / (".del-" + doomed.filename().string());
          remove_owned_directory(del.string());
          if (!is_owned_directory(doomed.string())) mark_owned(doomed.string());  // saved by an older version
          io::rename_path(doomed.string(), del.string());
          io::fsync_dir(root.string());
          discard_owned_directory(del.string());  // the marker last: a kill leaves a removable .del-
          result.pruned.push_back(doomed.filename().string());
        }
      }
    } catch (const std::exception& e) {
      committed = RankStatus::of(e);
      if (is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // not committed: nothing to keep
    }
  }
  agree(group, committed).raise_if_failed("saving checkpoint " + job.final + " failed");
  result.io.bytes = bytes;  // rank 0's count is the whole (the DCP files and the manifest are counted there)
  result.io.seconds = io::now_seconds() - job.t0;
  return result;
}

SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model,
                           const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                           const SaveOptions& options) {
  SaveJob job = begin_save(dir, step, model, owners, group, options);
  const RankStatus written = job.write();
  return commit_save(job, written, group);
}

LoadResult load_checkpoint(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                           comm::ProcessGroup& group, const LoadOptions& options) {
  if (is_dcp_dir(path)) return load_dcp_checkpoint(path, model, owners, group, options);
  const double t0 = io::now_seconds();
  const fs::path dir(path);
  const std::string name = dir.filename().string();
  LoadResult result;
  result.path = path;
  RankStatus status;
  int64_t bytes_read = 0;
  Manifest m;
  try {
    m = read_manifest(dir);
    const auto& units = model.units();
    check_compatible(m, units, name);
    std::vector<UnitState> state = collect_state(model, owners);
    check_required_kinds(m, units, state, name);
    // The owners' metadata (the same on every rank): an owner refuses what does not fit it.
    for (StateOwner* owner : owners) {
      const std::string key = owner->state_key();
      hand_saved_state(*owner, m.state.contains(key) ? m.state.at(key) : nlohmann::json(), name, kManifest);
    }
    result.carried = read_carried_files(dir, carried_list(m), name);
    // Every file: present, with the size the manifest records.
    for (size_t f = 0; f < m.files.size(); ++f) {
      std::error_code ec;
      const auto size = fs::file_size(m.files[f].path, ec);
      if (ec) throw DamagedCheckpoint(name, m.files[f].name, "cannot be read: " + ec.message());
      if (static_cast<int64_t>(size) != m.files[f].size) {
        throw DamagedCheckpoint(name, m.files[f].name,
                                detail::cat("has ", size, " bytes, the manifest says ", m.files[f].size,
                                            static_cast<int64_t>(size) < m.files[f].size ? " (truncated)" : ""));
      }
    }
    {
      at::NoGradGuard no_grad;
      for (auto& u : state) {
        for (auto& k : u.kinds) k.second.zero_();  // padding and kinds the checkpoint lacks (compensation)
      }
    }
    const std::vector<ReadRequest> reads = plan_reads(m, units, state);
    std::vector<std::vector<const ReadRequest*>> by_file(m.files.size());
    for (const auto& r : reads) by_file[r.file].push_back(&r);
    int64_t planned = 0;
    for (auto& v : by_file) {
      std::sort(v.begin(), v.end(), [](const ReadRequest* a, const ReadRequest* b) { return a->byte_offset < b->byte_offset; });
      for (const auto* r : v) planned += r->count * r->src_elem;
    }
    io::Progress progress("loading " + name, planned, options.progress);
    std::vector<uint8_t> buffer;
    for (size_t f = 0; f < m.files.size(); ++f) {
      if (!by_file[f].empty()) bytes_read += read_file_ranges(by_file[f], m.files[f], m.block_size, name, buffer, progress);
    }
    progress.finish();
  } catch (const std::exception& e) {
    status = RankStatus::of(e);  // a damaged file, a usage error (another model), or a failure
  }

  // The ranks agree: the first usage error, else the first damage, else the first failure.
  raise_agreed(agree(group, status), name, path);
  at::Tensor total = at::full({1}, static_cast<double>(bytes_read), at::kDouble);
  if (group.size() > 1) group.all_reduce(total, comm::ReduceOp::kSum)->wait();

  result.loaded = true;
  result.step = m.step;
  result.manifest = m.json;
  result.state = m.state;
  const nlohmann::json ts = result.saved(kTrainerKey);
  result.trainer_state = ts.is_object() ? ts : nlohmann::json::object();
  result.io.bytes = static_cast<int64_t>(total.item<double>());
  result.io.seconds = io::now_seconds() - t0;
  return result;
}

LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model,
                                  const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                  const LoadOptions& options) {
  // Rank 0's view of the directory decides, so every rank tries the same ones.
  nlohmann::json mine = nlohmann::json::array();
  const RankStatus listed = RankStatus::capture([&] {
    if (group.rank() == 0) {
      for (const auto& c : list_checkpoints(dir)) mine.push_back(c.path);
    }
  });
  const Agreement all = agree(group, listed.ok() ? RankStatus::success(mine.dump()) : listed);
  all.raise_if_failed("listing the checkpoints in " + dir + " failed");
  const std::vector<std::string> candidates =
      all.ranks()[0].payload_json().get<std::vector<std::string>>();
  std::vector<std::string> rejected;
  for (const auto& c : candidates) {
    try {
      LoadResult r = load_checkpoint(c, model, owners, group, options);
      r.rejected = rejected;
      return r;
    } catch (const DamagedCheckpoint& e) {
      rejected.push_back(e.what());
    }
  }
  LoadResult none;
  if (!rejected.empty()) {
    std::string msg;
    for (const auto& r : rejected) msg += "\n  " + r;
    FSDP_FAIL("every checkpoint in ", dir, " is damaged:", msg,
              "\nmove the damaged checkpoints out of the directory to start from scratch");
  }
  return none;
}

namespace {
// The owners of the convenience overloads: the optimizer (may be null), the
// model's configuration and the trainer's state as metadata.
std::vector<StateOwner*> owners_of(StateOwner* optimizer, MetadataState* model, MetadataState* trainer) {
  std::vector<StateOwner*> out = {model, trainer};
  if (optimizer != nullptr) out.push_back(optimizer);
  return out;
}
}  // namespace

SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model, StateOwner* optimizer,
                           const nlohmann::json& model_config, const nlohmann::json& trainer_state,
                           comm::ProcessGroup& group, const SaveOptions& options) {
  MetadataState m(kModelKey, {{"config", model_config}});
  MetadataState t(kTrainerKey, trainer_state);
  return save_checkpoint(dir, step, model, owners_of(optimizer, &m, &t), group, options);
}

LoadResult load_checkpoint(const std::string& path, ShardedModel& model, StateOwner* optimizer,
                           comm::ProcessGroup& group, const LoadOptions& options) {
  MetadataState m(kModelKey, nullptr);
  MetadataState t(kTrainerKey, nullptr);
  return load_checkpoint(path, model, owners_of(optimizer, &m, &t), group, options);
}

LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model, StateOwner* optimizer,
                                  comm::ProcessGroup& group, const LoadOptions& options) {
  MetadataState m(kModelKey, nullptr);
  MetadataState t(kTrainerKey, nullptr);
  return load_latest_checkpoint(dir, model, owners_of(optimizer, &m, &t), group, options);
}

nlohmann::json LoadResult::saved(const std::string& key) const {
  return state->is_object() && state->contains(key) ? state->at(key) : nlohmann::json();
}

JsonValue read_checkpoint_state(const std::string& path) { return read_manifest(fs::path(path)).state; }

}  // namespace fsdp::checkpoint

// Our shard files (Note [Checkpoint payloads], payload.h): one file per shard
// of the padded flat parameters, its sections the model's shard and every
// owner's slots, each file checksummed by blocks; loading reads only the byte
// ranges this rank's new shards need (Note [Resharding on load]). The format is
// sharded.h's; the directory around the files is the protocol's (step_dir.cpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "carried.h"
#include "file_io.h"
#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/common/encoding.h"
#include "manifest.h"
#include "payload.h"
#include "progress.h"
#include "shard_position.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kIoChunk = 16 << 20;  // bytes per write()/pread() call

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
                 "weights, export_hf: dir then import_hf: dir)");
      for (const auto& p : units[u].params) {
        FSDP_CHECK(saved.count({m.params.at(p.name).unit, kind}) == 1, "checkpoint ", name,
                   " was saved with parameter '", p.name, "' frozen, so it holds no optimizer state for it, but this "
                   "run trains it; resume with the freeze_matching: pattern and LoraConfig::targets it was saved "
                   "with, or start a new run from its weights (export_hf: dir, then import_hf: dir)");
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

class ShardFilePayload final : public Payload {
 public:
  ShardFilePayload(int64_t block_size, bool progress, std::string name)
      : block_size_(block_size), progress_(progress), name_(std::move(name)) {}

  std::function<RankStatus()> prepare(const std::string& tmp, ShardedModel& model,
                                      const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                      const std::shared_ptr<Stager>& stager) override {
    std::vector<UnitState> state = collect_state(model, owners);
    const ShardPosition pos = shard_position(model, group);
    if (!pos.writer) return [] { return RankStatus::success(); };
    int64_t total = 0;
    for (auto& u : state) {
      for (auto& k : u.kinds) {
        stager->add(k.second);
        total += k.second.numel() * static_cast<int64_t>(k.second.element_size());
      }
    }
    const std::string path = (fs::path(tmp) / shard_file_name(pos.index, pos.count)).string();
    return [state = std::move(state), units = model.units(), pos, path, total, stager, name = name_,
            block = block_size_, progress = progress_]() {
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

  // Every rank counts the files' bytes from the records; rank 0 lists them in the manifest.
  int64_t finish(const std::string& /*tmp*/, const Agreement& records, nlohmann::json* manifest) override {
    int64_t bytes = 0;
    nlohmann::json files = nlohmann::json::array();
    for (const auto& r : records.ranks()) {
      if (r.payload.empty()) continue;  // not a writer
      nlohmann::json f = r.payload_json();
      bytes += f.at("size").get<int64_t>();
      files.push_back(std::move(f));
    }
    std::sort(files.begin(), files.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("shard_index").get<int64_t>() < b.at("shard_index").get<int64_t>();
    });
    if (manifest != nullptr) (*manifest)["files"] = files;
    return bytes;
  }

  LoadResult load(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                  comm::ProcessGroup& group, const LoadOptions& options) override;

 private:
  int64_t block_size_;
  bool progress_;
  std::string name_;  // step_N, for the progress bar
};

// Checks the manifest against the model and the owners, hands each owner its
// metadata, checks every file's size, then reads this rank's ranges.
LoadResult ShardFilePayload::load(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                                  comm::ProcessGroup& group, const LoadOptions& options) {
  const double t0 = io::now_seconds();
  const fs::path dir(path);
  const std::string name = dir.filename().string();
  std::vector<CarriedFile> carried;
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
    carried = read_carried_files(dir, carried_list(m), name);
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

  LoadResult result = loaded_from(m, path);
  result.carried = std::move(carried);
  result.io.bytes = static_cast<int64_t>(total.item<double>());
  result.io.seconds = io::now_seconds() - t0;
  return result;
}

}  // namespace

std::shared_ptr<Payload> make_shard_file_payload(const SaveOptions& options, const std::string& name) {
  return std::make_shared<ShardFilePayload>(options.block_size, options.progress, name);
}

}  // namespace fsdp::checkpoint

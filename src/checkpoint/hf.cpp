#include "fsdp/checkpoint/hf.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "export_dir.h"
#include "file_io.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/error.h"
#include "fsdp/common/name_pattern.h"
#include "fsdp/common/json_input.h"
#include "fsdp/models/lora.h"
#include "progress.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

at::ScalarType parse_export_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32" || s == "f32") return at::kFloat;
  if (s == "bfloat16" || s == "bf16") return at::kBFloat16;
  if (s == "float16" || s == "fp16" || s == "f16") return at::kHalf;
  FSDP_CHECK(false, "HfExportOptions::dtype '", s, "' is not one of: float32, bfloat16, float16");
  return at::kFloat;
}

std::string hf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: break;
  }
  FSDP_CHECK(false, "cannot export weights as ", t, "; use float32, bfloat16 or float16");
  return "";
}

const std::vector<std::string>& hf_side_file_names() {
  static const std::vector<std::string> kNames = {
      "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
      "added_tokens.json",   "vocab.json",            "merges.txt",              "chat_template.jinja",
      "chat_template.json",  "generation_config.json", "spiece.model"};
  return kNames;
}

std::vector<std::pair<std::string, std::string>> find_hf_side_files(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  for (const std::string& name : hf_side_file_names()) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) out.emplace_back(fs::absolute(p, ec).string(), name);
  }
  return out;
}

bool is_hf_export_file(const std::string& n) {
  static const NamePattern kShard("^model-[0-9]{5}-of-[0-9]{5}\\.safetensors$", "shard name");
  const auto& side = hf_side_file_names();
  return n == "config.json" || n == kSingleName || n == kIndexName ||
         std::find(side.begin(), side.end(), n) != side.end() || kShard.found_in(n);
}

namespace {

// An export writes .tmp-<name> beside DIR, renames it to DIR, and moves a
// previous DIR aside to .old-<name> (Note [Ownership of what we delete]).
struct ExportPaths {
  fs::path final;
  fs::path parent;
  fs::path tmp;
  fs::path old;
  fs::path lock;
};

ExportPaths export_paths(const std::string& dir) {
  ExportPaths p;
  p.final = fs::path(dir).lexically_normal();
  if (p.final.filename().empty()) p.final = p.final.parent_path();  // "out/" -> "out"
  p.parent = p.final.has_parent_path() ? p.final.parent_path() : fs::path(".");
  const std::string name = p.final.filename().string();
  p.tmp = p.parent / (".tmp-" + name);
  p.old = p.parent / (".old-" + name);
  p.lock = p.parent / ("." + name + ".lock");
  return p;
}

}  // namespace

void check_export_dir(const std::string& dir, const std::string& flag) {
  detail::check_export_dir_of(dir, flag, is_hf_export_file);
}

void detail::check_export_dir_of(const std::string& dir, const std::string& flag,
                                 const std::function<bool(const std::string&)>& is_export_file) {
  FSDP_CHECK(!dir.empty(), flag, " needs a directory");
  const ExportPaths paths = export_paths(dir);
  const std::string leaf = paths.final.filename().string();
  FSDP_CHECK(!leaf.empty() && leaf != "." && leaf != "..", flag, " ", dir, " names ",
             leaf.empty() ? "the root directory" : leaf == "." ? "the current directory" : "a parent directory",
             ", which an export cannot be: it writes a new directory beside the target and renames it into place; "
             "give a directory name, e.g. ", flag, " ./export");
  check_writable(paths.parent.string(), flag + " " + dir + ": directory", /*directory=*/true);
  check_removable(paths.tmp.string());
  check_removable(paths.old.string());
  std::error_code ec;
  // The export is renamed into place at DIR: at a symbolic link that would
  // replace the user's link, not fill the directory it names (issue 39).
  FSDP_CHECK(!fs::is_symlink(fs::symlink_status(paths.final, ec)), flag, " ", dir, " is a symbolic link (to ",
             fs::read_symlink(paths.final, ec).string(), "); an export replaces the directory at its path, which "
             "would replace the link — give the directory's own path");
  if (!fs::exists(dir, ec)) return;
  FSDP_CHECK(fs::is_directory(dir, ec), flag, " ", dir, " exists and is not a directory; choose a new directory");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == kOwnedMarker) continue;  // left by a kill just after an export moved in (Note [Marked until in place])
    FSDP_CHECK(e.is_regular_file(ec) && is_export_file(n), flag, " ", dir, " holds '", n,
               "', which an export does not write; an export replaces the whole directory, so choose a new or "
               "empty directory (files there are never deleted)");
  }
}

// ---- export ---------------------------------------------------------------------------

HfExportResult detail::export_dir(const std::string& dir, ShardedModel& model, comm::ProcessGroup& group,
                                  const ExportSpec& spec) {
  const double t0 = io::now_seconds();
  const bool lead = group.rank() == 0;
  const std::string dtype = safetensors_dtype(spec.dtype);
  const int64_t esize = safetensors_dtype_size(dtype);
  const ExportPaths paths = export_paths(dir);
  const fs::path& final = paths.final;
  const fs::path& tmp = paths.tmp;
  const auto& units = model.units();

  // The plan: tensors in unit order, split into files at max_shard_bytes.
  std::vector<std::vector<SafetensorsSpec>> files(1);
  std::map<std::string, size_t> file_of;  // by name in the files
  std::vector<bool> gathered(units.size(), false);
  int64_t in_file = 0;
  int64_t total = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& p : units[u].params) {
      const std::string name = spec.tensor_name(p.name);
      if (name.empty()) continue;
      gathered[u] = true;
      const int64_t n = p.numel * esize;
      if (spec.max_shard_bytes > 0 && in_file > 0 && in_file + n > spec.max_shard_bytes) {
        files.emplace_back();
        in_file = 0;
      }
      files.back().push_back({name, dtype, p.shape});
      file_of[name] = files.size() - 1;
      in_file += n;
      total += n;
    }
  }
  const bool sharded = files.size() > 1;
  std::vector<std::string> names;
  for (size_t i = 0; i < files.size(); ++i) names.push_back(sharded ? shard_name(i, files.size()) : spec.single_name);

  HfExportResult result;
  result.dir = final.string();
  RankStatus error;
  std::unique_ptr<DirectoryLock> lock;  // rank 0: one export at a time writes DIR
  std::vector<std::unique_ptr<SafetensorsWriter>> writers(files.size());
  std::vector<size_t> remaining(files.size());
  for (size_t i = 0; i < files.size(); ++i) remaining[i] = files[i].size();
  int64_t bytes = 0;
  auto guarded = [&](const std::function<void()>& fn) {
    if (!lead || !error.ok()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = RankStatus::of(e);
    }
  };
  guarded([&] {
    fs::create_directories(paths.parent);
    lock = std::make_unique<DirectoryLock>(paths.lock.string(), spec.flag + " " + final.string());
    check_export_dir_of(final.string(), spec.flag, spec.is_export_file);
    remove_owned_directory(tmp.string());  // left by an interrupted export
    create_owned_directory(tmp.string());
  });
  io::Progress progress("exporting " + final.filename().string(), total, spec.progress && lead);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (size_t u = 0; u < units.size(); ++u) {
    if (!gathered[u]) continue;  // the same on every rank: the plan depends on names only
    const at::Tensor full = model.gather_unit(u);  // collective over the shard group: every rank
    guarded([&] {
      for (const auto& p : units[u].params) {
        const std::string name = spec.tensor_name(p.name);
        if (name.empty()) continue;
        const size_t f = file_of.at(name);
        if (!writers[f]) writers[f] = std::make_unique<SafetensorsWriter>((tmp / names[f]).string(), files[f], metadata);
        const at::Tensor value = full.narrow(0, p.flat_offset, p.numel);
        writers[f]->write(name, spec.value_of ? spec.value_of(p.name, value.view(p.shape)) : value);
        progress.add(p.numel * esize);
        if (--remaining[f] == 0) {
          writers[f]->finish();
          bytes += writers[f]->file_size();
          writers[f].reset();
        }
      }
    });
  }
  progress.finish();
  guarded([&] {
    if (sharded) {
      nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
      for (const auto& [name, f] : file_of) index["weight_map"][name] = names[f];
      const std::string text = index.dump(2) + "\n";
      io::write_text_file((tmp / kIndexName).string(), text);
      bytes += static_cast<int64_t>(text.size());
    }
    for (const auto& [name, text] : spec.text_files) {
      io::write_text_file((tmp / name).string(), text);
      bytes += static_cast<int64_t>(text.size());
    }
    for (const auto& [src, name] : spec.copied_files) {
      FSDP_CHECK(spec.is_export_file(name), "cannot export extra file '", name, "'");
      const std::string content = io::read_text_file(src);
      io::write_text_file((tmp / name).string(), content);
      bytes += static_cast<int64_t>(content.size());
    }
    // The model directory is the user's to share: it goes without our marker,
    // removed only once it is in place (Note [Marked until in place]).
    io::fsync_dir(tmp.string());
    io::replace_directory(tmp.string(), final.string(), /*keep_marker=*/false);
  });
  if (lead && !error.ok() && is_owned_directory(tmp.string())) discard_owned_directory(tmp.string());
  lock.reset();
  // Everyone learns whether rank 0 succeeded.
  agree(group, error).raise_if_failed("exporting " + spec.what + " to " + final.string() + " failed");
  result.files = names;
  if (sharded) result.files.push_back(kIndexName);
  for (const auto& e : spec.text_files) result.files.push_back(e.first);
  for (const auto& e : spec.copied_files) result.files.push_back(e.second);
  at::Tensor written = at::full({1}, static_cast<double>(bytes), at::kDouble);  // rank 0's bytes, for everyone
  if (group.size() > 1) group.all_reduce(written, comm::ReduceOp::kSum)->wait();
  result.io.bytes = static_cast<int64_t>(written.item<double>());
  result.io.seconds = io::now_seconds() - t0;
  return result;
}

namespace {

// Note [Merged LoRA export]
// A model with adapters (models/lora.h) exports as the plain model it
// computes: each adapted weight as W + (B A) * scaling, the adapters left
// out. The adapters are gathered first (every unit entry holding one, in unit
// order: the same collectives on every rank) and kept — r x (in + out)
// elements per adapted layer — so that a weight meets its adapter whatever
// entry (trainable or frozen) each sits in.
std::map<std::string, at::Tensor> gather_lora(ShardedModel& model) {
  std::map<std::string, at::Tensor> out;
  const auto& units = model.units();
  for (size_t u = 0; u < units.size(); ++u) {
    bool any = false;
    for (const auto& p : units[u].params) any = any || models::is_lora_parameter(p.name);
    if (!any) continue;
    const at::Tensor full = model.gather_unit(u);
    for (const auto& p : units[u].params) {
      if (models::is_lora_parameter(p.name)) out[p.name] = full.narrow(0, p.flat_offset, p.numel).view(p.shape).clone();
    }
  }
  return out;
}

}  // namespace

HfExportResult export_hf(const std::string& dir, ShardedModel& model, const HfModelInfo& info,
                         comm::ProcessGroup& group, const HfExportOptions& options) {
  detail::ExportSpec spec;
  spec.flag = "export_hf: dir";
  spec.what = "Hugging Face weights";
  spec.dtype = options.dtype;
  spec.max_shard_bytes = options.max_shard_bytes;
  spec.single_name = kSingleName;
  spec.is_export_file = is_hf_export_file;
  spec.progress = options.progress;
  const std::map<std::string, at::Tensor> lora = gather_lora(model);
  FSDP_CHECK(lora.empty() || options.lora_scaling > 0, "the model has ", lora.size() / 2, " LoRA adapters (",
             lora.begin()->first, ", ...): a Hugging Face model directory holds them merged "
             "(HfExportOptions::lora_scaling: alpha / rank), or export them as a PEFT adapter (checkpoint/peft.h)");
  spec.tensor_name = [](const std::string& name) { return models::is_lora_parameter(name) ? std::string() : name; };
  if (!lora.empty()) {
    const double scaling = options.lora_scaling;
    spec.value_of = [&lora, scaling](const std::string& name, const at::Tensor& value) -> at::Tensor {
      static const std::string kWeight = ".weight";
      if (name.size() <= kWeight.size() || name.compare(name.size() - kWeight.size(), kWeight.size(), kWeight) != 0) {
        return value;
      }
      const std::string stem = name.substr(0, name.size() - kWeight.size());  // the Linear's name
      auto a = lora.find(stem + ".lora_A.weight");
      if (a == lora.end()) return value;
      return models::merge_lora_weight(value, a->second, lora.at(stem + ".lora_B.weight"), scaling);
    };
  }
  // Sorted keys, as transformers 5 writes them; "dtype" is its name for the
  // weights' dtype (transformers 4 wrote "torch_dtype", which 5 still reads).
  nlohmann::json config = nlohmann::json::parse(info.config_json);
  config["dtype"] = hf_dtype_name(options.dtype);
  for (auto it = options.extra_config->begin(); it != options.extra_config->end(); ++it) config[it.key()] = it.value();
  spec.text_files.emplace_back("config.json", config.dump(2) + "\n");
  spec.copied_files = options.extra_files;
  return detail::export_dir(dir, model, group, spec);
}

// ---- import ---------------------------------------------------------------------------

HfWeights find_hf_weights(const std::string& dir) {
  HfWeights w;
  const fs::path d(dir);
  std::error_code ec;
  FSDP_CHECK(fs::is_directory(d, ec), "find_hf_weights: dir ", dir, " is not a directory; give a Hugging Face model "
             "directory (config.json and *.safetensors)");
  if (fs::exists(d / kIndexName, ec)) {
    const std::string path = (d / kIndexName).string();
    std::string why;
    std::optional<nlohmann::json> parsed = parse_json_input(io::read_text_file(path), why);
    FSDP_CHECK(parsed.has_value(), path, " is not valid JSON (", why, ")");
    nlohmann::json index = std::move(*parsed);
    FSDP_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), path, " has no 'weight_map' object");
    std::set<std::string> files;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      FSDP_CHECK(it.value().is_string(), path, ": weight_map['", it.key(), "'] is not a file name");
      const std::string f = it.value().get<std::string>();
      FSDP_CHECK(f.find('/') == std::string::npos, path, ": weight_map['", it.key(), "'] = '", f,
                 "' is not a file name in the directory");
      const std::string p = (d / f).string();
      w.weight_map[it.key()] = p;
      files.insert(p);
    }
    for (const auto& f : files) {
      FSDP_CHECK(fs::exists(f, ec), path, " lists ", f, ", which does not exist");
      w.files.push_back(f);
    }
    return w;
  }
  if (fs::exists(d / kSingleName, ec)) {
    w.files.push_back((d / kSingleName).string());
    return w;
  }
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(d, ec)) {
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  }
  FSDP_CHECK(found.size() == 1, "find_hf_weights: dir ", dir, ": found ", found.size(), " *.safetensors files and no ",
             kIndexName, "; expected ", kSingleName, " or an index (a Hugging Face model directory; PyTorch .bin "
             "checkpoints are not supported — convert them with transformers' save_pretrained(safe_serialization=True))");
  w.files = found;
  return w;
}

namespace {

// The opened weights of an --init-from directory, checked against the
// parameters a model wants (name -> shape): the same checks on every rank.
struct OpenedHfWeights {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsEntry*>> where;
};

OpenedHfWeights open_hf_weights(const std::string& dir, const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted,
                                const HfModelInfo& info, HfImportResult& result) {
  const HfWeights weights = find_hf_weights(dir);
  result.files = weights.files;
  OpenedHfWeights w;
  // Open every file (headers only; data pages are touched only where read).
  for (const auto& path : weights.files) {
    w.files.push_back(std::make_unique<SafetensorsFile>(path));
    for (const auto& e : w.files.back()->entries()) {
      auto it = weights.weight_map.find(e.name);
      if (!weights.weight_map.empty() && (it == weights.weight_map.end() || it->second != path)) continue;
      FSDP_CHECK(w.where.count(e.name) == 0, "tensor '", e.name, "' appears in both ", w.where[e.name].first->path(),
                 " and ", path);
      w.where[e.name] = {w.files.back().get(), &e};
    }
  }
  std::set<std::string> names;
  for (const auto& [name, shape] : wanted) {
    names.insert(name);
    auto it = w.where.find(name);
    FSDP_CHECK(it != w.where.end(), "import_hf: dir ", dir, ": tensor '", name, "' ", shape_str(shape),
               " is missing from the checkpoint", name == "lm_head.weight" ? " (the checkpoint's model may tie "
               "its embeddings: set tie_word_embeddings in config.json)" : "");
    FSDP_CHECK(it->second.second->shape == shape, "import_hf: dir ", dir, ": tensor '", name, "' has shape ",
               shape_str(it->second.second->shape), " in ", it->second.first->path(), " but ", shape_str(shape),
               " in the model; use the config.json that belongs to the weights");
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, fe] : w.where) {
    if (names.count(name)) continue;
    if (info.ignorable && info.ignorable(name)) {
      result.ignored.push_back(name);
    } else {
      unexpected.push_back(name);
    }
  }
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(unexpected.size(), 5); ++i) list += (i ? ", " : "") + unexpected[i];
    FSDP_CHECK(false, "import_hf: dir ", dir, ": ", unexpected.size(), " tensors are not parameters of a ",
               info.model_type,
               " model with this config (", list, unexpected.size() > 5 ? ", ..." : "",
               "); the checkpoint is of another architecture");
  }
  return w;
}

}  // namespace

// Note [Base weights under adapters]
// A model with LoRA adapters (models/lora.h) reads its base weights from a
// Hugging Face directory, which has no adapters: they keep the values they
// have (their initialization: B = 0, so the model computes the base model's
// function; or an adapter loaded afterwards, checkpoint/peft.h).
HfImportResult import_hf_module(const std::string& dir, torch::nn::Module& module, const HfModelInfo& info,
                                bool progress_bar) {
  const double t0 = io::now_seconds();
  HfImportResult result;
  const auto params = module.named_parameters(/*recurse=*/true);
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& p : params) {
    FSDP_CHECK(!p.value().is_meta() && p.value().is_contiguous(), "import_hf_module: parameter '", p.key(),
               "' must be materialized and contiguous");
    if (models::is_lora_parameter(p.key())) continue;  // Note [Base weights under adapters]
    wanted.emplace_back(p.key(), p.value().sizes().vec());
  }
  const OpenedHfWeights w = open_hf_weights(dir, wanted, info, result);
  int64_t planned = 0;
  for (const auto& [name, shape] : wanted) {
    planned += params[name].numel() * safetensors_dtype_size(w.where.at(name).second->dtype);
  }
  io::Progress progress("loading " + dir, planned, progress_bar);
  at::NoGradGuard no_grad;
  std::vector<float> buffer;
  for (const auto& p : params) {
    if (models::is_lora_parameter(p.key())) continue;
    const auto& [file, entry] = w.where.at(p.key());
    const int64_t n = p.value().numel();
    buffer.resize(static_cast<size_t>(n));
    file->read_as_float(*entry, 0, n, buffer.data());
    p.value().view({-1}).copy_(at::from_blob(buffer.data(), {n}, at::kFloat));
    const int64_t b = n * safetensors_dtype_size(entry->dtype);
    result.io.bytes += b;
    progress.add(b);
  }
  progress.finish();
  result.io.seconds = io::now_seconds() - t0;
  return result;
}

HfImportResult import_hf(const std::string& dir, ShardedModel& model, const HfModelInfo& info,
                         comm::ProcessGroup& group, bool progress_bar) {
  const double t0 = io::now_seconds();
  HfImportResult result;
  const auto& units = model.units();
  std::vector<std::pair<std::string, std::vector<int64_t>>> wanted;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      if (!models::is_lora_parameter(p.name)) wanted.emplace_back(p.name, p.shape);
    }
  }
  const OpenedHfWeights opened = open_hf_weights(dir, wanted, info, result);
  const auto& where = opened.where;

  // This rank's bytes.
  const std::vector<ShardRef> shards = model.shards();
  int64_t planned = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& p : units[u].params) {
      const int64_t lo = std::max(units[u].shard_offset, p.flat_offset);
      const int64_t hi = std::min(units[u].shard_offset + units[u].shard_numel, p.flat_offset + p.numel);
      if (lo < hi && !models::is_lora_parameter(p.name)) {
        planned += (hi - lo) * safetensors_dtype_size(where.at(p.name).second->dtype);
      }
    }
  }
  io::Progress progress("loading " + dir, planned, progress_bar);
  at::NoGradGuard no_grad;
  int64_t bytes = 0;
  std::vector<float> buffer;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitInfo& ui = units[u];
    at::Tensor shard = shards[u].param;
    // Padding is zeroed; adapters keep their values (Note [Base weights under adapters]).
    std::vector<std::pair<int64_t, at::Tensor>> kept;
    for (const auto& p : ui.params) {
      const int64_t lo = std::max(ui.shard_offset, p.flat_offset);
      const int64_t hi = std::min(ui.shard_offset + ui.shard_numel, p.flat_offset + p.numel);
      if (lo < hi && models::is_lora_parameter(p.name)) {
        kept.emplace_back(lo - ui.shard_offset, shard.narrow(0, lo - ui.shard_offset, hi - lo).clone());
      }
    }
    shard.zero_();
    for (const auto& [at_offset, values] : kept) shard.narrow(0, at_offset, values.numel()).copy_(values);
    const bool direct = shard.scalar_type() == at::kFloat && shard.is_contiguous() && shard.device().is_cpu();
    for (const auto& p : ui.params) {
      const int64_t lo = std::max(ui.shard_offset, p.flat_offset);
      const int64_t hi = std::min(ui.shard_offset + ui.shard_numel, p.flat_offset + p.numel);
      if (lo >= hi || models::is_lora_parameter(p.name)) continue;
      const auto& [file, entry] = where.at(p.name);
      const int64_t n = hi - lo;
      if (direct) {
        file->read_as_float(*entry, lo - p.flat_offset, n, shard.data_ptr<float>() + (lo - ui.shard_offset));
      } else {
        buffer.resize(static_cast<size_t>(n));
        file->read_as_float(*entry, lo - p.flat_offset, n, buffer.data());
        shard.narrow(0, lo - ui.shard_offset, n).copy_(at::from_blob(buffer.data(), {n}, at::kFloat));
      }
      const int64_t b = n * safetensors_dtype_size(entry->dtype);
      bytes += b;
      progress.add(b);
    }
  }
  progress.finish();
  at::Tensor t = at::full({1}, static_cast<double>(bytes), at::kDouble);
  if (group.size() > 1) group.all_reduce(t, comm::ReduceOp::kSum)->wait();
  result.io.bytes = static_cast<int64_t>(t.item<double>());
  result.io.seconds = io::now_seconds() - t0;
  return result;
}

}  // namespace fsdp::checkpoint

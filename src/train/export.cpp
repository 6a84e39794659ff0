#include "train/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/common/error.h"
#include "fsdp/common/state.h"
#include "train/model_build.h"

namespace fsdp::train {

// Note [Export extras]
// What --export-hf writes beside the weights and the model's config.json:
//  - config: the special token ids when there is no --init-from (the
//    tokenizer's; with --init-from its config.json's travel in the model
//    config, see resolve_model_config). Nothing else: a key read back from a
//    checkpoint outside kExportConfigKeys is damage (issue 50: a checkpoint
//    from elsewhere must not put `auto_map` or `model_type` into config.json);
//  - files, copied as they are: the --init-from directory's tokenizer and
//    generation files (checkpoint::find_hf_side_files), then the files of the
//    run's own --tokenizer, which replace those of the same name (the model
//    was trained with it): a model directory's tokenizer files; a
//    tokenizer.json (also under another name) as tokenizer.json, with the
//    tokenizer files beside a file named tokenizer.json; a SentencePiece model
//    as the family's name for it (tokenizer.model; T5: spiece.model).
//    A tiktoken file (its format is not transformers') and "byte" add none.
// Every checkpoint records the config and the files' names (export_record)
// and carries copies of the files (Note [Carried files] in
// src/checkpoint/carried.h), so that a conversion of it (Note [Checkpoint
// conversion]) writes what the run's own --export-hf would have written —
// from the copies inside the checkpoint, never from a path it names.
ExportExtras export_extras(const HfOptions& hf, const DataOptions& data, const ModelConfig& cfg,
                           const data::Tokenizer& tokenizer, const std::optional<int64_t>& bos,
                           const std::vector<int64_t>& eos) {
  namespace fs = std::filesystem;
  ExportExtras x;
  if (hf.init_from.empty()) {
    x.config["bos_token_id"] = bos ? nlohmann::json(*bos) : nlohmann::json(nullptr);
    x.config["eos_token_id"] = eos.empty() ? nlohmann::json(nullptr) : nlohmann::json(eos[0]);
  }
  std::vector<checkpoint::CarriedFile>& files = x.files;
  if (!hf.init_from.empty()) {
    for (const auto& [path, name] : checkpoint::find_hf_side_files(hf.init_from)) files.push_back({path, name});
  }
  auto own = [&](const std::string& path, const std::string& name) {
    files.erase(std::remove_if(files.begin(), files.end(), [&](const auto& f) { return f.name == name; }),
                files.end());
    files.push_back({path, name});
  };
  // A directory's tokenizer files; its generation_config.json belongs to a model, not to the tokenizer.
  auto own_directory = [&](const fs::path& dir) {
    for (const auto& [path, name] : checkpoint::find_hf_side_files(dir.string())) {
      if (name != "generation_config.json") own(path, name);
    }
  };
  std::error_code ec;
  const fs::path spec = data.tokenizer;
  const std::string kind = tokenizer.name().substr(0, tokenizer.name().find(':'));
  if (spec != "byte" && fs::is_directory(spec, ec)) {
    own_directory(spec);
  } else if (kind == "hf" || spec.filename() == "tokenizer.json") {
    if (spec.filename() == "tokenizer.json") own_directory(fs::absolute(spec, ec).parent_path());
    own(fs::absolute(spec, ec).string(), "tokenizer.json");
  } else if (kind == "sentencepiece") {
    own(fs::absolute(spec, ec).string(), cfg.sentencepiece_file_name());
  }
  return x;
}

namespace {

// The config.json keys an export takes from its extras (Note [Export extras]).
const std::vector<std::string> kExportConfigKeys = {"bos_token_id", "eos_token_id"};

bool is_side_file(const std::string& name) {
  const auto& side = checkpoint::hf_side_file_names();
  return std::find(side.begin(), side.end(), name) != side.end();
}

// A token id: null, a non-negative integer, or (eos) a short list of them.
bool is_token_id(const nlohmann::json& v) {
  const auto one = [](const nlohmann::json& x) { return x.is_number_unsigned(); };
  if (v.is_null() || one(v)) return true;
  return v.is_array() && v.size() <= 64 && std::all_of(v.begin(), v.end(), one);
}

// A file name of the record: a name (this version), or [path, name] (earlier ones; the path is ignored).
std::optional<std::string> recorded_name(const nlohmann::json& f) {
  if (f.is_string()) return f.get<std::string>();
  if (f.is_array() && f.size() == 2 && f[0].is_string() && f[1].is_string()) return f[1].get<std::string>();
  return std::nullopt;
}

}  // namespace

nlohmann::json export_record(const ExportExtras& extras) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& f : extras.files) names.push_back(f.name);
  return {{"extra_config", extras.config}, {"extra_files", names}};
}

void check_export_record(const nlohmann::json& record) {
  auto bad = [](const auto&... why) { throw MalformedState(detail::cat("its export record: ", why...)); };
  if (!record.is_object()) bad("not an object but ", record.dump());
  for (auto it = record.begin(); it != record.end(); ++it) {
    if (it.key() != "extra_config" && it.key() != "extra_files") bad("an unknown key \"", it.key(), "\"");
  }
  const nlohmann::json config = record.value("extra_config", nlohmann::json::object());
  if (!config.is_object()) bad("extra_config is not an object");
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (std::find(kExportConfigKeys.begin(), kExportConfigKeys.end(), it.key()) == kExportConfigKeys.end()) {
      bad("extra_config names \"", it.key(), "\", which an export never takes from a checkpoint (only bos_token_id "
          "and eos_token_id)");
    }
    if (!is_token_id(it.value())) bad("extra_config \"", it.key(), "\" is ", it.value().dump(), ", not a token id");
  }
  const nlohmann::json files = record.value("extra_files", nlohmann::json::array());
  if (!files.is_array() || files.size() > checkpoint::hf_side_file_names().size()) bad("extra_files is not a list of names");
  for (const nlohmann::json& f : files) {
    const std::optional<std::string> name = recorded_name(f);
    if (!name || !is_side_file(*name)) {
      bad("extra_files names ", f.dump(), ", not one of the tokenizer and generation files an export carries");
    }
  }
}

ExportExtras saved_export_extras(const nlohmann::json& record, const std::vector<checkpoint::CarriedFile>& carried,
                                 const std::string& checkpoint, const LogLine& warn) {
  ExportExtras x;
  if (!record.is_object()) return x;
  check_export_record(record);  // checked on load already; again for a caller that did not load it
  x.config = record.value("extra_config", nlohmann::json::object());
  for (const nlohmann::json& f : record.value("extra_files", nlohmann::json::array())) {
    const std::string name = *recorded_name(f);
    const auto copy = std::find_if(carried.begin(), carried.end(), [&](const auto& c) { return c.name == name; });
    if (copy != carried.end()) {
      x.files.push_back(*copy);
    } else {
      warn(fmt::format("checkpoint {} carries no copy of the run's {} (saved by an earlier version, which recorded "
                       "only its path): the export has no {}; copy it there by hand", checkpoint, name, name));
    }
  }
  return x;
}

namespace {

// The export options of --export-hf with the extras above. Carried files that
// no longer exist (the run's own, removed meanwhile) are left out, each named
// through `warn`.
checkpoint::HfExportOptions export_options(const HfOptions& hf, const ExportExtras& extras, bool progress,
                                           const LogLine& warn) {
  checkpoint::HfExportOptions eo;
  eo.dtype = hf.export_dtype;
  eo.max_shard_bytes = hf.export_shard_bytes;
  eo.progress = progress;
  eo.extra_config = extras.config;
  for (const auto& f : extras.files) {
    if (std::filesystem::is_regular_file(f.path)) {
      eo.extra_files.emplace_back(f.path, f.name);
    } else {
      warn(fmt::format("{} (the run's {}) no longer exists: the export has no {}; copy it there by hand", f.path,
                       f.name, f.name));
    }
  }
  return eo;
}

}  // namespace

void export_and_report(const HfOptions& hf, const LoraOptions& lora, const std::string& model, ShardedModel& sharded,
                       const ModelConfig& cfg, comm::ProcessGroup& group, const ExportExtras& extras, bool progress,
                       const LogLine& say, const LogLine& warn) {
  checkpoint::HfExportOptions eo = export_options(hf, extras, progress, warn);
  checkpoint::HfExportResult e;
  if (lora.enabled() && !lora.merge) {
    // A PEFT user's export: the adapter directory, with the tokenizer files (PeftModel.save_pretrained).
    checkpoint::PeftExportOptions po;
    po.dtype = eo.dtype;
    po.base_model = hf.init_from.empty() ? model : hf.init_from;
    po.extra_files = eo.extra_files;
    po.progress = eo.progress;
    e = checkpoint::export_peft_adapter(hf.export_dir, sharded, lora_config(lora), group, po);
  } else {
    if (lora.enabled()) eo.lora_scaling = lora.effective_alpha() / static_cast<double>(lora.rank);
    e = checkpoint::export_hf(hf.export_dir, sharded, hf_model_info(cfg), group, eo);
  }
  say(fmt::format("Exported {} ({}) to {} in {:.2f} s: {}, {:.2f} GB/s ({})",
                  !lora.enabled() ? "Hugging Face weights" : lora.merge ? "merged LoRA weights" : "the LoRA adapter",
                  checkpoint::hf_dtype_name(hf.export_dtype), e.dir, e.io.seconds, megabytes(e.io.bytes),
                  e.io.gb_per_s(), fmt::join(e.files, ", ")));
}

void check_export_target(const HfOptions& hf, const LoraOptions& lora) {
  if (lora.enabled() && !lora.merge) {
    checkpoint::check_peft_export_dir(hf.export_dir);
  } else {
    checkpoint::check_export_dir(hf.export_dir);
  }
}

}  // namespace fsdp::train

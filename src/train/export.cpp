#include "train/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "train/model_build.h"

namespace fsdp::train {

// Note [Export extras]
// What --export-hf writes beside the weights and the model's config.json:
//  - "extra_config": the special token ids when there is no --init-from (the
//    tokenizer's; with --init-from its config.json's travel in the model
//    config, see resolve_model_config);
//  - "extra_files": [[absolute source path, file name], ...] copied as they
//    are: the --init-from directory's tokenizer and generation files
//    (checkpoint::find_hf_side_files), then the files of the run's own
//    --tokenizer, which replace those of the same name (the model was trained
//    with it): a model directory's tokenizer files; a tokenizer.json (also
//    under another name) as tokenizer.json, with the tokenizer files beside a
//    file named tokenizer.json; a SentencePiece model as the family's name
//    for it (tokenizer.model; T5: spiece.model).
//    A tiktoken file (its format is not transformers') and "byte" add none.
// The same JSON goes into every checkpoint's trainer_state ("hf_export"), so a
// conversion of the checkpoint (Note [Checkpoint conversion]) writes what the
// run's own --export-hf would have written.
nlohmann::json export_extras(const TrainOptions& o, const ModelConfig& cfg, const data::Tokenizer& tokenizer,
                             const std::optional<int64_t>& bos, const std::vector<int64_t>& eos) {
  namespace fs = std::filesystem;
  nlohmann::json config = nlohmann::json::object();
  if (o.hf.init_from.empty()) {
    config["bos_token_id"] = bos ? nlohmann::json(*bos) : nlohmann::json(nullptr);
    config["eos_token_id"] = eos.empty() ? nlohmann::json(nullptr) : nlohmann::json(eos[0]);
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (!o.hf.init_from.empty()) files = checkpoint::find_hf_side_files(o.hf.init_from);
  auto own = [&](const std::string& path, const std::string& name) {
    files.erase(std::remove_if(files.begin(), files.end(), [&](const auto& f) { return f.second == name; }),
                files.end());
    files.emplace_back(path, name);
  };
  // A directory's tokenizer files; its generation_config.json belongs to a model, not to the tokenizer.
  auto own_directory = [&](const fs::path& dir) {
    for (const auto& [path, name] : checkpoint::find_hf_side_files(dir.string())) {
      if (name != "generation_config.json") own(path, name);
    }
  };
  std::error_code ec;
  const fs::path spec = o.data.tokenizer;
  const std::string kind = tokenizer.name().substr(0, tokenizer.name().find(':'));
  if (spec != "byte" && fs::is_directory(spec, ec)) {
    own_directory(spec);
  } else if (kind == "hf" || spec.filename() == "tokenizer.json") {
    if (spec.filename() == "tokenizer.json") own_directory(fs::absolute(spec, ec).parent_path());
    own(fs::absolute(spec, ec).string(), "tokenizer.json");
  } else if (kind == "sentencepiece") {
    own(fs::absolute(spec, ec).string(), cfg.sentencepiece_file_name());
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [path, name] : files) list.push_back({path, name});
  return {{"extra_config", config}, {"extra_files", list}};
}

namespace {

// The export options of --export-hf with the extras above. Carried files that
// no longer exist (a conversion long after the run) are left out, each named
// through `warn`.
checkpoint::HfExportOptions export_options(const TrainOptions& o, const nlohmann::json& extras, bool progress,
                                           const LogLine& warn) {
  checkpoint::HfExportOptions eo;
  eo.dtype = o.hf.export_dtype;
  eo.max_shard_bytes = o.hf.export_shard_bytes;
  eo.progress = progress;
  if (extras.contains("extra_config")) eo.extra_config = extras["extra_config"];
  if (extras.contains("extra_files")) {
    for (const auto& f : extras["extra_files"]) {
      const std::string path = f.at(0).get<std::string>();
      const std::string name = f.at(1).get<std::string>();
      if (std::filesystem::is_regular_file(path)) {
        eo.extra_files.emplace_back(path, name);
      } else {
        warn(fmt::format("{} (the run's {}) no longer exists: the export has no {}; copy it there by hand", path,
                         name, name));
      }
    }
  }
  return eo;
}

}  // namespace

void export_and_report(const TrainOptions& o, ShardedModel& sharded, const ModelConfig& cfg,
                       comm::ProcessGroup& group, const nlohmann::json& extras, bool progress, const LogLine& say,
                       const LogLine& warn) {
  checkpoint::HfExportOptions eo = export_options(o, extras, progress, warn);
  checkpoint::HfExportResult e;
  if (o.lora.enabled() && !o.lora.merge) {
    // A PEFT user's export: the adapter directory, with the tokenizer files (PeftModel.save_pretrained).
    checkpoint::PeftExportOptions po;
    po.dtype = eo.dtype;
    po.base_model = o.hf.init_from.empty() ? o.model : o.hf.init_from;
    po.extra_files = eo.extra_files;
    po.progress = eo.progress;
    e = checkpoint::export_peft_adapter(o.hf.export_dir, sharded, lora_config(o), group, po);
  } else {
    if (o.lora.enabled()) eo.lora_scaling = o.lora.effective_alpha() / static_cast<double>(o.lora.rank);
    e = checkpoint::export_hf(o.hf.export_dir, sharded, hf_model_info(cfg), group, eo);
  }
  say(fmt::format("Exported {} ({}) to {} in {:.2f} s: {}, {:.2f} GB/s ({})",
                  !o.lora.enabled() ? "Hugging Face weights" : o.lora.merge ? "merged LoRA weights" : "the LoRA adapter",
                  checkpoint::hf_dtype_name(o.hf.export_dtype), e.dir, e.io.seconds, megabytes(e.io.bytes),
                  e.io.gb_per_s(), fmt::join(e.files, ", ")));
}

void check_export_target(const TrainOptions& o) {
  if (o.lora.enabled() && !o.lora.merge) {
    checkpoint::check_peft_export_dir(o.hf.export_dir);
  } else {
    checkpoint::check_export_dir(o.hf.export_dir);
  }
}

}  // namespace fsdp::train

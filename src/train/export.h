// --export-hf: what a run (or a conversion of its checkpoint) writes for
// Hugging Face and PEFT users (Note [Export extras] in export.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/sharded.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/fsdp.h"
#include "fsdp/train/options.h"
#include "train/console.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

// What --export-hf writes beside the weights (Note [Export extras]).
struct ExportExtras {
  nlohmann::json config = nlohmann::json::object();  // merged into config.json: special token ids only
  std::vector<checkpoint::CarriedFile> files;         // copied into the export: (source path, file name)
};

// The extras of Note [Export extras] for a run from hf.init_from (when
// given) with data.tokenizer, loaded as `tokenizer` (whose special token ids
// are `bos` and `eos`).
ExportExtras export_extras(const HfOptions& hf, const DataOptions& data, const ModelConfig& cfg,
                           const data::Tokenizer& tokenizer, const std::optional<int64_t>& bos,
                           const std::vector<int64_t>& eos);

// What every checkpoint records of `extras` ("hf_export" in the trainer's
// state): the config keys and the files' names, never their paths (the
// checkpoint carries copies: Note [Carried files] in src/checkpoint/carried.h).
nlohmann::json export_record(const ExportExtras& extras);
// MalformedState unless `record` is what export_record writes (or what an
// earlier version wrote: [path, name] pairs, whose paths are ignored).
void check_export_record(const nlohmann::json& record);
// The extras of a checkpoint: its record's config, and the copies it carries
// of the files the record names. A named file without a copy (a checkpoint
// written before checkpoints carried them) is said through `warn`.
ExportExtras saved_export_extras(const nlohmann::json& record, const std::vector<checkpoint::CarriedFile>& carried,
                                 const std::string& checkpoint, const LogLine& warn);

// Collective over `group`: writes hf.export_dir (the weights of `sharded` as
// Hugging Face safetensors and config.json of `cfg`, or with `lora` the PEFT
// adapter directory or the merged model, with the `extras`), and logs what
// it wrote through `say`; carried files that no longer exist are named
// through `warn`. A PEFT adapter names hf.init_from as its base model, else
// `model` (the run's --model).
void export_and_report(const HfOptions& hf, const LoraOptions& lora, const std::string& model, ShardedModel& sharded,
                       const ModelConfig& cfg, comm::ProcessGroup& group, const ExportExtras& extras, bool progress,
                       const LogLine& say, const LogLine& warn);

// UsageError unless hf.export_dir may receive this run's export (a LoRA run
// without lora.merge writes a PEFT adapter directory there).
void check_export_target(const HfOptions& hf, const LoraOptions& lora);

}  // namespace fsdp::train

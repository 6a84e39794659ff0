// --export-hf: what a run (or a conversion of its checkpoint) writes for
// Hugging Face and PEFT users (Note [Export extras] in export.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/comm/process_group.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/fsdp.h"
#include "fsdp/train/trainer.h"
#include "train/console.h"
#include "fsdp/train/model_family.h"

namespace fsdp::train {

// The extras of Note [Export extras] for a run of `o` with `tokenizer`
// (whose special token ids are `bos` and `eos`), as the JSON every
// checkpoint records.
nlohmann::json export_extras(const TrainOptions& o, const ModelConfig& cfg, const data::Tokenizer& tokenizer,
                             const std::optional<int64_t>& bos, const std::vector<int64_t>& eos);

// Collective over `group`: writes hf.export_dir (the weights of `sharded` as
// Hugging Face safetensors and config.json of `cfg`, or with LoRA the PEFT
// adapter directory or the merged model, with the `extras`), and logs what
// it wrote through `say`; carried files that no longer exist are named
// through `warn`.
void export_and_report(const TrainOptions& o, ShardedModel& sharded, const ModelConfig& cfg,
                       comm::ProcessGroup& group, const nlohmann::json& extras, bool progress, const LogLine& say,
                       const LogLine& warn);

// UsageError unless hf.export_dir may receive this run's export (a LoRA run
// without lora.merge writes a PEFT adapter directory there).
void check_export_target(const TrainOptions& o);

}  // namespace fsdp::train

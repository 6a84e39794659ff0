// PEFT interchange for LoRA adapters (models/lora.h): an adapter directory as
// peft's PeftModel.save_pretrained writes it, loadable with
// PeftModel.from_pretrained(base_model, DIR):
//   adapter_config.json        peft_type "LORA", task_type "CAUSAL_LM", r,
//                              lora_alpha, lora_dropout, target_modules,
//                              base_model_name_or_path, bias "none", no
//                              rslora / DoRA (peft fills the other keys)
//   adapter_model.safetensors  base_model.model.<our name> for each
//                              <linear>.lora_A.weight (r, in) and
//                              <linear>.lora_B.weight (out, r)
// plus, as an export carries them, the base model's tokenizer files
// (hf_side_file_names()).
//
// Export: as export_hf (checkpoint/hf.h): rank 0 writes into a temporary
// directory beside DIR that replaces DIR when complete, so DIR is never
// half-written; only the unit entries holding adapters are gathered.
// Import: an adapter directory's config and weights into a model that
// apply_lora gave the same adapters.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/models/lora.h"

namespace torch::nn {
class Module;
}

namespace fsdp::checkpoint {

// "base_model.model.": what peft puts before the model's own parameter names.
extern const char* const kPeftPrefix;

struct PeftExportOptions {
  at::ScalarType dtype = at::kFloat;  // float32 (exact), bfloat16 or float16
  std::string base_model;             // adapter_config.json's base_model_name_or_path ("": null)
  // Copied into DIR as they are: (source path, file name), each one of hf_side_file_names().
  std::vector<std::pair<std::string, std::string>> extra_files;
  bool progress = false;  // progress bar on stderr (rank 0)
};

// Names an adapter export writes (adapter_config.json, adapter_model.safetensors,
// hf_side_file_names()); anything else in an existing DIR makes export refuse.
bool is_peft_export_file(const std::string& file_name);
// As check_export_dir, for an adapter export.
void check_peft_export_dir(const std::string& dir, const std::string& flag = "export_peft_adapter: dir");

// adapter_config.json's text for `cfg`.
std::string peft_adapter_config_json(const models::LoraConfig& cfg, const std::string& base_model);

// Collective over `group` (every rank of the model's world); rank 0 writes
// DIR. UsageError when the model has no adapters; check_peft_export_dir's
// refusals. Errors are raised on every rank.
HfExportResult export_peft_adapter(const std::string& dir, ShardedModel& model, const models::LoraConfig& cfg,
                                   comm::ProcessGroup& group, const PeftExportOptions& options = {});

// The LoRA settings of DIR/adapter_config.json. UsageError naming the key for
// what this implementation does not have: peft_type other than LORA,
// use_rslora, use_dora, bias other than "none", modules_to_save,
// layers_to_transform, rank_pattern / alpha_pattern, fan_in_fan_out,
// target_modules given as a regular expression (a string).
models::LoraConfig read_peft_adapter_config(const std::string& dir);

// Loads DIR/adapter_model.safetensors into the adapters of a materialized,
// unsharded module (what hf_probe and rank 0 under sync_module_states hold).
// UsageError: an adapter of the module missing from the file, a shape
// mismatch, a tensor in the file that is not an adapter of the module.
void import_peft_adapter_module(const std::string& dir, torch::nn::Module& module);

// The same into the shards of a sharded model: each rank reads its own
// shards' adapter ranges; nothing else of the shards changes. The same
// errors, on every rank alike.
void import_peft_adapter(const std::string& dir, ShardedModel& model);

}  // namespace fsdp::checkpoint

// Hugging Face interchange for any model family: a model directory of
// config.json + safetensors weights, as transformers' save_pretrained writes it.
//
// The checkpoint layer names no model: what it needs of one (config.json's
// text, the tensors an import may skip) comes in an HfModelInfo, which each
// model family fills in (train::hf_model_info, model_family.h). The names and
// layouts are the model's own, which each family keeps equal to transformers'
// (a Linear weight is (out, in); tied embeddings write no lm_head.weight).
// config.json gets the weights' "dtype" and `extra_config`'s keys (e.g. the
// training tokenizer's special token ids) over the family's text.
//
// Export (rank 0 writes; every rank takes part): each unit is gathered in turn
// (ShardedModel::gather_unit), so no rank ever holds more than one unit's full
// parameters. Files go to a temporary directory beside DIR that replaces DIR
// when complete (Note [Checkpoint commit] in sharded.h): a crash never leaves a
// half-written DIR. Above `max_shard_bytes` the weights are split as
// transformers does: model-00001-of-0000N.safetensors + model.safetensors.index.json
// ({"metadata": {"total_size"}, "weight_map": {name: file}}).
//
// Import: each rank reads only the bytes of its own shards. The files are
// memory-mapped; for each parameter, the overlap of its flat range with the
// rank's shard range is one contiguous element range of the parameter's
// row-major data, hence one contiguous byte range of the file. F32, BF16, F16
// (and F64) are converted to the shards' dtype.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/sharded.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/fsdp.h"

namespace torch::nn {
class Module;
}

namespace fsdp::checkpoint {

// "float32" | "fp32" -> kFloat, "bfloat16" | "bf16" -> kBFloat16, "float16" | "fp16" -> kHalf.
at::ScalarType parse_export_dtype(const std::string& s);
// Hugging Face's dtype name (config.json "dtype"): "float32", "bfloat16", "float16".
std::string hf_dtype_name(at::ScalarType t);

// How export_hf writes.
struct HfExportOptions {
  at::ScalarType dtype = at::kFloat;        // float32 (exact), bfloat16 or float16
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"; <= 0: one file
  // Merged into config.json over the model config's keys (e.g. the training
  // tokenizer's bos_token_id / eos_token_id).
  JsonValue extra_config = JsonValue::object();
  // Copied into DIR as they are: (source path, file name), each name one of
  // hf_side_file_names() and named once (e.g. the tokenizer files).
  std::vector<std::pair<std::string, std::string>> extra_files;
  bool progress = false;  // progress bar on stderr (rank 0; the caller checks isatty)
  // A model with LoRA adapters (models/lora.h) exports merged: each adapted
  // weight as W + (B A) * lora_scaling (alpha / r), the adapters left out —
  // a plain model for transformers. 0 (the default): a model with adapters is
  // refused (a PEFT adapter export is checkpoint/peft.h's).
  double lora_scaling = 0;
};

// What export_hf wrote.
struct HfExportResult {
  std::string dir;                 // the model directory
  std::vector<std::string> files;  // file names written (weights, index, config)
  IoStats io;                      // bytes rank 0 wrote (the same on every rank)
};

// The files of a Hugging Face model directory that go with the weights and
// are neither weights nor config.json: the tokenizer's (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, tokenizer.model,
// added_tokens.json, vocab.json, merges.txt, chat_template.jinja,
// chat_template.json, T5's spiece.model) and generation_config.json. An export carries over
// those of the --init-from directory, byte for byte (HfExportOptions::extra_files).
const std::vector<std::string>& hf_side_file_names();
// (absolute path, file name) of each of hf_side_file_names() present in `dir`.
std::vector<std::pair<std::string, std::string>> find_hf_side_files(const std::string& dir);

// Names an export writes (weights, index, config.json, hf_side_file_names());
// anything else in an existing DIR makes export refuse (a user's files are
// never replaced).
bool is_hf_export_file(const std::string& file_name);
// UsageError unless `dir` is absent, empty, or holds only files an export
// writes; its directory can be written (or created); and .tmp-<name> and
// .old-<name> beside it, which an export replaces, are absent or ours
// (Note [Ownership of what we delete], checkpoint/ownership.h).
void check_export_dir(const std::string& dir, const std::string& flag = "export_hf: dir");

// Whether import may skip a tensor of a directory that the model does not have.
using HfIgnorable = std::function<bool(const std::string& tensor_name)>;
// What export and import need to know of a model besides its parameters,
// whatever its family (the trainer's model families fill it in).
struct HfModelInfo {
  std::string config_json;  // config.json as the export writes it, without "dtype"
  std::string model_type;   // for messages
  // Tensors of a directory that import skips without complaint (named in
  // HfImportResult::ignored): tied copies, buffers older versions saved.
  HfIgnorable ignorable;
};

// Collective over `group` (every rank of the model's world); rank 0 writes DIR,
// holding a DirectoryLock on PARENT/.<name>.lock meanwhile (a second export to
// DIR is refused). Errors are raised on every rank; check_export_dir's
// refusals are UsageErrors.
HfExportResult export_hf(const std::string& dir, ShardedModel& model, const HfModelInfo& info,
                         comm::ProcessGroup& group, const HfExportOptions& options = {});

// The weights of a Hugging Face model directory: model.safetensors.index.json's
// weight_map, else model.safetensors, else the only *.safetensors file.
// UsageError naming the directory when there are none.
struct HfWeights {
  std::vector<std::string> files;                  // paths
  std::map<std::string, std::string> weight_map;   // tensor name -> path (empty: read headers)
};
// See HfWeights.
HfWeights find_hf_weights(const std::string& dir);

// What import_hf read.
struct HfImportResult {
  std::vector<std::string> files;    // safetensors files opened
  std::vector<std::string> ignored;  // tensors in the files that the model does not use (tied lm_head.weight, rotary inv_freq)
  IoStats io;                        // bytes read, summed over ranks
};

// Loads DIR's weights into the model's shards (every element; padding zeroed).
// LoRA adapters (models/lora.h) are not read and keep their values.
// UsageError (the same on every rank): a parameter missing from the files; a
// shape mismatch (naming the tensor and both shapes); tensors the model does
// not have (other than those listed under `ignored`); a malformed file.
// Collective over `group` (for the byte count only).
HfImportResult import_hf(const std::string& dir, ShardedModel& model, const HfModelInfo& info,
                         comm::ProcessGroup& group, bool progress = false);

// Loads DIR's weights into every parameter of an unsharded, materialized
// module (named as in named_parameters(): the Hugging Face names) — what rank
// 0 does before fully_shard broadcasts its values under sync_module_states.
// The same checks and errors as import_hf; result.io counts this process only.
HfImportResult import_hf_module(const std::string& dir, torch::nn::Module& module, const HfModelInfo& info,
                                bool progress = false);

}  // namespace fsdp::checkpoint

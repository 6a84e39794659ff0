#include "fsdp/checkpoint/peft.h"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "export_dir.h"
#include "file_io.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

const char* const kPeftPrefix = "base_model.model.";

namespace {

constexpr const char* kConfigName = "adapter_config.json";
constexpr const char* kWeightsName = "adapter_model.safetensors";

std::string shape_text(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

// The adapter file of DIR, checked against the adapters a model has (name ->
// shape, our names): every one present with its shape, nothing else.
std::unique_ptr<SafetensorsFile> open_adapter(const std::string& dir,
                                              const std::map<std::string, std::vector<int64_t>>& wanted) {
  const fs::path path = fs::path(dir) / kWeightsName;
  std::error_code ec;
  FSDP_CHECK(fs::is_regular_file(path, ec), "import_peft_adapter: dir ", dir, " has no ", kWeightsName,
             " (a PEFT adapter directory, as PeftModel.save_pretrained writes it)");
  FSDP_CHECK(!wanted.empty(), "import_peft_adapter: dir ", dir, ": the model has no LoRA adapters to load it into; "
             "give the adapter's LoraConfig::rank and LoraConfig::targets");
  auto file = std::make_unique<SafetensorsFile>(path.string());
  for (const auto& [name, shape] : wanted) {
    const SafetensorsEntry* e = file->find(kPeftPrefix + name);
    FSDP_CHECK(e != nullptr, "import_peft_adapter: dir ", dir, ": ", kWeightsName, " has no '", kPeftPrefix, name,
               "'; the adapter was trained with other LoraConfig::targets (see its ", kConfigName, ")");
    FSDP_CHECK(e->shape == shape, "import_peft_adapter: dir ", dir, ": '", e->name, "' has shape ",
               shape_text(e->shape), " but ", shape_text(shape), " in the model; give the adapter's "
               "LoraConfig::rank (its ", kConfigName, " 'r')");
  }
  for (const auto& e : file->entries()) {
    const bool ours = e.name.rfind(kPeftPrefix, 0) == 0 && wanted.count(e.name.substr(std::string(kPeftPrefix).size()));
    FSDP_CHECK(ours, "import_peft_adapter: dir ", dir, ": ", kWeightsName, " holds '", e.name, "', which is not a LoRA "
               "adapter of this model (modules_to_save, another model or other LoraConfig::targets)");
  }
  return file;
}

}  // namespace

bool is_peft_export_file(const std::string& n) {
  const auto& side = hf_side_file_names();
  return n == kConfigName || n == kWeightsName || std::find(side.begin(), side.end(), n) != side.end();
}

void check_peft_export_dir(const std::string& dir, const std::string& flag) {
  detail::check_export_dir_of(dir, flag, is_peft_export_file);
}

std::string peft_adapter_config_json(const models::LoraConfig& cfg, const std::string& base_model) {
  // peft reads lora_alpha as a number; an integral value is written as peft writes it.
  const nlohmann::json alpha = cfg.alpha == std::floor(cfg.alpha) && std::abs(cfg.alpha) < 1e15
                                   ? nlohmann::json(static_cast<int64_t>(cfg.alpha))
                                   : nlohmann::json(cfg.alpha);
  const nlohmann::json config = {
      {"alpha_pattern", nlohmann::json::object()},
      {"base_model_name_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layers_to_transform", nullptr},
      {"lora_alpha", alpha},
      {"lora_dropout", cfg.dropout},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", cfg.rank},
      {"rank_pattern", nlohmann::json::object()},
      {"revision", nullptr},
      {"target_modules", cfg.targets},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false},
  };
  return config.dump(2) + "\n";
}

HfExportResult export_peft_adapter(const std::string& dir, ShardedModel& model, const models::LoraConfig& cfg,
                                   comm::ProcessGroup& group, const PeftExportOptions& options) {
  bool any = false;
  for (const auto& u : model.units()) {
    for (const auto& p : u.params) any = any || models::is_lora_parameter(p.name);
  }
  FSDP_CHECK(any, "the model has no LoRA adapters to export as a PEFT adapter (give LoraConfig::rank N)");
  detail::ExportSpec spec;
  spec.flag = "export_peft_adapter: dir";
  spec.what = "the LoRA adapter";
  spec.dtype = options.dtype;
  spec.max_shard_bytes = 0;  // peft writes one file
  spec.single_name = kWeightsName;
  spec.tensor_name = [](const std::string& name) {
    return models::is_lora_parameter(name) ? kPeftPrefix + name : std::string();
  };
  spec.text_files.emplace_back(kConfigName, peft_adapter_config_json(cfg, options.base_model));
  spec.copied_files = options.extra_files;
  spec.is_export_file = is_peft_export_file;
  spec.progress = options.progress;
  return detail::export_dir(dir, model, group, spec);
}

models::LoraConfig read_peft_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigName).string();
  std::error_code ec;
  FSDP_CHECK(fs::is_regular_file(path, ec), "read_peft_adapter_config: dir ", dir, " has no ", kConfigName,
             " (a PEFT adapter directory, as PeftModel.save_pretrained writes it)");
  std::string why;
  std::optional<nlohmann::json> parsed = parse_json_input(io::read_text_file(path), why);
  FSDP_CHECK(parsed.has_value() && parsed->is_object(), path, " is not a JSON object (", why, ")");
  const nlohmann::json& j = *parsed;
  auto is = [&](const char* key, const nlohmann::json& want) { return !j.contains(key) || j[key] == want; };
  auto empty = [&](const char* key) { return !j.contains(key) || j[key].is_null() || j[key].empty(); };
  FSDP_CHECK(is("peft_type", "LORA"), path, ": peft_type ", j.value("peft_type", nlohmann::json()).dump(),
             " is not LORA; only LoRA adapters are supported");
  for (const char* key : {"use_rslora", "use_dora", "fan_in_fan_out"}) {
    FSDP_CHECK(is(key, false), path, ": ", key, " = ", j[key].dump(), " is not supported (vanilla LoRA only)");
  }
  FSDP_CHECK(is("bias", "none"), path, ": bias = ", j["bias"].dump(), " is not supported (only \"none\")");
  for (const char* key : {"modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"}) {
    FSDP_CHECK(empty(key), path, ": ", key, " = ", j[key].dump(), " is not supported (one rank and alpha for "
               "every targeted layer, no fully trained modules)");
  }
  models::LoraConfig cfg;
  try {
    cfg.rank = j.at("r").get<int64_t>();
    cfg.alpha = j.value("lora_alpha", 8.0);  // peft's defaults
    cfg.dropout = j.value("lora_dropout", 0.0);
    const nlohmann::json& t = j.at("target_modules");
    FSDP_CHECK(t.is_array(), path, ": target_modules = ", t.dump(), " is a regular expression; only a list of "
               "module names is supported");
    cfg.targets = t.get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    FSDP_CHECK(false, path, ": r, lora_alpha, lora_dropout or target_modules missing or mistyped (", e.what(), ")");
  }
  std::sort(cfg.targets.begin(), cfg.targets.end());
  check_lora_config(cfg);
  return cfg;
}

void import_peft_adapter_module(const std::string& dir, torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> wanted;
  const auto params = module.named_parameters(/*recurse=*/true);
  for (const auto& p : params) {
    if (models::is_lora_parameter(p.key())) wanted[p.key()] = p.value().sizes().vec();
  }
  const auto file = open_adapter(dir, wanted);
  at::NoGradGuard no_grad;
  for (const auto& [name, shape] : wanted) {
    const at::Tensor t = file->tensor(kPeftPrefix + name);
    params[name].copy_(t);
  }
}

void import_peft_adapter(const std::string& dir, ShardedModel& model) {
  const auto& units = model.units();
  std::map<std::string, std::vector<int64_t>> wanted;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      if (models::is_lora_parameter(p.name)) wanted[p.name] = p.shape;
    }
  }
  const auto file = open_adapter(dir, wanted);
  const std::vector<ShardRef> shards = model.shards();
  at::NoGradGuard no_grad;
  std::vector<float> buffer;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitInfo& ui = units[u];
    for (const auto& p : ui.params) {
      if (!models::is_lora_parameter(p.name)) continue;
      const int64_t lo = std::max(ui.shard_offset, p.flat_offset);
      const int64_t hi = std::min(ui.shard_offset + ui.shard_numel, p.flat_offset + p.numel);
      if (lo >= hi) continue;
      buffer.resize(static_cast<size_t>(hi - lo));
      file->read_as_float(*file->find(kPeftPrefix + p.name), lo - p.flat_offset, hi - lo, buffer.data());
      shards[u].param.narrow(0, lo - ui.shard_offset, hi - lo).copy_(at::from_blob(buffer.data(), {hi - lo}, at::kFloat));
    }
  }
}

}  // namespace fsdp::checkpoint

#include "fsdp/train/model_family.h"

#include <fmt/format.h>

#include <filesystem>

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/json_input.h"

namespace fsdp::train {

// Note [Model families]
// The trainer handles models through two small interfaces: ModelFamily (a
// name, presets, a config.json reader) and ModelConfig (one model's facts,
// how to build it, its units, its loss, its interchange with Hugging Face
// and DCP files). Each family lives in one file (family_llama.cpp,
// family_t5.cpp) with its concrete config type behind ModelConfig; the rest
// of the trainer, the checks, the checkpoints (whose "model" state records
// the family's name and its config.json), the exports and fsdp-inspect see
// only the interfaces. A config.json is dispatched on its model_type to the
// family that reads it; a preset name is looked up in every family. Adding a
// third family is a new file and an entry in model_families() (docs/models.md).

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {&llama_family(), &t5_family()};
  return families;
}

std::vector<std::string> all_model_presets() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) {
    for (const auto& n : f->presets()) names.push_back(n);
  }
  return names;
}

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// The family whose reader takes config.json `text`'s model_type; with none,
// the Llama family, whose reader names what it reads.
const ModelFamily& family_of_config(const std::string& text) {
  std::string why;
  const std::optional<nlohmann::json> j = parse_json_input(text, why);
  if (j && j->is_object() && j->contains("model_type") && (*j)["model_type"].is_string()) {
    const std::string type = (*j)["model_type"].get<std::string>();
    for (const ModelFamily* f : model_families()) {
      if (f->reads(type)) return *f;
    }
  }
  return llama_family();
}

}  // namespace

ModelConfigPtr resolve_model(const std::string& spec) {
  for (const ModelFamily* f : model_families()) {
    if (ModelConfigPtr c = f->preset(spec)) return c;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path path(spec);
  const std::string presets = joined(all_model_presets());
  if (fs::is_directory(path, ec)) {
    path /= "config.json";
    FSDP_CHECK(fs::exists(path, ec), "model directory '", spec, "' has no config.json — pass the directory of a "
               "Hugging Face checkpoint, a config.json, or a preset (", presets, ")");
  } else {
    FSDP_CHECK(fs::exists(path, ec), "unknown model '", spec, "': not a preset (", presets,
               ") and no file or directory of that name — pass a preset name, a Hugging Face config.json, or a "
               "directory containing one");
  }
  const std::string text = read_input_file(path.string(), "model config", kMaxJsonConfigBytes, "give a preset (" +
                                           presets + "), a Hugging Face config.json or a directory holding one");
  return family_of_config(text).parse(text, path.string());
}

nlohmann::json model_state(const ModelConfig& cfg) {
  return {{"family", cfg.family().name()}, {"config", nlohmann::json::parse(cfg.hf_config_json())}};
}

ModelConfigPtr saved_model_config(const nlohmann::json& saved, const std::string& origin) {
  FSDP_CHECK(saved.is_object() && saved.contains("family") && saved["family"].is_string() && saved.contains("config"),
             "checkpoint ", origin, " records no model (its state \"model\" is ", saved.dump(), "); it was not "
             "written by fsdp-train, or by a version that did not record its model");
  const std::string name = saved["family"].get<std::string>();
  for (const ModelFamily* f : model_families()) {
    if (f->name() == name) return f->parse(saved.at("config").dump(), origin);
  }
  FSDP_CHECK(false, "checkpoint ", origin, " holds a model of family '", name, "', which this build does not have");
  return nullptr;
}

checkpoint::HfModelInfo hf_model_info(const ModelConfig& cfg) {
  checkpoint::HfModelInfo info;
  info.config_json = cfg.hf_config_json();
  info.model_type = cfg.family().name();
  info.ignorable = cfg.hf_ignorable();
  return info;
}

std::string model_mismatch(const ModelConfig& a, const ModelConfig& b) {
  if (&a.family() != &b.family()) return fmt::format("model family {} vs {}", a.family().name(), b.family().name());
  return a.mismatch(b);
}

std::string saved_model_mismatch(const nlohmann::json& saved, const ModelConfig& cfg, const std::string& origin) {
  const ModelConfigPtr was = saved_model_config(saved, origin);
  if (&was->family() != &cfg.family()) {
    return fmt::format("model family {} vs {}", was->family().name(), cfg.family().name());
  }
  return cfg.mismatch(*was);
}

// Note [Last units kept]
// FSDP2 keeps its root's parameters after forward by default: backward starts
// there, so resharding it would only gather it again at once. fsdp-train's
// Llama has the output head and the embedding as units of their own (--wrap
// block), so the root holds almost nothing and that default saves nothing;
// the same reasoning applies to the units whose forward runs last — the head
// and the last decoder layer — which torchtitan keeps after forward by
// default for that reason. Keeping them holds their gathered parameters from
// their forward to their backward (the loss in between), which the plan and the
// memory check count like any unit's; it saves their all-gather in every
// backward: on the 7.1M Llama of the cluster bench, 40% of one backward's
// all-gather bytes. An explicit --reshard-after-forward (true, false or N)
// applies to every unit but the root, as before.
std::vector<UnitOverride> last_units_kept(const ModelConfig& cfg, const FsdpOptions& o) {
  const bool sharded_forward = o.strategy == ShardingStrategy::kFullShard || o.strategy == ShardingStrategy::kHybridShard;
  const bool every_layer_a_unit = o.wrap.kind == WrapPolicy::Kind::kByType || o.wrap.kind == WrapPolicy::Kind::kEveryUnit;
  std::vector<std::string> names = cfg.last_forward_units();
  if (!sharded_forward || !every_layer_a_unit || o.reshard_after_forward || names.empty()) return {};
  UnitOverride keep;
  keep.names = std::move(names);
  keep.options.reshard_after_forward = ReshardAfterForward(false);
  return {keep};
}

}  // namespace fsdp::train

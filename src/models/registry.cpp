#include "fsdp/models/registry.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fsdp/common/error.h"

namespace fsdp::models {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Shape {
  int64_t D, F, H, Hkv, L, V, max_pos;
};

LlamaConfig make(const std::string& name, const Shape& s, double theta, std::optional<RopeScaling> scaling,
                 bool tied, int64_t head_dim = 0, const std::string& model_type = "llama") {
  LlamaConfig c;
  c.name = name;
  c.model_type = model_type;
  c.hidden_size = s.D;
  c.intermediate_size = s.F;
  c.num_attention_heads = s.H;
  c.num_key_value_heads = s.Hkv;
  c.head_dim = head_dim;
  c.num_hidden_layers = s.L;
  c.vocab_size = s.V;
  c.max_position_embeddings = s.max_pos;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = theta;
  c.rope_scaling = scaling;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.02;
  return c;
}

// The published shapes (Hugging Face config.json of each checkpoint).
std::vector<LlamaConfig> presets() {
  const RopeScaling llama31{8.0, 1.0, 4.0, 8192};
  const RopeScaling llama32{32.0, 1.0, 4.0, 8192};
  //                               D      F      H   Hkv  L   V       max_pos
  return {
      make("llama2-7b",    {4096,  11008, 32, 32, 32, 32000,  4096},   10000.0, std::nullopt, false),
      make("llama2-13b",   {5120,  13824, 40, 40, 40, 32000,  4096},   10000.0, std::nullopt, false),
      make("llama2-70b",   {8192,  28672, 64, 8,  80, 32000,  4096},   10000.0, std::nullopt, false),
      make("llama3.1-8b",  {4096,  14336, 32, 8,  32, 128256, 131072}, 500000.0, llama31, false),
      make("llama3.1-70b", {8192,  28672, 64, 8,  80, 128256, 131072}, 500000.0, llama31, false),
      make("llama3.2-1b",  {2048,  8192,  32, 8,  16, 128256, 131072}, 500000.0, llama32, true, 64),
      make("llama3.2-3b",  {3072,  8192,  24, 8,  28, 128256, 131072}, 500000.0, llama32, true, 128),
      make("mistral-7b",   {4096,  14336, 32, 8,  32, 32000,  32768},  10000.0, std::nullopt, false, 0, "mistral"),
      make("tiny",         {128,   384,   4,  2,  4,  512,    1024},   10000.0, std::nullopt, false),
      make("small",        {512,   1536,  8,  4,  8,  512,    2048},   10000.0, std::nullopt, false),
  };
}

std::string joined_presets() {
  std::string out;
  for (const auto& n : list_model_presets()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Typed access to config.json fields with errors naming the file and field.
class Fields {
 public:
  Fields(const json& j, std::string origin, std::string prefix = "")
      : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  const json* find(const char* f) const {
    auto it = j_.find(f);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }
  const json& required(const char* f) const {
    const json* v = find(f);
    FSDP_CHECK(v != nullptr, where(), "required field '", prefix_, f, "' is missing",
               " — add it (see the config.json published with the checkpoint) or use a preset (", joined_presets(), ")");
    return *v;
  }
  int64_t to_int(const char* f, const json& v) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
    }
    FSDP_CHECK(false, where(), "field '", prefix_, f, "' must be an integer, got ", v.dump());
    return 0;
  }
  double to_double(const char* f, const json& v) const {
    FSDP_CHECK(v.is_number(), where(), "field '", prefix_, f, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  int64_t req_int(const char* f) const { return to_int(f, required(f)); }
  double req_double(const char* f) const { return to_double(f, required(f)); }
  int64_t int_or(const char* f, int64_t d) const {
    const json* v = find(f);
    return v ? to_int(f, *v) : d;
  }
  double double_or(const char* f, double d) const {
    const json* v = find(f);
    return v ? to_double(f, *v) : d;
  }
  bool bool_or(const char* f, bool d) const {
    const json* v = find(f);
    if (!v) return d;
    FSDP_CHECK(v->is_boolean(), where(), "field '", prefix_, f, "' must be true or false, got ", v->dump());
    return v->get<bool>();
  }
  std::string string_or(const char* f, const std::string& d) const {
    const json* v = find(f);
    if (!v) return d;
    FSDP_CHECK(v->is_string(), where(), "field '", prefix_, f, "' must be a string, got ", v->dump());
    return v->get<std::string>();
  }
  std::string where() const { return "config.json '" + origin_ + "': "; }

 private:
  const json& j_;
  std::string origin_;
  std::string prefix_;
};

}  // namespace

std::vector<std::string> list_model_presets() {
  std::vector<std::string> names;
  for (const auto& c : presets()) names.push_back(c.name);
  return names;
}

std::optional<LlamaConfig> llama_preset(const std::string& name) {
  for (auto& c : presets()) {
    if (c.name == name) return c;
  }
  return std::nullopt;
}

LlamaConfig parse_hf_config(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    FSDP_CHECK(false, "config.json '", origin, "' is not valid JSON: ", e.what(),
               " — point the model spec at a Hugging Face config.json or use a preset (", joined_presets(), ")");
  }
  FSDP_CHECK(j.is_object(), "config.json '", origin, "' must hold a JSON object, got ", j.type_name());
  const Fields f(j, origin);

  LlamaConfig c;
  c.name = origin;
  const json& mt = f.required("model_type");
  FSDP_CHECK(mt.is_string() && (mt.get<std::string>() == "llama" || mt.get<std::string>() == "mistral"), f.where(),
             "model_type ", mt.dump(), " is not supported — this build reads \"llama\" and \"mistral\" configs");
  c.model_type = mt.get<std::string>();

  c.hidden_size = f.req_int("hidden_size");
  c.intermediate_size = f.req_int("intermediate_size");
  c.num_attention_heads = f.req_int("num_attention_heads");
  c.num_hidden_layers = f.req_int("num_hidden_layers");
  c.vocab_size = f.req_int("vocab_size");
  c.max_position_embeddings = f.req_int("max_position_embeddings");
  c.rms_norm_eps = f.req_double("rms_norm_eps");
  c.num_key_value_heads = f.int_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.int_or("head_dim", 0);
  c.rope_theta = f.double_or("rope_theta", 10000.0);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.initializer_range = f.double_or("initializer_range", 0.02);

  FSDP_CHECK(!f.bool_or("attention_bias", false), f.where(),
             "attention_bias = true is not supported (Llama/Mistral projections have no bias)");
  FSDP_CHECK(!f.bool_or("mlp_bias", false), f.where(), "mlp_bias = true is not supported (Llama MLPs have no bias)");
  const std::string act = f.string_or("hidden_act", "silu");
  FSDP_CHECK(act == "silu", f.where(), "hidden_act '", act, "' is not supported (Llama's SwiGLU uses \"silu\")");

  if (const json* rs = f.find("rope_scaling")) {
    FSDP_CHECK(rs->is_object(), f.where(), "field 'rope_scaling' must be an object or null, got ", rs->dump());
    const Fields s(*rs, origin, "rope_scaling.");
    // "type" is the older spelling of "rope_type" (as transformers accepts).
    std::string type = s.string_or("rope_type", s.string_or("type", "default"));
    if (type == "llama3") {
      RopeScaling r;
      r.factor = s.req_double("factor");
      r.low_freq_factor = s.req_double("low_freq_factor");
      r.high_freq_factor = s.req_double("high_freq_factor");
      r.original_max_position_embeddings = s.req_int("original_max_position_embeddings");
      c.rope_scaling = r;
    } else {
      FSDP_CHECK(type == "default", f.where(), "rope_scaling type '", type,
                 "' is not supported — only \"llama3\" (Llama 3.1/3.2) and \"default\"; set rope_scaling to null "
                 "for plain RoPE");
    }
  }
  c.validate();
  return c;
}

LlamaConfig resolve_model_config(const std::string& spec) {
  if (auto preset = llama_preset(spec)) {
    preset->validate();
    return *preset;
  }
  std::error_code ec;
  fs::path path(spec);
  const bool is_dir = fs::is_directory(path, ec);
  if (is_dir) {
    path /= "config.json";
    FSDP_CHECK(fs::exists(path, ec), "model directory '", spec,
               "' has no config.json — pass the directory of a Hugging Face checkpoint, a config.json, or a preset (",
               joined_presets(), ")");
  } else {
    FSDP_CHECK(fs::exists(path, ec), "unknown model '", spec, "': not a preset (", joined_presets(),
               ") and no file or directory of that name — pass a preset name, a Hugging Face config.json, or a "
               "directory containing one");
  }
  std::ifstream in(path);
  FSDP_CHECK(in.good(), "cannot read model config '", path.string(), "' — check the path and its permissions");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hf_config(text.str(), path.string());
}

}  // namespace fsdp::models

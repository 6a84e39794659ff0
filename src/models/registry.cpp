#include "fsdp/models/registry.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <filesystem>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/common/files.h"
#include "models/config_fields.h"

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

// Qwen2/Qwen3 presets: rms_norm_eps 1e-6, rope_theta 1e6, tied embeddings,
// use_sliding_window false (so no window and every layer "full_attention",
// as transformers reads those configs), max_window_layers as published.
LlamaConfig qwen(const std::string& name, const std::string& model_type, const Shape& s, int64_t head_dim,
                 int64_t max_window_layers) {
  LlamaConfig c = make(name, s, 1000000.0, std::nullopt, /*tied=*/true, head_dim, model_type);
  c.rms_norm_eps = 1e-6;
  c.max_window_layers = max_window_layers;
  c.layer_types.assign(static_cast<size_t>(s.L), "full_attention");
  return c;
}

// Mixtral presets: mistral's attention without a window, E experts of width F
// per layer, K per token.
LlamaConfig mixtral(const std::string& name, const Shape& s, int64_t experts, int64_t per_token, double theta,
                    double aux_loss_coef) {
  LlamaConfig c = make(name, s, theta, std::nullopt, /*tied=*/false, /*head_dim=*/0, "mixtral");
  c.num_local_experts = experts;
  c.num_experts_per_tok = per_token;
  c.router_aux_loss_coef = aux_loss_coef;
  return c;
}

LlamaConfig with_sliding_window(LlamaConfig c, int64_t window) {
  c.sliding_window = window;
  return c;
}

// The published shapes (Hugging Face config.json of each checkpoint; registry.h
// names the repositories).
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
      with_sliding_window(  // Mistral-7B-v0.1 attends to the last 4096 tokens
          make("mistral-7b", {4096, 14336, 32, 8, 32, 32000, 32768}, 10000.0, std::nullopt, false, 0, "mistral"), 4096),
      make("mathstral-7b", {4096,  14336, 32, 8,  32, 32768,  32768},  1000000.0, std::nullopt, false, 0, "mistral"),
      qwen("qwen2.5-0.5b", "qwen2", {896, 4864, 14, 2, 24, 151936, 32768}, /*head_dim=*/0, /*max_window_layers=*/24),
      qwen("qwen3-0.6b",   "qwen3", {1024, 3072, 16, 8, 28, 151936, 40960}, /*head_dim=*/128, /*max_window_layers=*/28),
      // Mixtral-8x7B-v0.1: 8 experts, 2 per token, sliding_window null.
      mixtral("mixtral-8x7b", {4096, 14336, 32, 8, 32, 32000, 32768}, /*experts=*/8, /*per_token=*/2, 1000000.0, 0.02),
      make("tiny",         {128,   384,   4,  2,  4,  512,    1024},   10000.0, std::nullopt, false),
      make("small",        {512,   1536,  8,  4,  8,  512,    2048},   10000.0, std::nullopt, false),
      mixtral("tiny-mixtral", {128, 384, 4, 2, 4, 512, 1024}, /*experts=*/4, /*per_token=*/2, 10000.0, 0.02),
  };
}

std::string joined_presets() {
  std::string out;
  for (const auto& n : list_model_presets()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Note [config.json keys]
// parse_hf_config never guesses. Every top-level key of a llama / mistral /
// qwen2 / qwen3 config.json is in exactly one of three groups:
//  - read: the parser implements what transformers does with it, or refuses a
//    value that would need math this build does not have (a UsageError naming
//    the key, its value and what to do);
//  - kHarmlessKeys below: keys that change neither outputs nor gradients of
//    LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
//    Qwen3ForCausalLM in transformers 4.x or 5.x (bookkeeping, storage dtype,
//    inference and generation settings);
//  - anything else: refused. A key we do not know may be a new transformers
//    feature that changes the model; ignoring it would train a different model
//    than the checkpoint's without a word, which costs far more than the edit
//    the message asks for (delete the key once it is known to be harmless
//    there, or ask for it to be listed here).
// Which keys are read depends on model_type: transformers' config classes
// differ (e.g. Qwen2Config has no attention_bias — its q/k/v biases are always
// on — so a qwen2 config carrying one is refused as unknown).
constexpr const char* kHarmlessKeys[] = {
    // Bookkeeping that transformers and conversion scripts write.
    "_name_or_path", "_commit_hash", "architectures", "transformers_version", "tokenizer_class",
    // The stored weights' dtype: import converts to the training dtype.
    "dtype", "torch_dtype",
    // Inference only: the KV cache.
    "use_cache",
    // Which attention kernel transformers runs (each computes the same attention),
    // and a training-memory switch older configs carry.
    "_attn_implementation", "attn_implementation", "_attn_implementation_autoset", "gradient_checkpointing",
    // transformers 4.x split the matmuls into this many slices (the same math);
    // 5.x ignores it.
    "pretraining_tp",
    // LLaMA-1 conversions; transformers never reads it.
    "max_sequence_length",
    // PretrainedConfig settings that LlamaForCausalLM / MistralForCausalLM
    // do not use for training math: output selection, task heads' labels.
    "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "is_decoder", "is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size",
    "chunk_size_feed_forward", "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "prefix",
    "task_specific_params",
    // Generation defaults that older configs carry (GenerationConfig's business).
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "sep_token_id",
    "decoder_start_token_id",
};

// Keys parse_hf_config reads for every model type.
constexpr const char* kReadKeys[] = {
    "model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "tie_word_embeddings", "initializer_range", "hidden_act",
    "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id", "pruned_heads",
};
// And per model type, the keys of its transformers config class.
constexpr const char* kLlamaKeys[] = {"attention_bias", "mlp_bias"};
// MistralConfig has neither bias key (its projections never have biases);
// older readers accepted them as false, and still do.
constexpr const char* kMistralKeys[] = {"attention_bias", "mlp_bias", "sliding_window"};
// MixtralConfig: no bias keys (a Mixtral config carrying one is refused as unknown).
constexpr const char* kMixtralKeys[] = {"sliding_window",       "num_local_experts",   "num_experts_per_tok",
                                        "router_aux_loss_coef", "router_jitter_noise", "output_router_logits"};
// use_mrope: Qwen2.5 configs carry "use_mrope": false; transformers' Qwen2
// never reads it (multimodal rope belongs to Qwen2-VL, another model_type).
constexpr const char* kQwen2Keys[] = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                      "use_mrope"};
constexpr const char* kQwen3Keys[] = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types",
                                      "attention_bias"};

template <size_t N>
bool listed(const char* const (&keys)[N], const std::string& key) {
  return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
}

// A JSON value for an error message, cut short.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

bool read_for(const std::string& model_type, const std::string& key) {
  if (model_type == "llama") return listed(kLlamaKeys, key);
  if (model_type == "mistral") return listed(kMistralKeys, key);
  if (model_type == "mixtral") return listed(kMixtralKeys, key);
  if (model_type == "qwen2") return listed(kQwen2Keys, key);
  if (model_type == "qwen3") return listed(kQwen3Keys, key);
  return false;
}

void refuse_unknown_keys(const json& j, const Fields& f, const std::string& model_type) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (listed(kReadKeys, key) || listed(kHarmlessKeys, key) || read_for(model_type, key)) continue;
    FSDP_CHECK(key != "quantization_config", f.where(), "quantization_config is set: quantized checkpoints are not "
               "supported — use the model's unquantized (bf16/fp16/fp32) weights");
    FSDP_CHECK(false, f.where(), "key '", key, "' = ", shown(it.value()), " is not one this reader knows for "
               "model_type \"", model_type, "\"; it may change the model's math, so the config is refused rather "
               "than guessed at — if transformers ignores it for this model, delete it from config.json; "
               "otherwise this model is not supported yet (see docs/huggingface.md, \"Reading config.json\")");
  }
}

// The rotary embedding a config.json describes, resolved as transformers 5
// does (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict and
// standardize_rope_params): the dict is "rope_scaling" (transformers 4) when
// set and non-empty, else "rope_parameters" (transformers 5); rope_theta comes
// from that dict, else from the top level, else 10000; rope_type ("type" is
// its older spelling) defaults to "default"; llama3's
// original_max_position_embeddings defaults to max_position_embeddings. Where
// transformers would silently prefer one of two disagreeing values, this
// refuses instead.
struct Rope {
  double theta = 10000.0;
  std::optional<RopeScaling> scaling;
};

std::string describe(const Rope& r) {
  std::ostringstream os;
  os << "rope_theta " << r.theta;
  if (r.scaling) {
    os << ", llama3 factor " << r.scaling->factor << " low_freq_factor " << r.scaling->low_freq_factor
       << " high_freq_factor " << r.scaling->high_freq_factor << " original_max_position_embeddings "
       << r.scaling->original_max_position_embeddings;
  } else {
    os << ", rope_type default";
  }
  return os.str();
}

bool same(const Rope& a, const Rope& b) {
  if (a.theta != b.theta || a.scaling.has_value() != b.scaling.has_value()) return false;
  if (!a.scaling) return true;
  const RopeScaling& x = *a.scaling;
  const RopeScaling& y = *b.scaling;
  return x.factor == y.factor && x.low_freq_factor == y.low_freq_factor && x.high_freq_factor == y.high_freq_factor &&
         x.original_max_position_embeddings == y.original_max_position_embeddings;
}

Rope read_rope_dict(const json& d, const std::string& key, const std::string& origin, std::optional<double> top_theta,
                    int64_t max_position_embeddings, double default_theta) {
  const Fields s(d, origin, key + ".", "use a preset (" + joined_presets() + ")");
  const std::string rope_type = s.string_or("rope_type", "");
  const std::string old_type = s.string_or("type", "");
  FSDP_CHECK(rope_type.empty() || old_type.empty() || rope_type == old_type, s.where(), key, ".rope_type '", rope_type,
             "' and ", key, ".type '", old_type, "' disagree — keep one of them");
  const std::string type = !rope_type.empty() ? rope_type : (!old_type.empty() ? old_type : "default");
  FSDP_CHECK(type == "default" || type == "llama3", s.where(), key, ".rope_type '", type,
             "' is not supported — only \"default\" (plain RoPE) and \"llama3\" (Llama 3.1/3.2) are implemented; "
             "other types (linear, dynamic, yarn, longrope, ...) place positions differently, so this model cannot "
             "be trained here yet");
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string& k = it.key();
    const bool common = k == "rope_type" || k == "type" || k == "rope_theta" || k == "partial_rotary_factor";
    const bool llama3 = k == "factor" || k == "low_freq_factor" || k == "high_freq_factor" ||
                        k == "original_max_position_embeddings";
    FSDP_CHECK(common || (llama3 && type == "llama3"), s.where(), "key '", key, ".", k, "' = ", shown(it.value()),
               " is not a parameter of rope_type \"", type, "\" — delete it (transformers ignores it with a "
               "warning) or fix rope_type");
  }
  const double partial = s.double_or("partial_rotary_factor", 1.0);
  FSDP_CHECK(partial == 1.0, s.where(), key, ".partial_rotary_factor = ", partial,
             " is not supported — partial rotary embeddings are not implemented (Llama and Mistral rotate all of "
             "head_dim: 1.0)");
  Rope r;
  if (const json* t = s.find("rope_theta")) {
    r.theta = s.to_double("rope_theta", *t);
    FSDP_CHECK(!top_theta || *top_theta == r.theta, s.where(), "rope_theta = ", *top_theta, " at the top level but ",
               r.theta, " in ", key, " — transformers would use ", key, "'s; make them agree or delete one");
  } else {
    r.theta = top_theta.value_or(default_theta);
  }
  if (type == "llama3") {
    RopeScaling l;
    l.factor = s.req_double("factor");
    l.low_freq_factor = s.req_double("low_freq_factor");
    l.high_freq_factor = s.req_double("high_freq_factor");
    l.original_max_position_embeddings = s.int_or("original_max_position_embeddings", max_position_embeddings);
    r.scaling = l;
  }
  return r;
}

// default_theta: the config class's rope_theta when a config.json gives none
// (transformers' `default_theta`: 1e6 for MixtralConfig, 10000 for the others).
Rope read_rope(const Fields& f, const std::string& origin, int64_t max_position_embeddings, double default_theta) {
  std::optional<double> top_theta;
  if (const json* t = f.find("rope_theta")) top_theta = f.to_double("rope_theta", *t);
  const double partial = f.double_or("partial_rotary_factor", 1.0);
  FSDP_CHECK(partial == 1.0, f.where(), "partial_rotary_factor = ", partial,
             " is not supported — partial rotary embeddings are not implemented (Llama and Mistral rotate all of "
             "head_dim: 1.0)");
  // transformers treats null and {} alike: not set.
  auto dict = [&](const char* key) -> const json* {
    const json* d = f.find(key);
    if (d == nullptr) return nullptr;
    FSDP_CHECK(d->is_object(), f.where(), "field '", key, "' must be an object or null, got ", shown(*d));
    return d->empty() ? nullptr : d;
  };
  const json* scaling = dict("rope_scaling");
  const json* parameters = dict("rope_parameters");
  Rope r;
  r.theta = top_theta.value_or(default_theta);
  if (parameters != nullptr) {
    r = read_rope_dict(*parameters, "rope_parameters", origin, top_theta, max_position_embeddings, default_theta);
  }
  if (scaling != nullptr) {
    const Rope s =
        read_rope_dict(*scaling, "rope_scaling", origin, top_theta, max_position_embeddings, default_theta);
    FSDP_CHECK(parameters == nullptr || same(s, r), f.where(), "rope_scaling (transformers 4 form: ", describe(s),
               ") and rope_parameters (transformers 5 form: ", describe(r),
               ") disagree — transformers would use rope_scaling; keep the one that is right and delete the other");
    r = s;
  }
  return r;
}

}  // namespace

std::vector<std::string> harmless_hf_config_keys() {
  return std::vector<std::string>(std::begin(kHarmlessKeys), std::end(kHarmlessKeys));
}

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
  std::string why;
  std::optional<json> parsed = parse_json_input(json_text, why);
  FSDP_CHECK(parsed.has_value(), "config.json '", origin, "' is not valid JSON: ", why,
             " — point the model spec at a Hugging Face config.json or use a preset (", joined_presets(), ")");
  const json j = std::move(*parsed);
  FSDP_CHECK(j.is_object(), "config.json '", origin, "' must hold a JSON object, got ", j.type_name());
  const Fields f(j, origin, "", "use a preset (" + joined_presets() + ")");

  LlamaConfig c;
  c.name = origin;
  const json& mt = f.required("model_type");
  const std::string type = mt.is_string() ? mt.get<std::string>() : "";
  FSDP_CHECK(type == "llama" || type == "mistral" || type == "mixtral" || type == "qwen2" || type == "qwen3", f.where(),
             "model_type ", mt.dump(), " is not supported — this build reads \"llama\", \"mistral\", \"mixtral\", "
             "\"qwen2\" and \"qwen3\" configs");
  c.model_type = type;
  const bool qwen = type == "qwen2" || type == "qwen3";
  refuse_unknown_keys(j, f, c.model_type);  // Note [config.json keys]

  c.hidden_size = f.req_int("hidden_size");
  c.intermediate_size = f.req_int("intermediate_size");
  c.num_attention_heads = f.req_int("num_attention_heads");
  c.num_hidden_layers = f.req_int("num_hidden_layers");
  c.vocab_size = f.req_int("vocab_size");
  c.max_position_embeddings = f.req_int("max_position_embeddings");
  c.rms_norm_eps = f.req_double("rms_norm_eps");
  c.num_key_value_heads = f.int_or("num_key_value_heads", c.num_attention_heads);
  // Qwen3Config's head_dim defaults to 128, the others' to D / H.
  c.head_dim = f.int_or("head_dim", type == "qwen3" ? 128 : 0);
  // Given, it is used as it is (transformers too): 0 would be heads of no width.
  FSDP_CHECK(f.find("head_dim") == nullptr || c.head_dim > 0, f.where(), "head_dim = ", c.head_dim,
             " must be positive — leave head_dim out (or null) to use hidden_size / num_attention_heads");
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.initializer_range = f.double_or("initializer_range", 0.02);

  if (type == "qwen3") {
    c.attention_bias = f.bool_or("attention_bias", false);  // q, k, v and o biases
  } else {
    FSDP_CHECK(!f.bool_or("attention_bias", false), f.where(),
               "attention_bias = true is not supported (Llama/Mistral projections have no bias)");
    FSDP_CHECK(!f.bool_or("mlp_bias", false), f.where(), "mlp_bias = true is not supported (Llama MLPs have no bias)");
  }
  const std::string act = f.string_or("hidden_act", "silu");
  // transformers' ACT2FN maps "swish" to the same SiLU.
  FSDP_CHECK(act == "silu" || act == "swish", f.where(), "hidden_act '", act,
             "' is not supported (Llama's SwiGLU uses \"silu\")");
  // Dropout would make training differ from transformers' model.train(); inference ignores it.
  const double dropout = f.double_or("attention_dropout", 0.0);
  FSDP_CHECK(dropout == 0.0, f.where(), "attention_dropout = ", dropout,
             " is not supported — attention dropout is not implemented; set it to 0.0 (Llama and Mistral use 0.0)");

  const Rope rope = read_rope(f, origin, c.max_position_embeddings, type == "mixtral" ? 1000000.0 : 10000.0);
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;

  // The attention window, as transformers 5's config classes resolve it.
  // MistralConfig and Qwen2Config/Qwen3Config default sliding_window to 4096
  // when the key is absent (null: no window); MixtralConfig to null. Qwen
  // keeps it only with use_sliding_window, and then slides the layers
  // layer_types names, by default layers i >= max_window_layers.
  if (type == "mixtral") {
    if (const json* w = f.find("sliding_window")) c.sliding_window = f.to_int("sliding_window", *w);
    // MixtralConfig's defaults for absent keys.
    c.num_local_experts = f.int_or("num_local_experts", 8);
    c.num_experts_per_tok = f.int_or("num_experts_per_tok", 2);
    c.router_aux_loss_coef = f.double_or("router_aux_loss_coef", 0.001);
    c.router_jitter_noise = f.double_or("router_jitter_noise", 0.0);
    c.output_router_logits = f.bool_or("output_router_logits", false);
  }
  if (type == "mistral" || qwen) {
    const bool given = j.contains("sliding_window");
    const json* w = f.find("sliding_window");
    std::optional<int64_t> window;
    if (w != nullptr) {
      window = f.to_int("sliding_window", *w);
    } else if (!given) {
      window = 4096;
    }
    if (qwen && !f.bool_or("use_sliding_window", false)) window = std::nullopt;
    c.sliding_window = window;
  }
  c.check_size_limits();  // before num_hidden_layers sizes the layer list below
  if (qwen) {
    c.max_window_layers = f.int_or("max_window_layers", 28);
    if (const json* lt = f.find("layer_types")) {
      FSDP_CHECK(lt->is_array(), f.where(), "field 'layer_types' must be a list of strings or null, got ", shown(*lt));
      for (const json& e : *lt) {
        FSDP_CHECK(e.is_string(), f.where(), "field 'layer_types' must be a list of strings, got ", shown(*lt));
        c.layer_types.push_back(e.get<std::string>());
      }
    } else {
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        c.layer_types.push_back(c.sliding_window && i >= c.max_window_layers ? "sliding_attention" : "full_attention");
      }
    }
  }

  // Configs saved with every PretrainedConfig attribute carry "pruned_heads": {}.
  if (const json* v = f.find("pruned_heads")) {
    FSDP_CHECK(v->is_object() && v->empty(), f.where(), "pruned_heads = ", shown(*v),
               " is not supported (pruned attention heads change the model) — use an unpruned checkpoint");
  }

  // Special token ids: kept for exports (llama_config.h), not used in the math.
  if (const json* v = f.find("bos_token_id")) c.bos_token_id = f.to_int("bos_token_id", *v);
  if (const json* v = f.find("eos_token_id")) {
    if (v->is_array()) {
      for (const json& e : *v) c.eos_token_id.push_back(f.to_int("eos_token_id", e));
    } else {
      c.eos_token_id.push_back(f.to_int("eos_token_id", *v));
    }
  }
  // transformers builds the embedding with padding_idx = pad_token_id: that
  // row gets no gradient (layers.h, EmbeddingImpl). validate() checks the range.
  if (const json* v = f.find("pad_token_id")) c.pad_token_id = f.to_int("pad_token_id", *v);
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
  const std::string text = read_input_file(path.string(), "model config", kMaxJsonConfigBytes, "give a preset (" +
                                           joined_presets() + "), a Hugging Face config.json or a directory holding one");
  return parse_hf_config(text, path.string());
}

}  // namespace fsdp::models

#include "fsdp/models/t5_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/models/registry.h"
#include "models/config_fields.h"

namespace fsdp::models {
namespace {

using json = nlohmann::json;

struct Shape {
  int64_t D, Dh, F, H, L, V;
};

// The original form (Note [T5 variants]): relu, tied, scaled.
T5Config original(const std::string& name, const Shape& s) {
  T5Config c;
  c.name = name;
  c.d_model = s.D;
  c.d_kv = s.Dh;
  c.d_ff = s.F;
  c.num_heads = s.H;
  c.num_layers = c.num_decoder_layers = s.L;
  c.vocab_size = s.V;
  return c;
}

// T5 v1.1 / flan-T5: gated-gelu, an lm_head of its own, no scaling.
T5Config v1_1(const std::string& name, const Shape& s) {
  T5Config c = original(name, s);
  c.feed_forward_proj = "gated-gelu";
  c.tie_word_embeddings = false;
  c.scale_decoder_outputs = false;
  return c;
}

std::vector<T5Config> presets() {
  //                              D     Dh   F      H    L   V
  return {
      original("t5-small",       {512,  64,  2048,  8,   6,  32128}),
      original("t5-base",        {768,  64,  3072,  12,  12, 32128}),
      original("t5-large",       {1024, 64,  4096,  16,  24, 32128}),
      original("t5-3b",          {1024, 128, 16384, 32,  24, 32128}),
      original("t5-11b",         {1024, 128, 65536, 128, 24, 32128}),
      v1_1("flan-t5-small",      {512,  64,  1024,  6,   8,  32128}),
      v1_1("flan-t5-base",       {768,  64,  2048,  12,  12, 32128}),
      v1_1("flan-t5-xl",         {2048, 64,  5120,  32,  24, 32128}),
      original("t5-tiny",        {64,   16,  128,   4,   2,  512}),
      v1_1("t5-tiny-v1.1",       {64,   16,  128,   4,   2,  512}),
  };
}

// T5's own keys of config.json: read by parse_t5_config.
constexpr const char* kT5Keys[] = {
    "model_type", "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
    "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
    "initializer_factor", "feed_forward_proj", "tie_word_embeddings", "scale_decoder_outputs", "dropout_rate",
    "pad_token_id", "eos_token_id", "decoder_start_token_id", "dense_act_fn", "is_gated_act",
};
// Harmless for T5 besides the common list (registry.h): the positions older
// configs carry (T5 has relative positions: nothing reads it), a generation
// switch, a classification head's dropout (another model class), and the
// bos id transformers' PretrainedConfig writes as null.
constexpr const char* kT5HarmlessKeys[] = {"n_positions", "output_past", "classifier_dropout", "bos_token_id"};

template <size_t N>
bool listed(const char* const (&keys)[N], const std::string& key) {
  return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
}

std::string joined_presets() {
  std::string out;
  for (const auto& n : t5_preset_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

double attention_weights(const T5Config& c) { return static_cast<double>(4 * c.d_model * c.num_heads * c.d_kv); }
double ff_weights(const T5Config& c) { return static_cast<double>((c.gated() ? 3 : 2) * c.d_model * c.d_ff); }

}  // namespace

bool T5Config::gated() const { return feed_forward_proj.rfind("gated-", 0) == 0; }

std::string T5Config::activation() const {
  const std::string act = gated() ? feed_forward_proj.substr(6) : feed_forward_proj;
  return feed_forward_proj == "gated-gelu" ? std::string("gelu_new") : act;  // transformers' alias
}

int64_t T5Config::num_parameters() const {
  const int64_t D = d_model, A = 4 * d_model * num_heads * d_kv, FF = (gated() ? 3 : 2) * d_model * d_ff;
  const int64_t V = vocab_size;
  return V * D + (tie_word_embeddings ? 0 : V * D) + 2 * D + num_layers * (A + FF + 2 * D) +
         num_decoder_layers * (2 * A + FF + 3 * D) + 2 * relative_attention_num_buckets * num_heads;
}

double T5Config::training_flops_per_token(int64_t seq_len) const {
  const double L = static_cast<double>(num_layers), Ld = static_cast<double>(num_decoder_layers);
  const double HDh = static_cast<double>(num_heads * d_kv), T = static_cast<double>(seq_len);
  const double matmul = L * (attention_weights(*this) + ff_weights(*this)) +
                        Ld * (2 * attention_weights(*this) + ff_weights(*this)) +
                        static_cast<double>(d_model) * static_cast<double>(vocab_size);
  // Attention's two products per layer: the encoder's and the decoder's self-
  // and cross-attention (Ts = Tt = T).
  return 6 * matmul + 12 * (L + 2 * Ld) * HDh * T;
}

double T5Config::forward_flops_per_token(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                         int64_t seq_len) const {
  double flops = 0;
  const double HDh = static_cast<double>(num_heads * d_kv), T = static_cast<double>(seq_len);
  for (const auto& [name, shape] : params) {
    if (shape.size() != 2) continue;  // norms: no matrix product
    if (ends_with(name, "relative_attention_bias.weight")) continue;  // a lookup
    if (name == "shared.weight" && !tie_word_embeddings) continue;    // only the lookups then
    flops += 2 * static_cast<double>(shape[0]) * static_cast<double>(shape[1]);
    if (ends_with(name, ".q.weight")) flops += 4 * HDh * T;  // scores and their weighted sum
  }
  return flops;
}

void T5Config::validate() const {
  const auto in = [&](const char* field, int64_t v, int64_t lo, int64_t hi, const char* fix) {
    FSDP_CHECK(v >= lo && v <= hi, "T5 config '", name, "': ", field, " = ", v, " is outside [", lo, ", ", hi, "] — ",
               fix);
  };
  in("d_model", d_model, 1, kMaxWidth, "give the model width of the checkpoint");
  in("d_kv", d_kv, 1, kMaxWidth, "give the head dimension");
  in("d_ff", d_ff, 1, kMaxFeedForward, "give the feed-forward width");
  in("num_heads", num_heads, 1, kMaxHeads, "give the attention heads");
  in("num_layers", num_layers, 1, kMaxLayers, "give the encoder's blocks");
  in("num_decoder_layers", num_decoder_layers, 1, kMaxLayers, "give the decoder's blocks");
  in("vocab_size", vocab_size, 1, kMaxVocabSize, "give the vocabulary's size");
  // The encoder splits the buckets between the two directions and keeps half
  // of each exact: below 4 a direction has no exact bucket, and the bucket
  // arithmetic divides by zero (transformers' too) and indexes out of range.
  in("relative_attention_num_buckets", relative_attention_num_buckets, 4, kMaxHeads,
     "T5 uses 32; the encoder needs at least 4 (an exact bucket per direction)");
  // Half of the buckets (of each direction, encoder) are exact; the others are
  // logarithmic up to max_distance, which must lie beyond the exact ones.
  in("relative_attention_max_distance", relative_attention_max_distance, relative_attention_num_buckets / 2 + 1,
     int64_t{1} << 31, "T5 uses 128: it must exceed half of relative_attention_num_buckets");
  FSDP_CHECK(std::isfinite(layer_norm_epsilon) && layer_norm_epsilon > 0, "T5 config '", name,
             "': layer_norm_epsilon must be > 0, got ", layer_norm_epsilon);
  FSDP_CHECK(std::isfinite(initializer_factor) && initializer_factor > 0, "T5 config '", name,
             "': initializer_factor must be > 0, got ", initializer_factor);
  FSDP_CHECK(std::isfinite(dropout_rate) && dropout_rate >= 0 && dropout_rate < 1, "T5 config '", name,
             "': dropout_rate must be in [0, 1), got ", dropout_rate);
  const std::string act = activation();
  FSDP_CHECK(act == "relu" || act == "gelu" || act == "gelu_new" || act == "silu", "T5 config '", name,
             "': feed_forward_proj '", feed_forward_proj, "' is not supported — relu, gelu, gelu_new or silu, "
             "optionally as gated-<act> (T5: relu; T5 v1.1 and flan-T5: gated-gelu)");
  in("pad_token_id", pad_token_id, 0, vocab_size - 1, "the padding must be a token of the vocabulary");
  in("decoder_start_token_id", decoder_start_token_id, 0, vocab_size - 1,
     "the decoder's start must be a token of the vocabulary (T5: the padding, 0)");
  for (int64_t e : eos_token_id) in("eos_token_id", e, 0, vocab_size - 1, "the end of a sequence must be a token");
  const double n = static_cast<double>(vocab_size) * static_cast<double>(d_model) * 2 +
                   static_cast<double>(num_layers + num_decoder_layers) *
                       (2 * attention_weights(*this) + ff_weights(*this) + 3.0 * static_cast<double>(d_model));
  FSDP_CHECK(n <= static_cast<double>(kMaxParameters), "T5 config '", name, "' describes about ", n,
             " parameters, more than the ", kMaxParameters, " this build sizes");
}

std::string T5Config::summary() const {
  const double n = static_cast<double>(num_parameters());
  char params[32];
  std::snprintf(params, sizeof(params), n >= 1e9 ? "%.2fB" : "%.2fM", n >= 1e9 ? n / 1e9 : n / 1e6);
  std::ostringstream os;
  os << (name.empty() ? "t5" : name) << ": t5 D=" << d_model << " L=" << num_layers << " Ld=" << num_decoder_layers
     << " H=" << num_heads << " Dh=" << d_kv << " F=" << d_ff << " V=" << vocab_size << " " << feed_forward_proj
     << (tie_word_embeddings ? " tied" : "") << (scale_decoder_outputs ? " scaled" : "") << " " << params
     << " params";
  return os.str();
}

std::string T5Config::to_hf_config_json() const {
  json j;
  j["architectures"] = {"T5ForConditionalGeneration"};
  j["classifier_dropout"] = 0.0;
  j["d_ff"] = d_ff;
  j["d_kv"] = d_kv;
  j["d_model"] = d_model;
  j["decoder_start_token_id"] = decoder_start_token_id;
  j["dense_act_fn"] = activation();
  j["dropout_rate"] = dropout_rate;
  j["eos_token_id"] = eos_token_id.size() == 1 ? json(eos_token_id[0]) : json(eos_token_id);
  j["feed_forward_proj"] = feed_forward_proj;
  j["initializer_factor"] = initializer_factor;
  j["is_decoder"] = false;
  j["is_encoder_decoder"] = true;
  j["is_gated_act"] = gated();
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["model_type"] = "t5";
  j["num_decoder_layers"] = num_decoder_layers;
  j["num_heads"] = num_heads;
  j["num_layers"] = num_layers;
  j["pad_token_id"] = pad_token_id;
  j["relative_attention_max_distance"] = relative_attention_max_distance;
  j["relative_attention_num_buckets"] = relative_attention_num_buckets;
  j["scale_decoder_outputs"] = scale_decoder_outputs;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["use_cache"] = true;
  j["vocab_size"] = vocab_size;
  return j.dump(2);
}

std::vector<std::string> t5_preset_names() {
  std::vector<std::string> names;
  for (const auto& c : presets()) names.push_back(c.name);
  return names;
}

std::optional<T5Config> t5_preset(const std::string& name) {
  for (auto& c : presets()) {
    if (c.name == name) return c;
  }
  return std::nullopt;
}

T5Config parse_t5_config(const std::string& json_text, const std::string& origin) {
  std::string why;
  std::optional<json> parsed = parse_json_input(json_text, why);
  FSDP_CHECK(parsed.has_value(), "config.json '", origin, "' is not valid JSON: ", why);
  const json j = std::move(*parsed);
  FSDP_CHECK(j.is_object(), "config.json '", origin, "' must hold a JSON object, got ", j.type_name());
  const Fields f(j, origin, "", "use a preset (" + joined_presets() + ")");
  const std::string type = f.string_or("model_type", "");
  FSDP_CHECK(type == "t5", f.where(), "model_type '", type, "' is not \"t5\"");
  const std::vector<std::string> harmless = harmless_hf_config_keys();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (listed(kT5Keys, key) || listed(kT5HarmlessKeys, key) ||
        std::find(harmless.begin(), harmless.end(), key) != harmless.end()) {
      continue;
    }
    FSDP_CHECK(false, f.where(), "key '", key, "' = ", it.value().dump().substr(0, 80), " is not one this reader "
               "knows for model_type \"t5\"; it may change the model's math, so the config is refused rather than "
               "guessed at — if transformers ignores it for T5, delete it from config.json (docs/models.md)");
  }
  T5Config c;
  c.name = origin;
  c.vocab_size = f.req_int("vocab_size");
  c.d_model = f.req_int("d_model");
  c.d_kv = f.req_int("d_kv");
  c.d_ff = f.req_int("d_ff");
  c.num_layers = f.req_int("num_layers");
  c.num_decoder_layers = f.int_or("num_decoder_layers", c.num_layers);
  c.num_heads = f.req_int("num_heads");
  c.relative_attention_num_buckets = f.int_or("relative_attention_num_buckets", 32);
  c.relative_attention_max_distance = f.int_or("relative_attention_max_distance", 128);
  c.layer_norm_epsilon = f.double_or("layer_norm_epsilon", 1e-6);
  c.initializer_factor = f.double_or("initializer_factor", 1.0);
  c.feed_forward_proj = f.string_or("feed_forward_proj", "relu");
  // transformers 5: scaled unless tie_word_embeddings is false, then its own
  // key (written by transformers 5) wins; transformers 4 scaled exactly when tied.
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", true);
  c.scale_decoder_outputs = f.bool_or("scale_decoder_outputs", c.tie_word_embeddings);
  c.dropout_rate = f.double_or("dropout_rate", 0.1);
  c.pad_token_id = f.int_or("pad_token_id", 0);
  c.decoder_start_token_id = f.int_or("decoder_start_token_id", c.pad_token_id);
  c.eos_token_id.clear();
  if (const json* v = f.find("eos_token_id")) {
    if (v->is_array()) {
      for (const json& e : *v) c.eos_token_id.push_back(f.to_int("eos_token_id", e));
    } else {
      c.eos_token_id.push_back(f.to_int("eos_token_id", *v));
    }
  } else if (!j.contains("eos_token_id")) {
    c.eos_token_id = {1};
  }
  // Derived keys transformers writes: accepted when they say what feed_forward_proj says.
  c.validate();
  const std::string act = f.string_or("dense_act_fn", c.activation());
  FSDP_CHECK(act == c.activation(), f.where(), "dense_act_fn '", act, "' disagrees with feed_forward_proj '",
             c.feed_forward_proj, "' (which means ", c.activation(), "); fix one of them");
  FSDP_CHECK(f.bool_or("is_gated_act", c.gated()) == c.gated(), f.where(), "is_gated_act disagrees with "
             "feed_forward_proj '", c.feed_forward_proj, "'; fix one of them");
  return c;
}

std::string t5_config_mismatch(const T5Config& a, const T5Config& b) {
  const auto num = [](const char* field, auto x, auto y) -> std::string {
    if (x == y) return "";
    std::ostringstream os;
    os << field << " " << x << " vs " << y;
    return os.str();
  };
  for (const std::string& d :
       {num("vocab_size", a.vocab_size, b.vocab_size), num("d_model", a.d_model, b.d_model),
        num("d_kv", a.d_kv, b.d_kv), num("d_ff", a.d_ff, b.d_ff), num("num_layers", a.num_layers, b.num_layers),
        num("num_decoder_layers", a.num_decoder_layers, b.num_decoder_layers),
        num("num_heads", a.num_heads, b.num_heads),
        num("relative_attention_num_buckets", a.relative_attention_num_buckets, b.relative_attention_num_buckets),
        num("relative_attention_max_distance", a.relative_attention_max_distance, b.relative_attention_max_distance),
        num("layer_norm_epsilon", a.layer_norm_epsilon, b.layer_norm_epsilon),
        num("feed_forward_proj", a.feed_forward_proj, b.feed_forward_proj),
        num("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings),
        num("scale_decoder_outputs", a.scale_decoder_outputs, b.scale_decoder_outputs),
        num("pad_token_id", a.pad_token_id, b.pad_token_id),
        num("decoder_start_token_id", a.decoder_start_token_id, b.decoder_start_token_id)}) {
    if (!d.empty()) return d;
  }
  return "";
}

}  // namespace fsdp::models

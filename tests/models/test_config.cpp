#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdp/models/llama_config.h"
#include "fsdp/models/registry.h"
#include "models_test_util.h"

namespace {

namespace fs = std::filesystem;
using fsdp::models::LlamaConfig;
using fsdp::models::llama_preset;
using fsdp::models::resolve_model_config;
using fsdp::models::testing::usage_error_of;

// A scratch directory removed at the end of each test.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fsdp_models_config_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& rel, const std::string& text) {
    const fs::path p = dir_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

// As published with meta-llama/Llama-3.1-8B.
const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// As published with mistralai/Mistral-7B-v0.1.
const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// As published with meta-llama/Llama-2-7b-hf: no rope_theta, rope_scaling null.
const char* kLlama2_7B = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

void expect_same_model(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.dh(), b.dh());
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.initializer_range, b.initializer_range);
  ASSERT_EQ(a.rope_scaling.has_value(), b.rope_scaling.has_value());
  if (a.rope_scaling) {
    EXPECT_EQ(a.rope_scaling->factor, b.rope_scaling->factor);
    EXPECT_EQ(a.rope_scaling->low_freq_factor, b.rope_scaling->low_freq_factor);
    EXPECT_EQ(a.rope_scaling->high_freq_factor, b.rope_scaling->high_freq_factor);
    EXPECT_EQ(a.rope_scaling->original_max_position_embeddings, b.rope_scaling->original_max_position_embeddings);
  }
  EXPECT_EQ(a.num_parameters(), b.num_parameters());
}

}  // namespace

// Published parameter counts (the safetensors totals of the Hugging Face
// checkpoints; tied models count the embedding once).
TEST(Presets, ParameterCountsMatchThePublishedModels) {
  const std::map<std::string, int64_t> published = {
      {"llama2-7b", 6738415616LL},     {"llama2-13b", 13015864320LL},  {"llama2-70b", 68976648192LL},
      {"llama3.1-8b", 8030261248LL},   {"llama3.1-70b", 70553706496LL}, {"llama3.2-1b", 1235814400LL},
      {"llama3.2-3b", 3212749824LL},   {"mistral-7b", 7241732096LL},
  };
  for (const auto& [name, count] : published) {
    auto cfg = llama_preset(name);
    ASSERT_TRUE(cfg.has_value()) << name;
    EXPECT_EQ(cfg->num_parameters(), count) << name;
    EXPECT_NO_THROW(cfg->validate()) << name;
    std::printf("[presets] %s\n", cfg->summary().c_str());
  }
  for (const char* small : {"tiny", "small"}) std::printf("[presets] %s\n", llama_preset(small)->summary().c_str());
}

TEST(Presets, ListAndDetails) {
  const std::vector<std::string> expected = {"llama2-7b",   "llama2-13b",  "llama2-70b", "llama3.1-8b", "llama3.1-70b",
                                             "llama3.2-1b", "llama3.2-3b", "mistral-7b", "tiny",        "small"};
  EXPECT_EQ(fsdp::models::list_model_presets(), expected);
  EXPECT_FALSE(llama_preset("llama9").has_value());
  const LlamaConfig l1 = *llama_preset("llama3.2-1b");
  EXPECT_TRUE(l1.tie_word_embeddings);
  EXPECT_EQ(l1.dh(), 64);
  EXPECT_EQ(l1.rope_scaling->factor, 32.0);
  const LlamaConfig l3 = *llama_preset("llama3.2-3b");
  EXPECT_TRUE(l3.tie_word_embeddings);
  EXPECT_EQ(l3.intermediate_size, 8192);
  EXPECT_EQ(l3.dh(), 128);
  EXPECT_FALSE(llama_preset("llama2-70b")->rope_scaling.has_value());
  EXPECT_EQ(llama_preset("llama2-70b")->num_key_value_heads, 8);
  EXPECT_EQ(llama_preset("mistral-7b")->model_type, "mistral");
  EXPECT_EQ(resolve_model_config("tiny").name, "tiny");
}

TEST_F(ConfigFiles, Llama31ConfigJsonEqualsThePreset) {
  const std::string file = write("Llama-3.1-8B/config.json", kLlama31_8B);
  const LlamaConfig from_file = resolve_model_config(file);
  expect_same_model(from_file, *llama_preset("llama3.1-8b"));
  EXPECT_EQ(from_file.num_parameters(), 8030261248LL);
  EXPECT_EQ(from_file.name, file);
  // A directory holding config.json works too.
  expect_same_model(resolve_model_config((dir_ / "Llama-3.1-8B").string()), from_file);
}

TEST_F(ConfigFiles, MistralAndLlama2ConfigsUseDefaults) {
  // Mistral-7B-v0.1's own config has sliding_window 4096 < max_position_embeddings
  // (refused, see RefusalsNameTheKeyAndItsValue); with no window it is the preset.
  std::string no_window = kMistral7B;
  no_window.replace(no_window.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  const LlamaConfig mistral = resolve_model_config(write("mistral.json", no_window));
  expect_same_model(mistral, *llama_preset("mistral-7b"));
  EXPECT_EQ(mistral.num_parameters(), 7241732096LL);
  EXPECT_FALSE(mistral.sliding_window.has_value());
  EXPECT_EQ(mistral.bos_token_id, 1);
  EXPECT_EQ(mistral.eos_token_id, std::vector<int64_t>{2});
  // A window at least max_position_embeddings long never cuts a sequence the model accepts.
  std::string long_window = kMistral7B;
  long_window.replace(long_window.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": 32768");
  EXPECT_EQ(resolve_model_config(write("mistral-window.json", long_window)).sliding_window, 32768);
  const LlamaConfig llama2 = resolve_model_config(write("llama2/config.json", kLlama2_7B));
  expect_same_model(llama2, *llama_preset("llama2-7b"));
  EXPECT_EQ(llama2.rope_theta, 10000.0);  // absent: HF's default
  // num_key_value_heads and head_dim absent: H and D / H.
  const std::string minimal = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 16,
    "rms_norm_eps": 1e-6, "rope_scaling": {"type": "default"}})";
  const LlamaConfig m = resolve_model_config(write("minimal.json", minimal));
  EXPECT_EQ(m.num_key_value_heads, 4);
  EXPECT_EQ(m.dh(), 16);
  EXPECT_FALSE(m.rope_scaling.has_value());
  EXPECT_FALSE(m.tie_word_embeddings);
}

TEST_F(ConfigFiles, HfJsonRoundTripsEveryPreset) {
  for (const std::string& name : fsdp::models::list_model_presets()) {
    const LlamaConfig c = *llama_preset(name);
    expect_same_model(fsdp::models::parse_hf_config(c.to_hf_config_json(), name), c);
  }
}

TEST_F(ConfigFiles, MalformedConfigsAreUsageErrorsNamingTheProblem) {
  auto err_for = [&](const std::string& rel, const std::string& text) {
    const std::string path = write(rel, text);
    std::string msg = usage_error_of([&] { resolve_model_config(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << "message must name the file: " << msg;
    return msg;
  };
  auto without = [](std::string text, const std::string& line) {
    const size_t at = text.find(line);
    EXPECT_NE(at, std::string::npos) << line;
    return text.erase(at, line.size());
  };

  std::string msg = err_for("no_hidden.json", without(kLlama31_8B, R"("hidden_size": 4096,)"));
  EXPECT_NE(msg.find("'hidden_size' is missing"), std::string::npos) << msg;

  msg = err_for("no_eps.json", without(kMistral7B, R"("rms_norm_eps": 1e-05,)"));
  EXPECT_NE(msg.find("'rms_norm_eps' is missing"), std::string::npos) << msg;

  msg = err_for("bad.json", "{ \"hidden_size\": 4096, ");
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  msg = err_for("array.json", "[1, 2]");
  EXPECT_NE(msg.find("JSON object"), std::string::npos) << msg;

  std::string gpt2 = kLlama2_7B;
  gpt2.replace(gpt2.find("\"llama\""), 7, "\"gpt2\"");
  msg = err_for("gpt2.json", gpt2);
  EXPECT_NE(msg.find("model_type \"gpt2\""), std::string::npos) << msg;

  std::string str_int = kLlama2_7B;
  str_int.replace(str_int.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": \"4096\"");
  msg = err_for("string_int.json", str_int);
  EXPECT_NE(msg.find("'hidden_size' must be an integer"), std::string::npos) << msg;

  std::string yarn = kLlama31_8B;
  yarn.replace(yarn.find("\"llama3\""), 8, "\"yarn\"");
  msg = err_for("yarn.json", yarn);
  EXPECT_NE(msg.find("rope_scaling.rope_type 'yarn' is not supported"), std::string::npos) << msg;

  msg = err_for("no_low.json", without(kLlama31_8B, R"("low_freq_factor": 1.0,)"));
  EXPECT_NE(msg.find("'rope_scaling.low_freq_factor' is missing"), std::string::npos) << msg;

  std::string gqa = kLlama31_8B;
  gqa.replace(gqa.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  msg = err_for("gqa.json", gqa);
  EXPECT_NE(msg.find("num_key_value_heads (Hkv=5)"), std::string::npos) << msg;

  std::string bias = kLlama31_8B;
  bias.replace(bias.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  msg = err_for("bias.json", bias);
  EXPECT_NE(msg.find("attention_bias"), std::string::npos) << msg;
}

TEST_F(ConfigFiles, UnknownSpecsListThePresets) {
  std::string msg = usage_error_of([] { resolve_model_config("llama9-13b"); });
  EXPECT_NE(msg.find("llama9-13b"), std::string::npos) << msg;
  for (const char* preset : {"llama2-7b", "llama3.1-8b", "llama3.2-1b", "mistral-7b", "tiny", "small"}) {
    EXPECT_NE(msg.find(preset), std::string::npos) << "should list " << preset << ": " << msg;
  }
  fs::create_directories(dir_ / "empty");
  msg = usage_error_of([&] { resolve_model_config((dir_ / "empty").string()); });
  EXPECT_NE(msg.find("has no config.json"), std::string::npos) << msg;
}

namespace {

// Llama-3.2-1B-Instruct's config as transformers 5.23's save_pretrained writes
// it: "rope_parameters" (rope_theta inside), "dtype", sorted keys.
const char* kLlama32Transformers5 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": true,
  "transformers_version": "5.23.0",
  "use_cache": true,
  "vocab_size": 128256
})";

// `text` with the first occurrence of `from` replaced by `to` (which must occur).
std::string edited(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

std::string refusal(const std::string& text) {
  return usage_error_of([&] { fsdp::models::parse_hf_config(text, "cfg.json"); });
}

}  // namespace

// The bug this guards: rope_parameters (transformers 5) was ignored, so
// Llama 3.2 got rope_theta 10000 and no llama3 scaling without a word.
TEST(HfConfigForms, Transformers5RopeParametersAreRead) {
  const LlamaConfig c = fsdp::models::parse_hf_config(kLlama32Transformers5, "llama32.json");
  expect_same_model(c, *llama_preset("llama3.2-1b"));
  EXPECT_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{128001, 128008, 128009}));

  // The same model in transformers 4's form reads the same.
  const std::string v4 = R"({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
    "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "torch_dtype": "bfloat16"})";
  expect_same_model(fsdp::models::parse_hf_config(v4, "v4.json"), c);

  // Both forms at once, agreeing: fine.
  const std::string both = edited(kLlama32Transformers5, "\"rope_parameters\"",
                                  R"("rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "rope_parameters")");
  expect_same_model(fsdp::models::parse_hf_config(both, "both.json"), c);

  // transformers' defaults: rope_theta inside rope_parameters absent -> the top level's, else 10000;
  // llama3's original_max_position_embeddings absent -> max_position_embeddings; null and {} are unset.
  const LlamaConfig no_orig = fsdp::models::parse_hf_config(
      edited(kLlama32Transformers5, "\"original_max_position_embeddings\": 8192,", ""), "no-orig.json");
  EXPECT_EQ(no_orig.rope_scaling->original_max_position_embeddings, 131072);
  const std::string plain = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100, "max_position_embeddings": 16,
    "rms_norm_eps": 1e-6)";
  EXPECT_EQ(fsdp::models::parse_hf_config(plain + R"(, "rope_parameters": {"rope_type": "default"}})", "a").rope_theta,
            10000.0);
  EXPECT_EQ(fsdp::models::parse_hf_config(
                plain + R"(, "rope_theta": 1e6, "rope_parameters": {"rope_type": "default"}})", "b").rope_theta,
            1e6);
  const LlamaConfig unset = fsdp::models::parse_hf_config(
      plain + R"(, "rope_theta": 2e5, "rope_scaling": {}, "rope_parameters": null, "eos_token_id": null})", "c");
  EXPECT_EQ(unset.rope_theta, 2e5);
  EXPECT_FALSE(unset.rope_scaling.has_value());
  EXPECT_FALSE(unset.bos_token_id.has_value());
  EXPECT_NO_THROW(fsdp::models::parse_hf_config(plain + R"(, "pruned_heads": {}})", "d"));
  EXPECT_TRUE(unset.eos_token_id.empty());
}

// Every key that would change the math and is not implemented is refused with
// one line naming the key and its value.
TEST(HfConfigForms, RefusalsNameTheKeyAndItsValue) {
  const std::string base = kLlama32Transformers5;
  struct Case {
    std::string what, from, to, expected;
  };
  const std::vector<Case> cases = {
      {"linear rope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"linear\"",
       "rope_parameters.rope_type 'linear' is not supported"},
      {"dynamic rope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\"",
       "rope_parameters.rope_type 'dynamic' is not supported"},
      {"yarn rope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"",
       "rope_parameters.rope_type 'yarn' is not supported"},
      {"longrope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"longrope\"",
       "rope_parameters.rope_type 'longrope' is not supported"},
      {"a key llama3 does not have", "\"factor\": 32.0,", "\"factor\": 32.0, \"attention_factor\": 1.5,",
       "key 'rope_parameters.attention_factor' = 1.5 is not a parameter of rope_type \"llama3\""},
      {"llama3 keys on default rope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"default\"",
       "key 'rope_parameters.factor' = 32.0 is not a parameter of rope_type \"default\""},
      {"rope_type and type disagree", "\"rope_type\": \"llama3\"", "\"rope_type\": \"llama3\", \"type\": \"yarn\"",
       "rope_parameters.rope_type 'llama3' and rope_parameters.type 'yarn' disagree"},
      {"a missing llama3 factor", "\"factor\": 32.0,", "", "'rope_parameters.factor' is missing"},
      {"partial rotary (nested)", "\"rope_theta\": 500000.0,",
       "\"rope_theta\": 500000.0, \"partial_rotary_factor\": 0.5,",
       "rope_parameters.partial_rotary_factor = 0.5 is not supported"},
      {"partial rotary (top level)", "\"pretraining_tp\": 1,", "\"pretraining_tp\": 1, \"partial_rotary_factor\": 0.5,",
       "partial_rotary_factor = 0.5 is not supported"},
      {"rope_theta twice, disagreeing", "\"pretraining_tp\": 1,", "\"pretraining_tp\": 1, \"rope_theta\": 10000.0,",
       "rope_theta = 10000 at the top level but 500000 in rope_parameters"},
      {"rope_scaling and rope_parameters disagreeing", "\"pretraining_tp\": 1,",
       "\"pretraining_tp\": 1, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
       "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192},",
       // transformers would take rope_scaling, with rope_theta from the top level (absent: 10000).
       "rope_scaling (transformers 4 form: rope_theta 10000, llama3 factor 8"},
      {"attention dropout", "\"attention_dropout\": 0.0", "\"attention_dropout\": 0.1", "attention_dropout = 0.1"},
      {"a pad token", "\"pad_token_id\": null", "\"pad_token_id\": 0", "pad_token_id = 0 is not supported"},
      {"attention bias", "\"attention_bias\": false", "\"attention_bias\": true", "attention_bias = true"},
      {"mlp bias", "\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias = true"},
      {"another activation", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act 'gelu'"},
      {"quantization", "\"use_cache\": true", "\"use_cache\": true, \"quantization_config\": {\"bits\": 4}",
       "quantization_config is set"},
      {"a sliding window on llama", "\"use_cache\": true", "\"use_cache\": true, \"sliding_window\": 4096",
       "key 'sliding_window' = 4096 is not one this reader knows for model_type \"llama\""},
      {"an unknown key", "\"use_cache\": true", "\"use_cache\": true, \"some_future_key\": [1, 2]",
       "key 'some_future_key' = [1,2] is not one this reader knows"},
      {"pruned heads", "\"use_cache\": true", "\"use_cache\": true, \"pruned_heads\": {\"0\": [1]}",
       "pruned_heads = {\"0\":[1]} is not supported"},
  };
  for (const Case& c : cases) {
    const std::string msg = refusal(edited(base, c.from, c.to));
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << c.what << ": names the file: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.what << ": one line: " << msg;
  }
  nlohmann::json not_object = nlohmann::json::parse(base);
  not_object["rope_parameters"] = 3;
  EXPECT_NE(refusal(not_object.dump()).find("field 'rope_parameters' must be an object or null, got 3"),
            std::string::npos);
  // The unknown-key message says how to proceed.
  const std::string unknown = refusal(edited(base, "\"use_cache\": true", "\"use_cache\": true, \"new_thing\": 1"));
  EXPECT_NE(unknown.find("delete it from config.json"), std::string::npos) << unknown;

  // Mistral-7B-v0.1 as published: sliding_window 4096 < max_position_embeddings 32768.
  const std::string window = refusal(kMistral7B);
  EXPECT_NE(window.find("sliding_window = 4096 is shorter than max_position_embeddings = 32768"), std::string::npos)
      << window;
  EXPECT_NE(window.find("set max_position_embeddings to 4096"), std::string::npos) << window;
}

// Keys listed as harmless are accepted, whatever their value.
TEST(HfConfigForms, HarmlessKeysAreAccepted) {
  const std::vector<std::string> keys = fsdp::models::harmless_hf_config_keys();
  for (const char* expected : {"torch_dtype", "dtype", "transformers_version", "use_cache", "pretraining_tp",
                               "_name_or_path", "architectures"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), expected), keys.end()) << expected;
  }
  for (const std::string& key : keys) {
    nlohmann::json j = nlohmann::json::parse(kLlama32Transformers5);
    j[key] = 7;
    EXPECT_NO_THROW(fsdp::models::parse_hf_config(j.dump(), "harmless.json")) << key;
  }
}

// What an export writes: transformers 5's form (sorted keys, rope_parameters,
// token ids or null), read back to the same config.
TEST(HfConfigForms, ExportFormIsTransformers5s) {
  LlamaConfig c = fsdp::models::parse_hf_config(kLlama32Transformers5, "llama32.json");
  const nlohmann::json j = nlohmann::json::parse(c.to_hf_config_json());
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_FALSE(j.contains("rope_theta"));
  EXPECT_FALSE(j.contains("rope_scaling"));
  EXPECT_FALSE(j.contains("torch_dtype"));
  EXPECT_EQ(j["rope_parameters"], nlohmann::json::parse(R"({"rope_type": "llama3", "rope_theta": 500000.0,
    "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  EXPECT_EQ(j["bos_token_id"], 128000);
  EXPECT_EQ(j["eos_token_id"], nlohmann::json::parse("[128001, 128008, 128009]"));
  EXPECT_TRUE(j["pad_token_id"].is_null());
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["head_dim"], 64);
  // Every key of transformers 5.23's LlamaConfig output except transformers_version and dtype
  // (which the exporter adds).
  const nlohmann::json original = nlohmann::json::parse(kLlama32Transformers5);
  for (auto it = original.begin(); it != original.end(); ++it) {
    if (it.key() == "transformers_version" || it.key() == "dtype") continue;
    EXPECT_EQ(j.at(it.key()), it.value()) << it.key();
  }
  expect_same_model(fsdp::models::parse_hf_config(c.to_hf_config_json(), "back"), c);

  // Unknown token ids are written as null (transformers would otherwise assume 1 and 2); one eos is a number.
  const LlamaConfig preset = *llama_preset("llama2-7b");
  const nlohmann::json p = nlohmann::json::parse(preset.to_hf_config_json());
  EXPECT_TRUE(p["bos_token_id"].is_null());
  EXPECT_TRUE(p["eos_token_id"].is_null());
  EXPECT_EQ(p["rope_parameters"], nlohmann::json::parse(R"({"rope_type": "default", "rope_theta": 10000.0})"));
  EXPECT_EQ(p["attention_bias"], false);
  c.eos_token_id = {7};
  EXPECT_EQ(nlohmann::json::parse(c.to_hf_config_json())["eos_token_id"], 7);

  // Mistral: sliding_window kept (null or a window), no Llama-only keys.
  LlamaConfig m = *llama_preset("mistral-7b");
  nlohmann::json mj = nlohmann::json::parse(m.to_hf_config_json());
  EXPECT_TRUE(mj.contains("sliding_window") && mj["sliding_window"].is_null());
  EXPECT_FALSE(mj.contains("attention_bias"));
  EXPECT_FALSE(mj.contains("pretraining_tp"));
  m.sliding_window = 32768;
  mj = nlohmann::json::parse(m.to_hf_config_json());
  EXPECT_EQ(mj["sliding_window"], 32768);
  EXPECT_EQ(fsdp::models::parse_hf_config(m.to_hf_config_json(), "m").sliding_window, 32768);
}

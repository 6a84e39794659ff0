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
      // Mathstral-7B-v0.1 has Mistral-7B-v0.3's shapes (V = 32768): 7.25B.
      {"mathstral-7b", 7248023552LL},
      // Qwen2.5-0.5B: "0.49B, 0.36B non-embedding" (its model card), tied;
      // Qwen3-0.6B: "0.6B, 0.44B non-embedding", tied. Both also equal
      // transformers' own count of the published config (tests/hf, config part).
      {"qwen2.5-0.5b", 494032768LL},   {"qwen3-0.6b", 596049920LL},
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

// The MFU numerator agrees with bench/gpu/report.py's flops_per_token (its values
// for these two presets, computed by that function).
TEST(Presets, TrainingFlopsPerTokenAsTheGpuReportCountsThem) {
  EXPECT_DOUBLE_EQ(llama_preset("llama2-7b")->training_flops_per_token(4096), 46084915200.0);
  EXPECT_DOUBLE_EQ(llama_preset("llama3.1-8b")->training_flops_per_token(8192), 57912852480.0);
}

TEST(Presets, ListAndDetails) {
  const std::vector<std::string> expected = {"llama2-7b",    "llama2-13b",   "llama2-70b",   "llama3.1-8b",
                                             "llama3.1-70b", "llama3.2-1b",  "llama3.2-3b",  "mistral-7b",
                                             "mathstral-7b", "qwen2.5-0.5b", "qwen3-0.6b",   "mixtral-8x7b",
                                             "tiny",         "small",        "tiny-mixtral"};
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
  EXPECT_EQ(llama_preset("mistral-7b")->sliding_window, 4096);
  const LlamaConfig math = *llama_preset("mathstral-7b");
  EXPECT_EQ(math.model_type, "mistral");
  EXPECT_EQ(math.vocab_size, 32768);
  EXPECT_EQ(math.rope_theta, 1e6);
  EXPECT_FALSE(math.sliding_window.has_value());
  const LlamaConfig q2 = *llama_preset("qwen2.5-0.5b");
  EXPECT_EQ(q2.model_type, "qwen2");
  EXPECT_TRUE(q2.qkv_bias() && !q2.o_bias() && !q2.qk_norm());
  EXPECT_EQ(q2.dh(), 64);
  EXPECT_EQ(q2.rms_norm_eps, 1e-6);
  EXPECT_EQ(q2.layer_types, std::vector<std::string>(24, "full_attention"));
  EXPECT_EQ(q2.max_window_layers, 24);
  const LlamaConfig q3 = *llama_preset("qwen3-0.6b");
  EXPECT_EQ(q3.model_type, "qwen3");
  EXPECT_TRUE(!q3.qkv_bias() && !q3.o_bias() && q3.qk_norm());
  EXPECT_EQ(q3.dh(), 128);  // != D / H = 64
  EXPECT_TRUE(q3.tie_word_embeddings);
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
  // Mistral-7B-v0.1's own config, the mistral-7b preset: a window of 4096 in
  // every layer; absent, the key means MistralConfig's default, 4096 as well.
  // With no window ("sliding_window": null) it is another model.
  const LlamaConfig v01 = resolve_model_config(write("mistral-v01.json", kMistral7B));
  expect_same_model(v01, *llama_preset("mistral-7b"));
  EXPECT_EQ(v01.sliding_window, 4096);
  EXPECT_EQ(v01.layer_window(0), 4096);
  EXPECT_EQ(v01.layer_window(31), 4096);
  EXPECT_EQ(v01.num_parameters(), 7241732096LL);
  std::string absent = kMistral7B;
  absent.erase(absent.find("\"sliding_window\": 4096,"), 23);
  EXPECT_EQ(resolve_model_config(write("mistral-absent.json", absent)).sliding_window, 4096);
  std::string no_window = kMistral7B;
  no_window.replace(no_window.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  const LlamaConfig mistral = resolve_model_config(write("mistral.json", no_window));
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

// Found by tests/fuzz/fuzz_hf_config: sizes whose parameter count overflows int64 were
// accepted (and num_parameters() overflowed); now a UsageError naming the sizes.
TEST(ConfigSizes, ParameterCountBeyondInt64IsRefused) {
  const std::string huge = R"({"model_type": "llama", "hidden_size": 1099511627776, "intermediate_size": 384,
    "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 1000000000000, "max_position_embeddings": 16,
    "rms_norm_eps": 1e-6})";
  const std::string msg = usage_error_of([&] { fsdp::models::parse_hf_config(huge, "huge/config.json"); });
  // Refused by the size limits (Note [Config size limits]) before any product is formed.
  EXPECT_NE(msg.find("hidden_size = 1099511627776 is above the limit"), std::string::npos) << msg;
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
      {"a pad token outside the vocabulary", "\"pad_token_id\": null", "\"pad_token_id\": 128256",
       "pad_token_id = 128256 is not a row of the embedding [0, vocab_size=128256)"},
      {"a negative pad token", "\"pad_token_id\": null", "\"pad_token_id\": -1", "pad_token_id = -1 is not a row"},
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

  // A window must be positive; layer_types belongs to Qwen.
  const std::string zero = refusal(edited(kMistral7B, "\"sliding_window\": 4096", "\"sliding_window\": 0"));
  EXPECT_NE(zero.find("sliding_window = 0 must be positive"), std::string::npos) << zero;
  const std::string mistral_layers =
      refusal(edited(kMistral7B, "\"use_cache\": true", "\"use_cache\": true, \"layer_types\": []"));
  EXPECT_NE(mistral_layers.find("key 'layer_types' = [] is not one this reader knows for model_type \"mistral\""),
            std::string::npos)
      << mistral_layers;
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

  // Mistral: sliding_window kept (a window or null), no Llama-only keys.
  LlamaConfig m = *llama_preset("mistral-7b");
  nlohmann::json mj = nlohmann::json::parse(m.to_hf_config_json());
  EXPECT_EQ(mj["sliding_window"], 4096);
  EXPECT_TRUE(nlohmann::json::parse(llama_preset("mathstral-7b")->to_hf_config_json())["sliding_window"].is_null());
  EXPECT_FALSE(mj.contains("attention_bias"));
  EXPECT_FALSE(mj.contains("pretraining_tp"));
  m.sliding_window = 32768;
  mj = nlohmann::json::parse(m.to_hf_config_json());
  EXPECT_EQ(mj["sliding_window"], 32768);
  EXPECT_EQ(fsdp::models::parse_hf_config(m.to_hf_config_json(), "m").sliding_window, 32768);
}

namespace {

// As published with Qwen/Qwen2.5-0.5B (transformers 4 form).
const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// As published with Qwen/Qwen3-0.6B.
const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

void expect_same_qwen(const LlamaConfig& a, const LlamaConfig& b) {
  expect_same_model(a, b);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.max_window_layers, b.max_window_layers);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
}

}  // namespace

// The published Qwen configs are the presets; use_sliding_window false drops
// the window (as transformers does) and every layer attends fully.
TEST(QwenConfigs, PublishedConfigsAreThePresets) {
  const LlamaConfig q2 = fsdp::models::parse_hf_config(kQwen25_05B, "qwen2.5.json");
  expect_same_qwen(q2, *llama_preset("qwen2.5-0.5b"));
  EXPECT_FALSE(q2.sliding_window.has_value());
  EXPECT_EQ(q2.bos_token_id, 151643);
  const LlamaConfig q3 = fsdp::models::parse_hf_config(kQwen3_06B, "qwen3.json");
  expect_same_qwen(q3, *llama_preset("qwen3-0.6b"));
  EXPECT_EQ(q3.eos_token_id, std::vector<int64_t>{151645});
  // Qwen3Config's head_dim default is 128, not D / H.
  std::string no_head_dim = kQwen3_06B;
  no_head_dim.erase(no_head_dim.find("\"head_dim\": 128,"), 16);
  EXPECT_EQ(fsdp::models::parse_hf_config(no_head_dim, "q3").dh(), 128);
  // Both round-trip through the export form.
  for (const LlamaConfig& c : {q2, q3}) {
    expect_same_qwen(fsdp::models::parse_hf_config(c.to_hf_config_json(), "back"), c);
  }
}

// Windows as transformers 5's Qwen2Config / Qwen3Config resolve them:
// use_sliding_window gates the window; layer_types, when given, decides per
// layer; otherwise layers i >= max_window_layers slide.
TEST(QwenConfigs, SlidingLayersFollowTransformers) {
  auto with = [](const std::string& extra, int max_window_layers = 24) {
    const std::string text = edited(kQwen25_05B, "\"max_window_layers\": 24",
                                    "\"max_window_layers\": " + std::to_string(max_window_layers));
    return fsdp::models::parse_hf_config(edited(text, "\"use_sliding_window\": false,", extra), "qwen2-window.json");
  };
  const LlamaConfig on = with("\"use_sliding_window\": true,", 21);
  ASSERT_EQ(on.layer_types.size(), 24u);
  EXPECT_EQ(on.sliding_window, 32768);
  for (int64_t i = 0; i < 24; ++i) {
    EXPECT_EQ(on.layer_window(i), i >= 21 ? std::optional<int64_t>(32768) : std::nullopt) << i;
  }
  const LlamaConfig all_full = with("\"use_sliding_window\": true,");
  EXPECT_EQ(all_full.layer_types, std::vector<std::string>(24, "full_attention"));  // max_window_layers 24 = L
  EXPECT_EQ(all_full.sliding_window, 32768);  // kept (use_sliding_window), used by no layer
  // An explicit list wins over max_window_layers.
  std::string types = "\"layer_types\": [";
  for (int i = 0; i < 24; ++i) {
    types += std::string(i ? ", " : "") + (i % 2 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  types += "],";
  const LlamaConfig alternating = with("\"use_sliding_window\": true, " + types);
  EXPECT_EQ(alternating.layer_window(0), std::nullopt);
  EXPECT_EQ(alternating.layer_window(1), 32768);
  // Absent sliding_window: Qwen2Config's default 4096.
  std::string absent = edited(kQwen25_05B, "\"sliding_window\": 32768,", "");
  absent = edited(absent, "\"max_window_layers\": 24", "\"max_window_layers\": 0");
  absent = edited(absent, "\"use_sliding_window\": false,", "\"use_sliding_window\": true,");
  EXPECT_EQ(fsdp::models::parse_hf_config(absent, "q").layer_window(0), 4096);
  // The export form keeps the per-layer choice, the window and use_sliding_window.
  const nlohmann::json j = nlohmann::json::parse(alternating.to_hf_config_json());
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(j["use_sliding_window"], true);
  EXPECT_EQ(j["sliding_window"], 32768);
  EXPECT_EQ(j["layer_types"][1], "sliding_attention");
  EXPECT_FALSE(j.contains("head_dim"));       // Qwen2Config has none (D / H = 64 here)
  EXPECT_FALSE(j.contains("attention_bias"));  // nor this (q/k/v biases always on)
  expect_same_qwen(fsdp::models::parse_hf_config(alternating.to_hf_config_json(), "back"), alternating);
  const nlohmann::json j3 = nlohmann::json::parse(llama_preset("qwen3-0.6b")->to_hf_config_json());
  EXPECT_EQ(j3["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j3["head_dim"], 128);
  EXPECT_EQ(j3["attention_bias"], false);
  EXPECT_EQ(j3["use_sliding_window"], false);
  EXPECT_TRUE(j3["sliding_window"].is_null());
}

// What Qwen's config classes do not have, or this build does not implement.
TEST(QwenConfigs, RefusalsNameTheKey) {
  struct Case {
    const char* base;
    std::string from, to, expected;
  };
  const std::vector<Case> cases = {
      {kQwen25_05B, "\"use_cache\": true", "\"use_cache\": true, \"attention_bias\": false",
       "key 'attention_bias' = false is not one this reader knows for model_type \"qwen2\""},
      {kQwen3_06B, "\"use_cache\": true", "\"use_cache\": true, \"mlp_bias\": false",
       "key 'mlp_bias' = false is not one this reader knows for model_type \"qwen3\""},
      {kQwen3_06B, "\"use_sliding_window\": false,",
       "\"use_sliding_window\": false, \"layer_types\": [\"full_attention\"],",
       "layer_types has 1 entries but num_hidden_layers = 28"},
      {kQwen3_06B, "\"use_cache\": true", "\"use_cache\": true, \"layer_types\": " +
           nlohmann::json(std::vector<std::string>(28, "chunked_attention")).dump(),
       "layer_types[0] = 'chunked_attention' is not supported"},
      {kQwen3_06B, "\"use_cache\": true", "\"use_cache\": true, \"layer_types\": " +
           nlohmann::json(std::vector<std::string>(28, "sliding_attention")).dump(),
       "layer_types[0] is \"sliding_attention\" but there is no window"},
      {kQwen3_06B, "\"model_type\": \"qwen3\"", "\"model_type\": \"qwen3_moe\"", "model_type \"qwen3_moe\""},
  };
  for (const Case& c : cases) {
    const std::string msg = refusal(edited(c.base, c.from, c.to));
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.expected << ": " << msg;
  }
}

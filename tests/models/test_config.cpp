#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

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
  const LlamaConfig mistral = resolve_model_config(write("mistral.json", kMistral7B));
  expect_same_model(mistral, *llama_preset("mistral-7b"));
  EXPECT_EQ(mistral.num_parameters(), 7241732096LL);
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
  EXPECT_NE(msg.find("rope_scaling type 'yarn'"), std::string::npos) << msg;

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

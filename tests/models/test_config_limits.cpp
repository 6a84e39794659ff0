// Sizes in a config.json are checked against limits before anything is sized
// by them (issue 16, finding 3: vocab_size 1e12 used to allocate 1e15 bytes).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdp/models/llama_config.h"
#include "fsdp/models/registry.h"
#include "models_test_util.h"

namespace {

using fsdp::models::testing::usage_error_of;

// tiny's config with one key changed.
std::string tiny_with(const std::string& key, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::parse(fsdp::models::llama_preset("tiny")->to_hf_config_json());
  j[key] = value;
  return j.dump();
}

std::string refusal(const std::string& key, const nlohmann::json& value) {
  return usage_error_of([&] { fsdp::models::parse_hf_config(tiny_with(key, value), "big.json"); });
}

}  // namespace

TEST(ConfigLimits, EverySizeHasALimitNamedWithTheValue) {
  EXPECT_CONTAINS(refusal("vocab_size", int64_t{1000000000000}),
                  "model config 'big.json': vocab_size = 1000000000000 is above the limit 2147483647");
  EXPECT_CONTAINS(refusal("hidden_size", int64_t{1} << 40),
                  "hidden_size = 1099511627776 is above the limit 1048576");
  EXPECT_CONTAINS(refusal("intermediate_size", int64_t{1} << 40), "intermediate_size = 1099511627776 is above");
  EXPECT_CONTAINS(refusal("num_hidden_layers", int64_t{1000000000}), "num_hidden_layers = 1000000000 is above");
  EXPECT_CONTAINS(refusal("max_position_embeddings", int64_t{1} << 40), "max_position_embeddings = ");
  // Each size within its limit, their product beyond any machine (and int64 with num_parameters).
  nlohmann::json j = nlohmann::json::parse(fsdp::models::llama_preset("tiny")->to_hf_config_json());
  j["hidden_size"] = int64_t{1} << 20;
  j["num_attention_heads"] = 1 << 10;
  j["num_key_value_heads"] = 1 << 10;
  j["head_dim"] = 1 << 14;
  j["intermediate_size"] = int64_t{1} << 22;
  j["num_hidden_layers"] = 1 << 16;
  j["vocab_size"] = (int64_t{1} << 31) - 1;
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::models::parse_hf_config(j.dump(), "huge.json"); }),
                  "parameters, above the limit");
  // The largest published models are far inside.
  EXPECT_NO_THROW(fsdp::models::resolve_model_config("llama3.1-70b"));
}

// A Qwen config without layer_types builds one entry per layer: the limit comes first.
TEST(ConfigLimits, QwenLayerListIsNotSizedByAnUncheckedLayerCount) {
  nlohmann::json j = nlohmann::json::parse(fsdp::models::llama_preset("qwen2.5-0.5b")->to_hf_config_json());
  j.erase("layer_types");
  j["num_hidden_layers"] = int64_t{1000000000000};
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::models::parse_hf_config(j.dump(), "qwen.json"); }),
                  "num_hidden_layers = 1000000000000 is above the limit 65536");
}

TEST(ConfigLimits, ModelConfigMustBeARegularFile) {
  EXPECT_CONTAINS(usage_error_of([] { fsdp::models::resolve_model_config("/dev/zero"); }),
                  "model config /dev/zero is a character device, not a regular file");
  const std::string fifo = (std::filesystem::temp_directory_path() /
                            ("fsdp_config_fifo_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = usage_error_of([&] { fsdp::models::resolve_model_config(fifo); });
  ::unlink(fifo.c_str());
  EXPECT_CONTAINS(msg, "is a FIFO (named pipe), not a regular file");
}

// Hugging Face interchange: export from a sharded model, import into a fresh
// one at other world sizes (logits equal exactly), a hand-built checkpoint
// whose values land where transformers would put them, tied embeddings,
// shape mismatches, bf16 export, sharded files with an index.
//
// (No transformers here: the semantics are checked against the names and
// layouts of models/llama.h; tests/hf compares with transformers itself, in
// both directions.)
#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ckpt_test_util.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/common/error.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/family_llama.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using testing::make_sharded_llama;
using testing::token_batch;

at::Tensor inputs() { return token_batch(2, 11, testing::small_config().vocab_size, 5).narrow(1, 0, 11).contiguous(); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Deterministic, distinct values for a tensor: name-dependent offset + position.
at::Tensor known_values(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const double base = static_cast<double>(std::hash<std::string>{}(name) % 97) / 97.0 - 0.5;
  return (at::arange(n, at::kFloat) * (1.0 / static_cast<double>(n)) * 0.25 + base).reshape(shape);
}

}  // namespace

// Exported at world size 2 after some training (in two files plus an index),
// imported at 1 and 4 (HYBRID) into models with other initial values: the
// logits are bit-identical. One math thread per rank at every world size: the
// launcher's default shares the cores among the ranks, and LibTorch's CPU GEMM
// rounds differently with a different thread count (2 threads vs 1: 6e-8).
TEST(HuggingFace, ExportImportRoundTripAcrossWorldSizes) {
  const std::string dir = testing::temp_dir("hf-roundtrip");
  const std::map<std::string, std::string> one_thread{{"OMP_NUM_THREADS", "1"}};
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    for (int s = 0; s < 2; ++s) m.train_step(token_batch(1, 12, m.cfg.vocab_size, 10 * s + pg.rank()));
    const at::Tensor logits = m.logits(inputs());
    if (pg.rank() == 0) checkpoint::save_safetensors(dir + "/logits.safetensors", {{"logits", logits}});
    checkpoint::HfExportOptions eo;
    eo.max_shard_bytes = 40'000;  // a few files for this tiny model
    auto r = checkpoint::export_hf(dir + "/hf", *m.sharded, train::llama_hf_info(m.cfg), pg, eo);
    EXPECT_GT(r.io.bytes, 0);
    // Single file by default.
    checkpoint::export_hf(dir + "/hf1", *m.sharded, train::llama_hf_info(m.cfg), pg);
  }, std::chrono::seconds(180), one_thread);
  if (!testing::is_worker()) {
    EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(dir + "/hf1/model.safetensors"));
    const auto index = read_json(dir + "/hf/model.safetensors.index.json");
    const auto cfg = read_json(dir + "/hf/config.json");
    EXPECT_EQ(cfg["dtype"], "float32");
    EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(index["weight_map"].size(), 3u + 2u * 9u);  // embed, norm, lm_head + 9 per layer
    std::set<std::string> names;
    for (const auto& [tensor, file] : index["weight_map"].items()) names.insert(file.get<std::string>());
    EXPECT_GE(names.size(), 2u);
    int64_t total = 0;
    size_t entries = 0;
    for (const auto& name : names) {
      EXPECT_EQ(name.substr(name.size() - 21), "-of-0000" + std::to_string(names.size()) + ".safetensors") << name;
      checkpoint::SafetensorsFile f(dir + "/hf/" + name);
      for (const auto& e : f.entries()) {
        total += e.end - e.begin;
        ++entries;
        EXPECT_EQ(index["weight_map"][e.name], name);
        EXPECT_LE(e.end, 40'000) << "a file above --export-shard-size holds more than one tensor";
      }
      EXPECT_EQ(f.metadata().at("format"), "pt");
    }
    EXPECT_EQ(entries, index["weight_map"].size());
    EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
    EXPECT_FALSE(fs::exists(dir + "/.tmp-hf"));
  }
  for (int w : {1, 4}) {
    for (const char* src : {"/hf", "/hf1"}) {
      testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
        auto m = make_sharded_llama(pg, w == 4 ? "hybrid" : "full", "block", /*seed=*/123);
        auto r = checkpoint::import_hf(dir + src, *m.sharded, train::llama_hf_info(m.cfg), pg);
        EXPECT_TRUE(r.ignored.empty());
        const at::Tensor ref = checkpoint::SafetensorsFile(dir + "/logits.safetensors").tensor("logits");
        const at::Tensor got = m.logits(inputs());
        EXPECT_TRUE(at::equal(got, ref)) << "world " << w << " " << src << ": max |diff| "
                                         << (got - ref).abs().max().item<double>();
      }, std::chrono::seconds(180), one_thread);
    }
  }
}

// A checkpoint written by hand, tensor by tensor in F32, BF16 and F16: after an
// import at world size 2 every parameter equals the file's tensor of the same
// name with the same (out, in) layout, and the sharded model computes the
// same logits as an unsharded one whose parameters were assigned by name.
TEST(HuggingFace, HandBuiltCheckpointLandsWhereHuggingFacePutsIt) {
  const std::string dir = testing::temp_dir("hf-hand");
  const auto cfg = testing::small_config();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    models::LlamaForCausalLMImpl shape_only(cfg, at::TensorOptions().device(at::kMeta), 0);
    int i = 0;
    for (const auto& p : shape_only.named_parameters()) {
      const at::ScalarType dt = i % 3 == 0 ? at::kFloat : (i % 3 == 1 ? at::kBFloat16 : at::kHalf);
      tensors.emplace_back(p.key(), known_values(p.key(), p.value().sizes().vec()).to(dt));
      ++i;
    }
    // An older transformers buffer that importers must skip.
    tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::ones({4}));
  }
  if (!testing::is_worker()) {
    fs::create_directories(dir + "/ckpt");
    checkpoint::save_safetensors(dir + "/ckpt/model.safetensors", tensors, {{"format", "pt"}});
    std::ofstream(dir + "/ckpt/config.json") << cfg.to_hf_config_json();
  }
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    auto r = checkpoint::import_hf(dir + "/ckpt", *m.sharded, train::llama_hf_info(m.cfg), pg);
    EXPECT_EQ(r.ignored, std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq"});
    const auto state = testing::full_state(m);
    for (const auto& [name, t] : tensors) {
      if (name.find("rotary") != std::string::npos) continue;
      ASSERT_TRUE(state.count("param/" + name)) << name;
      EXPECT_TRUE(at::equal(state.at("param/" + name), t.to(at::kFloat))) << name;
    }
    // Element [r][c] of a Linear weight is the file's row-major element r*in + c (row = output feature).
    const at::Tensor q = state.at("param/model.layers.1.self_attn.q_proj.weight");  // (H*Dh, D) = (32, 32)
    checkpoint::SafetensorsFile f(dir + "/ckpt/model.safetensors");
    const auto* e = f.find("model.layers.1.self_attn.q_proj.weight");
    std::vector<float> v(1);
    f.read_as_float(*e, 5 * 32 + 3, 1, v.data());
    EXPECT_EQ(q[5][3].item<float>(), v[0]);
    EXPECT_NE(q[5][3].item<float>(), q[3][5].item<float>());
    // An unsharded model given the same tensors by name computes the same logits.
    models::LlamaForCausalLMImpl plain(cfg, at::TensorOptions(), 0);
    {
      at::NoGradGuard g;
      for (auto& p : plain.named_parameters()) {
        for (const auto& [name, t] : tensors) {
          if (name == p.key()) p.value().copy_(t.to(at::kFloat));
        }
      }
    }
    at::NoGradGuard g;
    const at::Tensor want = plain.forward(inputs());
    const at::Tensor got = m.logits(inputs());
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << (got - want).abs().max().item<double>();
  });
}

// Tied embeddings: no lm_head.weight is written; an lm_head.weight in a file is
// ignored for a tied model; an untied model needs it.
TEST(HuggingFace, TiedEmbeddings) {
  const std::string dir = testing::temp_dir("hf-tied");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto tied = make_sharded_llama(pg, "full", "block", 7, testing::small_config(true));
    checkpoint::export_hf(dir + "/tied", *tied.sharded, train::llama_hf_info(tied.cfg), pg);
    checkpoint::SafetensorsFile f(dir + "/tied/model.safetensors");
    EXPECT_EQ(f.find("lm_head.weight"), nullptr);
    EXPECT_NE(f.find("model.embed_tokens.weight"), nullptr);
    EXPECT_EQ(read_json(dir + "/tied/config.json")["tie_word_embeddings"], true);

    // Untied export (has lm_head) into a tied model: lm_head.weight ignored.
    auto untied = make_sharded_llama(pg, "full", "block", 7);
    checkpoint::export_hf(dir + "/untied", *untied.sharded, train::llama_hf_info(untied.cfg), pg);
    auto fresh = make_sharded_llama(pg, "full", "block", 8, testing::small_config(true));
    auto r = checkpoint::import_hf(dir + "/untied", *fresh.sharded, train::llama_hf_info(fresh.cfg), pg);
    EXPECT_EQ(r.ignored, std::vector<std::string>{"lm_head.weight"});

    // Tied file into an untied model: lm_head.weight is missing.
    try {
      checkpoint::import_hf(dir + "/tied", *untied.sharded, train::llama_hf_info(untied.cfg), pg);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'lm_head.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tie_word_embeddings"), std::string::npos) << e.what();
    }
  });
}

// config.json round-trips Llama 3's rope scaling (in transformers 5's
// rope_parameters), the special token ids, and Mistral's model type and
// sliding window; a trailing slash on the directory is fine.
TEST(HuggingFace, ConfigRoundTrip) {
  const std::string dir = testing::temp_dir("hf-config");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto cfg = testing::small_config(true);
    cfg.rope_scaling = models::RopeScaling{32.0, 1.0, 4.0, 8192};
    cfg.rope_theta = 500000.0;
    cfg.bos_token_id = 5;
    cfg.eos_token_id = {6, 7};
    auto m = make_sharded_llama(pg, "full", "block", 7, cfg);
    checkpoint::export_hf(dir + "/llama3/", *m.sharded, train::llama_hf_info(m.cfg), pg);
    const auto back = models::resolve_model_config(dir + "/llama3");
    EXPECT_EQ(models::llama_config_mismatch(back, cfg), "");
    ASSERT_TRUE(back.rope_scaling.has_value());
    EXPECT_EQ(back.rope_scaling->factor, 32.0);
    EXPECT_EQ(back.bos_token_id, 5);
    EXPECT_EQ(back.eos_token_id, (std::vector<int64_t>{6, 7}));
    const auto written = read_json(dir + "/llama3/config.json");
    EXPECT_EQ(written["rope_parameters"]["rope_type"], "llama3");
    EXPECT_EQ(written["rope_parameters"]["rope_theta"], 500000.0);
    EXPECT_FALSE(written.contains("rope_scaling"));
    EXPECT_FALSE(written.contains("torch_dtype"));
    EXPECT_EQ(written["dtype"], "float32");
    // extra_config replaces the model's ids (the trainer's tokenizer ids for runs without --init-from).
    checkpoint::HfExportOptions eo;
    eo.extra_config = nlohmann::json{{"bos_token_id", 256}, {"eos_token_id", 257}};
    checkpoint::export_hf(dir + "/llama3-tok", *m.sharded, train::llama_hf_info(m.cfg), pg, eo);
    EXPECT_EQ(read_json(dir + "/llama3-tok/config.json")["eos_token_id"], 257);
    EXPECT_EQ(models::resolve_model_config(dir + "/llama3-tok").bos_token_id, 256);
    auto other = cfg;
    other.rope_scaling->factor = 8.0;
    EXPECT_EQ(models::llama_config_mismatch(other, cfg), "rope_scaling.factor 8 vs 32");
    cfg.model_type = "mistral";
    auto mistral = make_sharded_llama(pg, "full", "block", 7, cfg);
    checkpoint::export_hf(dir + "/mistral", *mistral.sharded, train::llama_hf_info(mistral.cfg), pg);
    EXPECT_EQ(read_json(dir + "/mistral/config.json")["architectures"][0], "MistralForCausalLM");
    EXPECT_TRUE(read_json(dir + "/mistral/config.json")["sliding_window"].is_null());
    EXPECT_EQ(models::resolve_model_config(dir + "/mistral").model_type, "mistral");
    cfg.sliding_window = cfg.max_position_embeddings;  // no shorter than any sequence the model accepts
    auto windowed = make_sharded_llama(pg, "full", "block", 7, cfg);
    checkpoint::export_hf(dir + "/mistral-window", *windowed.sharded, train::llama_hf_info(windowed.cfg), pg);
    EXPECT_EQ(read_json(dir + "/mistral-window/config.json")["sliding_window"], cfg.max_position_embeddings);
    EXPECT_EQ(models::resolve_model_config(dir + "/mistral-window").sliding_window, cfg.max_position_embeddings);
  });
}

// Qwen2 (q/k/v biases) and Qwen3 (q/k norms, attention_bias, a sliding
// layer) exported at world size 2 after training steps and imported at world
// size 1 (HF names: q_proj.bias, q_norm.weight, ...): bit-identical logits; the
// config reads back as the same model; side files (tokenizer, generation
// config) are copied byte for byte; config_mismatch names what changes the math.
TEST(HuggingFace, QwenRoundTripSideFilesAndMismatches) {
  const std::string dir = testing::temp_dir("hf-qwen");
  const std::map<std::string, std::string> one_thread{{"OMP_NUM_THREADS", "1"}};
  auto qwen = [](const std::string& type) {
    auto c = testing::small_config(type == "qwen2");
    c.model_type = type;
    c.layer_types = {"full_attention", "sliding_attention"};
    c.sliding_window = 5;
    c.max_window_layers = 1;
    c.attention_bias = type == "qwen3";
    if (type == "qwen3") c.head_dim = 12;
    c.pad_token_id = 3;
    return c;
  };
  const std::string side = std::string("{\"bytes\": \"") + "\u00e9\u4e2d" + "\"}\n\x01\x02";
  if (!testing::is_worker()) {
    fs::create_directories(dir + "/src");
    std::ofstream(dir + "/src/tokenizer.json", std::ios::binary) << side;
    std::ofstream(dir + "/src/generation_config.json", std::ios::binary) << "{\"max_new_tokens\": 7}\n";
  }
  for (const std::string type : {"qwen2", "qwen3"}) {
    const auto cfg = qwen(type);
    testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, "full", "block", 7, cfg);
      for (int s = 0; s < 2; ++s) m.train_step(token_batch(1, 12, m.cfg.vocab_size, 10 * s + pg.rank()));
      const at::Tensor logits = m.logits(inputs());
      if (pg.rank() == 0) checkpoint::save_safetensors(dir + "/" + type + ".logits.safetensors", {{"logits", logits}});
      checkpoint::HfExportOptions eo;
      eo.extra_files = checkpoint::find_hf_side_files(dir + "/src");
      checkpoint::export_hf(dir + "/" + type, *m.sharded, train::llama_hf_info(m.cfg), pg, eo);
    }, std::chrono::seconds(180), one_thread);
    if (!testing::is_worker()) {  // workers must still reach every run_distributed call
      checkpoint::SafetensorsFile f(dir + "/" + type + "/model.safetensors");
      EXPECT_NE(f.find("model.layers.1.self_attn.q_proj.bias"), nullptr) << type;
      EXPECT_EQ(f.find("model.layers.1.self_attn.o_proj.bias") != nullptr, type == "qwen3");
      EXPECT_EQ(f.find("model.layers.0.self_attn.k_norm.weight") != nullptr, type == "qwen3");
      std::ifstream in(dir + "/" + type + "/tokenizer.json", std::ios::binary);
      EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), side);
      EXPECT_TRUE(fs::exists(dir + "/" + type + "/generation_config.json"));
      const auto back = models::resolve_model_config(dir + "/" + type);
      EXPECT_EQ(models::llama_config_mismatch(back, cfg), "") << type;
      EXPECT_EQ(back.layer_types, cfg.layer_types);
      EXPECT_EQ(back.pad_token_id, 3);
    }
    testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
      auto m = make_sharded_llama(pg, "full", "block", /*seed=*/123, cfg);
      checkpoint::import_hf(dir + "/" + type, *m.sharded, train::llama_hf_info(m.cfg), pg);
      const at::Tensor ref = checkpoint::SafetensorsFile(dir + "/" + type + ".logits.safetensors").tensor("logits");
      const at::Tensor got = m.logits(inputs());
      EXPECT_TRUE(at::equal(got, ref)) << type << ": max |diff| " << (got - ref).abs().max().item<double>();
    }, std::chrono::seconds(180), one_thread);
  }
  if (testing::is_worker()) return;
  const auto q3 = qwen("qwen3");
  auto other = q3;
  other.pad_token_id.reset();
  EXPECT_EQ(models::llama_config_mismatch(other, q3), "pad_token_id none vs 3");
  other = q3;
  other.layer_types = {"sliding_attention", "sliding_attention"};
  EXPECT_EQ(models::llama_config_mismatch(other, q3), "sliding window of layer 0 5 vs none");
  other = q3;
  other.sliding_window = q3.max_position_embeddings;  // never cuts: the same model as full attention
  other.layer_types = {"full_attention", "full_attention"};
  auto wide = other;
  wide.layer_types = {"sliding_attention", "sliding_attention"};
  EXPECT_EQ(models::llama_config_mismatch(other, wide), "");
  other = q3;
  other.attention_bias = false;
  EXPECT_EQ(models::llama_config_mismatch(other, q3), "attention_bias false vs true");
  EXPECT_EQ(models::llama_config_mismatch(qwen("qwen2"), q3).rfind("model_type qwen2 vs qwen3", 0), 0u);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                           "generation_config.json", "vocab.json", "merges.txt", "chat_template.jinja"}) {
    EXPECT_TRUE(checkpoint::is_hf_export_file(name)) << name;
  }
  EXPECT_FALSE(checkpoint::is_hf_export_file("README.md"));
}

// Shapes that differ name the tensor and both shapes; bf16 export rounds to
// nearest even like torch; an export never replaces a directory holding other files.
TEST(HuggingFace, ShapeMismatchBf16AndForeignFiles) {
  const std::string dir = testing::temp_dir("hf-misc");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto m = make_sharded_llama(pg, "full");
    checkpoint::HfExportOptions eo;
    eo.dtype = at::kBFloat16;
    eo.extra_config = nlohmann::json{{"eos_token_id", 2}};
    checkpoint::export_hf(dir + "/bf16", *m.sharded, train::llama_hf_info(m.cfg), pg, eo);
    const auto cfg = read_json(dir + "/bf16/config.json");
    EXPECT_EQ(cfg["dtype"], "bfloat16");
    EXPECT_EQ(cfg["eos_token_id"], 2);
    const auto state = testing::full_state(m);
    checkpoint::SafetensorsFile f(dir + "/bf16/model.safetensors");
    for (const auto& e : f.entries()) {
      EXPECT_EQ(e.dtype, "BF16");
      EXPECT_TRUE(at::equal(f.tensor(e.name), state.at("param/" + e.name).to(at::kBFloat16))) << e.name;
    }
    // Re-export over an earlier export: allowed, replaced whole.
    checkpoint::export_hf(dir + "/bf16", *m.sharded, train::llama_hf_info(m.cfg), pg);
    EXPECT_EQ(read_json(dir + "/bf16/config.json")["dtype"], "float32");

    auto cfg2 = testing::small_config();
    cfg2.intermediate_size = 80;
    auto other = make_sharded_llama(pg, "full", "block", 7, cfg2);
    try {
      checkpoint::import_hf(dir + "/bf16", *other.sharded, train::llama_hf_info(other.cfg), pg);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[72, 32]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[80, 32]"), std::string::npos) << msg;
    }
    fs::create_directories(dir + "/mine");
    std::ofstream(dir + "/mine/notes.txt") << "precious";
    EXPECT_THROW(checkpoint::export_hf(dir + "/mine", *m.sharded, train::llama_hf_info(m.cfg), pg), Failure);
    EXPECT_TRUE(fs::exists(dir + "/mine/notes.txt"));
    EXPECT_THROW(checkpoint::check_export_dir(dir + "/mine"), UsageError);
    EXPECT_NO_THROW(checkpoint::check_export_dir(dir + "/bf16"));
  });
}

}  // namespace fsdp

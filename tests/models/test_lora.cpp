// apply_lora on the Llama model: names, shapes, frozen flags, refusals,
// initialization (materialized and from the meta device alike), the forward
// against a plain reference, merging, and dropout; --lora-targets' parser and
// --freeze (nn::freeze_matching) beside it. Numerics against peft itself:
// tests/hf/test_lora.py.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "fsdp/models/layers.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/nn/freeze.h"
#include "models_test_util.h"
#include "support/tiny_llama.h"

namespace {

using fsdp::models::apply_lora;
using fsdp::models::build_llama;
using fsdp::models::LlamaConfig;
using fsdp::models::LlamaForCausalLM;
using fsdp::models::Linear;
using fsdp::models::LoraConfig;
using fsdp::models::testing::usage_error_of;

const at::TensorOptions kCpu = at::TensorOptions().dtype(at::kFloat);
const at::TensorOptions kMeta = at::TensorOptions().device(at::kMeta);

// The tests' tiny shape (D=32, L=2, H=4, Hkv=2, Dh=8, V=64) with F=64 and T<=32.
LlamaConfig small_cfg() {
  LlamaConfig c = fsdp::testing::tiny_llama("test-lora");
  c.intermediate_size = 64;
  c.max_position_embeddings = 32;
  return c;
}

LoraConfig lora(int64_t rank, std::vector<std::string> targets = LoraConfig::default_lora_targets(),
                double alpha = 16, double dropout = 0) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.dropout = dropout;
  c.targets = std::move(targets);
  return c;
}

at::Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(V, {B, T}, gen, at::kLong);
}

// Every B of the model set to random values (B = 0 makes the adapters invisible).
void randomize_lora_B(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (auto& p : m.named_parameters()) {
    if (p.key().find(".lora_B.") != std::string::npos) p.value().copy_(at::randn(p.value().sizes(), gen) * 0.1);
  }
}

}  // namespace

TEST(Lora, NamesShapesAndFrozenFlags) {
  const LlamaConfig cfg = small_cfg();
  LlamaForCausalLM m = build_llama(cfg, kCpu, 1);
  const auto adapted = apply_lora(*m, lora(4, {"q_proj", "v_proj", "down_proj"}), 1);
  EXPECT_EQ(adapted, (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                               "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
                                               "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"}));
  const auto params = m->named_parameters();
  EXPECT_EQ(params.find("model.layers.1.self_attn.q_proj.lora_A.weight")->sizes(), at::IntArrayRef({4, 32}));
  EXPECT_EQ(params.find("model.layers.1.self_attn.q_proj.lora_B.weight")->sizes(), at::IntArrayRef({32, 4}));
  EXPECT_EQ(params.find("model.layers.0.self_attn.v_proj.lora_B.weight")->sizes(), at::IntArrayRef({16, 4}));
  EXPECT_EQ(params.find("model.layers.0.mlp.down_proj.lora_A.weight")->sizes(), at::IntArrayRef({4, 64}));
  EXPECT_EQ(params.find("model.layers.0.self_attn.k_proj.lora_A.weight"), nullptr);
  int64_t trainable = 0;
  for (const auto& p : params) {
    EXPECT_EQ(p.value().requires_grad(), fsdp::models::is_lora_parameter(p.key())) << p.key();
    trainable += p.value().requires_grad();
  }
  EXPECT_EQ(trainable, 12);
  // The base parameters keep HF's order; each adapter follows its weight.
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.key());
  auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  EXPECT_EQ(pos("model.layers.0.self_attn.q_proj.lora_A.weight"), pos("model.layers.0.self_attn.q_proj.weight") + 1);
  EXPECT_LT(pos("model.layers.0.self_attn.q_proj.lora_B.weight"), pos("model.layers.0.self_attn.k_proj.weight"));
}

TEST(Lora, RefusesUnknownTargetsAndBadValues) {
  LlamaForCausalLM m = build_llama(small_cfg(), kMeta, 1);
  const std::string e = usage_error_of([&] { apply_lora(*m, lora(4, {"q_proj", "qproj"}), 1); });
  EXPECT_CONTAINS(e, "'qproj' matches no Linear layer");
  EXPECT_CONTAINS(e, "down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj");
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(0), 1); }), "LoraConfig::rank 0 must be >= 1");
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(4, {"q_proj"}, -1), 1); }), "LoraConfig::alpha -1");
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(4, {"q_proj"}, 8, 1.0), 1); }), "LoraConfig::dropout 1");
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(4, {}), 1); }), "LoraConfig::targets is empty");
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(4, {"q_proj", "q_proj"}), 1); }), "twice");
  // A refused call changed nothing; a second application is refused.
  EXPECT_EQ(m->named_parameters().size(), 2 + 2 * 9 + 1u);
  apply_lora(*m, lora(4, {"q_proj"}), 1);
  EXPECT_CONTAINS(usage_error_of([&] { apply_lora(*m, lora(4, {"q_proj"}), 1); }), "already has a LoRA adapter");
}

// --lora-targets' words, for fsdp-train and fsdp-inspect alike.
TEST(Lora, TargetsParseAndRefuseEmptyNames) {
  using fsdp::models::parse_lora_targets;
  EXPECT_EQ(parse_lora_targets("q_proj"), (std::vector<std::string>{"q_proj"}));
  EXPECT_EQ(parse_lora_targets(" q_proj , v_proj"), (std::vector<std::string>{"q_proj", "v_proj"}));
  for (const char* bad : {"", " ", "q_proj,", ",q_proj", "q_proj,,v_proj", "q_proj, ,v_proj"}) {
    EXPECT_EQ(usage_error_of([&] { parse_lora_targets(bad); }),
              "LoraConfig::targets '" + std::string(bad) + "' has an empty name; give comma-separated names of Linear "
              "layers, e.g. q_proj,k_proj,v_proj,o_proj") << bad;
  }
}

// --freeze REGEX (nn::freeze_matching), for fsdp-train and fsdp-inspect alike:
// here on the Llama model, whose names its messages quote.
TEST(Freeze, FreezesWhatThePatternFindsAndCountsIt) {
  LlamaForCausalLM m = build_llama(small_cfg(), kMeta, 1);
  EXPECT_EQ(fsdp::nn::freeze_matching(*m, "embed_tokens|layers\\.0\\."), 1 + 9);
  for (const auto& p : m->named_parameters()) {
    const bool frozen = p.key() == "model.embed_tokens.weight" || p.key().rfind("model.layers.0.", 0) == 0;
    EXPECT_EQ(p.value().requires_grad(), !frozen) << p.key();
  }
  // Frozen ones count no more; a pattern that finds only them freezes nothing.
  EXPECT_EQ(fsdp::nn::freeze_matching(*m, "layers\\.[01]\\.self_attn"), 4);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::nn::freeze_matching(*m, "embed_tokens"); }),
                  "freeze_matching: pattern 'embed_tokens' freezes no trainable parameter; parameter names look like "
                  "'model.layers.0.");
}

TEST(Freeze, RefusesBadPatternsNothingAndEverything) {
  LlamaForCausalLM m = build_llama(small_cfg(), kMeta, 1);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::nn::freeze_matching(*m, "layers.("); }),
                  "freeze_matching: pattern 'layers.(' is not a valid regular expression (");
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::nn::freeze_matching(*m, "experts"); }),
                  "freeze_matching: pattern 'experts' freezes no trainable parameter; parameter names look like "
                  "'model.layers.0.");
  EXPECT_EQ(usage_error_of([&] { fsdp::nn::freeze_matching(*m, "weight"); }),
            "freeze_matching: pattern 'weight' freezes every trainable parameter: nothing is left to train; narrow "
            "the pattern");
  // After LoRA only the adapters train: freezing them all leaves nothing.
  LlamaForCausalLM l = build_llama(small_cfg(), kMeta, 1);
  apply_lora(*l, lora(4, {"q_proj"}), 1);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::nn::freeze_matching(*l, "embed_tokens"); }),
                  "freezes no trainable parameter");
  EXPECT_EQ(fsdp::nn::freeze_matching(*l, "layers\\.0\\..*lora_"), 2);
  EXPECT_CONTAINS(usage_error_of([&] { fsdp::nn::freeze_matching(*l, "lora_"); }), "freezes every trainable parameter");
}

TEST(Lora, InitIsPeftsAndMetaShardsAgree) {
  LlamaConfig cfg = small_cfg();
  cfg.hidden_size = 256;  // room for statistics
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 8;
  LlamaForCausalLM m = build_llama(cfg, kCpu, 3);
  apply_lora(*m, lora(16, {"q_proj", "o_proj"}), 3);
  const auto params = m->named_parameters();
  const at::Tensor A = *params.find("model.layers.0.self_attn.q_proj.lora_A.weight");
  const double bound = 1.0 / std::sqrt(256.0);  // kaiming_uniform(a=sqrt(5)) of fan_in 256
  EXPECT_LE(A.abs().max().item<double>(), bound);
  EXPECT_NEAR(A.std().item<double>(), bound / std::sqrt(3.0), 0.1 * bound);
  EXPECT_TRUE(params.find("model.layers.0.self_attn.q_proj.lora_B.weight")->eq(0).all().item<bool>());
  // The same model from the meta device, element slices from the engine's rule.
  LlamaForCausalLM meta = build_llama(cfg, kMeta, 3);
  apply_lora(*meta, lora(16, {"q_proj", "o_proj"}), 3);
  const auto rule = fsdp::models::lora_init_rule(*meta, fsdp::models::llama_init_rule(cfg));
  for (auto& p : meta->named_parameters()) {
    const int64_t n = p.value().numel();
    at::Tensor shard = at::empty({n / 3}, at::kFloat);
    fsdp::nn::init_slice(shard, rule(p.key()), 3, p.key(), n / 2);
    EXPECT_TRUE(shard.equal(params.find(p.key())->view({-1}).narrow(0, n / 2, n / 3))) << p.key();
  }
}

TEST(Lora, ForwardEqualsTheBaseWhileBIsZeroAndTheReferenceAfter) {
  const LlamaConfig cfg = small_cfg();
  LlamaForCausalLM base = build_llama(cfg, kCpu, 5);
  LlamaForCausalLM m = build_llama(cfg, kCpu, 5);
  apply_lora(*m, lora(4), 5);
  const at::Tensor x = tokens(2, 8, cfg.vocab_size, 1);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(m->forward(x).equal(base->forward(x)));  // B = 0: the adapters add exact zeros
  randomize_lora_B(*m);
  EXPECT_FALSE(m->forward(x).equal(base->forward(x)));
  // One adapted Linear against its formula.
  Linear l(32, 16, /*bias=*/true, kCpu);
  fsdp::nn::init_module(*l, [](const std::string&) { return fsdp::nn::InitRule::normal(0.5); }, 1);
  const at::Tensor in = at::randn({3, 5, 32});
  const at::Tensor plain = l->forward(in);
  l->add_lora(4, 8, 0, 1);
  fsdp::nn::init_module(*l, [](const std::string&) { return fsdp::nn::InitRule::normal(0.5); }, 2);
  const at::Tensor want = at::linear(in, l->weight(), l->bias()) +
                          at::linear(at::linear(in, l->lora_A()), l->lora_B()) * 2.0;
  EXPECT_TRUE(l->forward(in).equal(want));
  EXPECT_FALSE(plain.equal(want));
}

TEST(Lora, MergedWeightsGiveTheAdaptedForward) {
  const LlamaConfig cfg = small_cfg();
  LlamaForCausalLM m = build_llama(cfg, kCpu, 5);
  apply_lora(*m, lora(4, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, 12), 5);
  randomize_lora_B(*m);
  LlamaForCausalLM merged = build_llama(cfg, kCpu, 99);
  at::NoGradGuard no_grad;
  const auto adapted = m->named_parameters();
  for (auto& p : merged->named_parameters()) {
    const std::string stem = p.key().substr(0, p.key().size() - std::string(".weight").size());
    const at::Tensor* A = adapted.find(stem + ".lora_A.weight");
    if (A) {
      p.value().copy_(fsdp::models::merge_lora_weight(*adapted.find(p.key()), *A,
                                                      *adapted.find(stem + ".lora_B.weight"), 12.0 / 4));
    } else {
      p.value().copy_(*adapted.find(p.key()));
    }
  }
  const at::Tensor x = tokens(2, 8, cfg.vocab_size, 2);
  const at::Tensor a = m->forward(x);
  const at::Tensor b = merged->forward(x);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-5 * a.abs().max().item<double>());
}

TEST(Lora, GradientsReachOnlyTheAdapters) {
  const LlamaConfig cfg = small_cfg();
  LlamaForCausalLM m = build_llama(cfg, kCpu, 5);
  apply_lora(*m, lora(4), 5);
  randomize_lora_B(*m);
  const at::Tensor x = tokens(2, 8, cfg.vocab_size, 3);
  m->loss(x, tokens(2, 8, cfg.vocab_size, 4)).backward();
  for (const auto& p : m->named_parameters()) {
    if (fsdp::models::is_lora_parameter(p.key())) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_GT(p.value().grad().abs().max().item<double>(), 0) << p.key();
    } else {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    }
  }
}

TEST(Lora, DropoutIsKeyedOffInEvalAndDrawsNothingAtZero) {
  const LlamaConfig cfg = small_cfg();
  LlamaForCausalLM m = build_llama(cfg, kCpu, 5);
  apply_lora(*m, lora(4, {"q_proj", "v_proj"}, 16, 0.5), 5);
  randomize_lora_B(*m);
  const at::Tensor x = tokens(2, 8, cfg.vocab_size, 5);
  at::NoGradGuard no_grad;
  const auto global = at::detail::getDefaultCPUGenerator().get_state();
  fsdp::models::set_lora_dropout_key(*m, 1);
  const at::Tensor a1 = m->forward(x);
  const at::Tensor a2 = m->forward(x);
  fsdp::models::set_lora_dropout_key(*m, 2);
  const at::Tensor b = m->forward(x);
  EXPECT_TRUE(a1.equal(a2));   // the same key: the same masks (a recompute)
  EXPECT_FALSE(a1.equal(b));   // another micro-batch: other masks
  EXPECT_TRUE(at::detail::getDefaultCPUGenerator().get_state().equal(global));  // the global stream untouched
  m->eval();
  const at::Tensor e = m->forward(x);
  LlamaForCausalLM nodrop = build_llama(cfg, kCpu, 5);
  apply_lora(*nodrop, lora(4, {"q_proj", "v_proj"}, 16, 0.0), 5);
  randomize_lora_B(*nodrop);
  EXPECT_TRUE(e.equal(nodrop->forward(x)));  // eval: no dropout
  EXPECT_FALSE(e.equal(a1));
}

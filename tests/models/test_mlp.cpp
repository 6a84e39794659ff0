#include <gtest/gtest.h>
#include <torch/optim/adam.h>

#include <cmath>

#include "fsdp/models/mlp.h"
#include "models_test_util.h"

namespace {

using fsdp::models::Mlp;
using fsdp::models::MlpConfig;
using fsdp::models::testing::usage_error_of;

const at::TensorOptions kCpu = at::TensorOptions().dtype(at::kFloat);

}  // namespace

TEST(Mlp, NamesFollowTheTutorialsSequential) {
  Mlp m(MlpConfig{16, 3}, kCpu, 0);
  std::vector<std::string> names;
  for (auto& p : m->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fcs.0.weight", "fcs.0.bias", "fcs.2.weight", "fcs.2.bias",
                                             "fcs.4.weight", "fcs.4.bias"}));
  EXPECT_EQ(m->named_parameters().find("fcs.2.weight")->sizes(), at::IntArrayRef({16, 16}));
}

TEST(Mlp, TutorialSizeOnMeta) {
  const MlpConfig cfg;  // 8 x 20480
  EXPECT_EQ(cfg.num_parameters(), 3355607040LL);
  Mlp m(cfg, at::TensorOptions().device(at::kMeta), 0);
  int64_t numel = 0;
  for (auto& p : m->parameters()) {
    numel += p.numel();
    EXPECT_TRUE(p.is_meta());
  }
  EXPECT_EQ(numel, cfg.num_parameters());
}

TEST(Mlp, EveryLinearIsAUnit) {
  Mlp m(MlpConfig{8, 4}, at::TensorOptions().device(at::kMeta), 0);
  const auto units = fsdp::nn::find_units(m.ptr());
  ASSERT_EQ(units.size(), 4u);
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(units[i].first, "fcs." + std::to_string(2 * i));
    EXPECT_EQ(units[i].second->inner_type(), fsdp::models::mlp_block_type());
  }
}

TEST(Mlp, ForwardIsLinearReluChainWithoutFinalRelu) {
  Mlp m(MlpConfig{12, 3}, kCpu, 1);
  const at::Tensor x = at::randn({5, 12});
  auto p = m->named_parameters();
  at::Tensor h = x;
  for (int i = 0; i < 3; ++i) {
    const std::string k = "fcs." + std::to_string(2 * i);
    h = at::linear(h, *p.find(k + ".weight"), *p.find(k + ".bias"));
    if (i < 2) h = at::relu(h);
  }
  EXPECT_TRUE(at::allclose(m->forward(x), h, 1e-6, 1e-6));
  EXPECT_TRUE((h < 0).any().item<bool>()) << "the last layer has no ReLU";
  EXPECT_NEAR(m->loss(x, at::zeros({5, 12})).item<double>(), h.pow(2).mean().item<double>(), 1e-6);
}

TEST(Mlp, InitIsTorchLinearDefault) {
  const int64_t W = 256;
  Mlp m(MlpConfig{W, 2}, kCpu, 7);
  const double bound = 1.0 / std::sqrt(static_cast<double>(W));
  for (auto& p : m->named_parameters()) {
    EXPECT_LE(p.value().abs().max().item<double>(), bound) << p.key();
  }
  const at::Tensor w = *m->named_parameters().find("fcs.0.weight");
  EXPECT_NEAR(w.std().item<double>(), bound / std::sqrt(3.0), 0.01 * bound);
}

TEST(Mlp, LossDecreasesWithAdam) {
  Mlp m(MlpConfig{32, 4}, kCpu, 3);
  const at::Tensor x = at::randn({16, 32}, at::make_generator<at::CPUGeneratorImpl>(1));
  const at::Tensor y = at::randn({16, 32}, at::make_generator<at::CPUGeneratorImpl>(2));
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const at::Tensor loss = m->loss(x, y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

TEST(Mlp, BadInputsAreUsageErrors) {
  Mlp m(MlpConfig{8, 2}, kCpu, 0);
  std::string msg = usage_error_of([&] { m->forward(at::zeros({4, 9})); });
  EXPECT_NE(msg.find("W=8"), std::string::npos) << msg;
  msg = usage_error_of([&] { Mlp(MlpConfig{0, 2}, kCpu, 0); });
  EXPECT_NE(msg.find("width"), std::string::npos) << msg;
}

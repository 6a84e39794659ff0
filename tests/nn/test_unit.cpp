#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "fsdp/nn/unit.h"

namespace {

struct BlockImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::Tensor scale;  // (D)
  BlockImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    scale = register_parameter("scale", torch::ones({4}));
  }
  // Mixed arguments: tensors are inputs, the int is replayed as is.
  torch::Tensor forward(const torch::Tensor& x, int64_t repeat, torch::Tensor bias) {
    torch::Tensor h = x;
    for (int64_t i = 0; i < repeat; ++i) h = fc(h) * scale + bias;
    return h;
  }
};

struct ParentImpl : torch::nn::Module {
  fsdp::nn::Unit<BlockImpl> block{nullptr};
  ParentImpl() { block = register_module("block", fsdp::nn::make_unit<BlockImpl>()); }
  torch::Tensor forward(const torch::Tensor& x) { return block(x, 2, torch::zeros({4})); }
};

// Records calls and runs the unit's function twice, as a recompute would.
struct CountingHooks : fsdp::nn::UnitHooks {
  int calls = 0;
  std::vector<at::Tensor> run(const fsdp::nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) override {
    ++calls;
    EXPECT_EQ(inputs.size(), 2u);  // x and bias, not the int
    auto first = fn(inputs);
    auto again = fn(inputs);
    EXPECT_TRUE(first[0].equal(again[0]));
    return first;
  }
};

}  // namespace

TEST(Unit, NamesAreUnchangedByTheMark) {
  auto parent = std::make_shared<ParentImpl>();
  std::vector<std::string> names;
  for (auto& p : parent->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"block.scale", "block.fc.weight", "block.fc.bias"}));
}

TEST(Unit, PlainCallWithoutHooksMatchesInner) {
  auto parent = std::make_shared<ParentImpl>();
  auto x = torch::randn({3, 4});
  auto direct = parent->block->impl().forward(x, 2, torch::zeros({4}));
  EXPECT_TRUE(parent->forward(x).equal(direct));
}

TEST(Unit, HooksSeeTensorInputsAndCanReplay) {
  auto parent = std::make_shared<ParentImpl>();
  auto hooks = std::make_shared<CountingHooks>();
  auto x = torch::randn({3, 4});
  auto expected = parent->forward(x);
  parent->block->set_hooks(hooks);
  EXPECT_TRUE(parent->forward(x).equal(expected));
  EXPECT_EQ(hooks->calls, 1);
}

TEST(Unit, FindUnitsReportsQualifiedNames) {
  auto parent = std::make_shared<ParentImpl>();
  auto units = fsdp::nn::find_units(parent);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].first, "block");
  EXPECT_EQ(units[0].second->inner_type(), std::type_index(typeid(BlockImpl)));
}

// Single-process checks of the engine: layout arithmetic, wrap policies,
// parameter binding, shared parameters, and errors.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>

#include <cmath>
#include <iostream>
#include <map>

#include "flat_param.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"
#include "fsdp/fsdp.h"
#include "support/counting_allocator.h"
#include "toy_models.h"

namespace fsdp {
using testing::ToyBlockImpl;
using testing::ToyConfig;
using testing::ToyNetImpl;

namespace {

comm::ProcessGroupPtr single_process_group() {
  static comm::Runtime rt = comm::init_process_group(comm::WorldInfo{});
  return rt.world_group;
}

std::vector<std::string> unit_names(const ShardedModel& m) {
  std::vector<std::string> n;
  for (const auto& u : m.units()) n.push_back(u.name);
  return n;
}

}  // namespace

TEST(FlatLayout, PadsToTheShardGroupAndReportsOverlaps) {
  std::vector<ParamPlacement> ps(3);
  ps[0].name = "a"; ps[0].numel = 5;
  ps[1].name = "b"; ps[1].numel = 3;
  ps[2].name = "c"; ps[2].numel = 2;
  auto l = detail::FlatLayout::make(ps, 4);
  EXPECT_EQ(l.numel, 10);
  EXPECT_EQ(l.padded_numel, 12);
  EXPECT_EQ(l.shard_numel, 3);
  EXPECT_EQ(l.params[1].flat_offset, 5);
  EXPECT_EQ(l.params[2].flat_offset, 8);
  // rank 1 owns [3, 6): a[3..5) and b[0..1)
  EXPECT_EQ(l.overlap(0, 3, 6), (std::pair<int64_t, int64_t>{3, 2}));
  EXPECT_EQ(l.overlap(1, 3, 6), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(l.overlap(2, 3, 6), (std::pair<int64_t, int64_t>{0, 0}));
  // rank 3 owns [9, 12): c[1..2) and two padding elements
  EXPECT_EQ(l.overlap(2, 9, 12), (std::pair<int64_t, int64_t>{1, 1}));
  auto one = detail::FlatLayout::make(ps, 1);
  EXPECT_EQ(one.padded_numel, 10);
}

TEST(WrapPolicy, EveryUnitByTypeSizeAndRootOnly) {
  ToyConfig c;  // blocks of 7*13*2 + 13 = 195 parameters
  auto pg = single_process_group();
  auto build = [&] { return testing::make_toy(c, false, 1).ptr(); };
  FsdpOptions o;
  {
    auto m = fully_shard(build(), pg, o);
    EXPECT_EQ(unit_names(*m), (std::vector<std::string>{"", "blocks.0", "blocks.1", "blocks.2"}));
    EXPECT_EQ(m->units()[0].numel, 7 * 5 + 3 * 7);  // w_in and w_out stay with the root
  }
  {
    o.wrap = WrapPolicy::by_type({std::type_index(typeid(ToyBlockImpl))});
    EXPECT_EQ(unit_names(*fully_shard(build(), pg, o)).size(), 4u);
    o.wrap = WrapPolicy::by_type({std::type_index(typeid(int))});
    EXPECT_EQ(unit_names(*fully_shard(build(), pg, o)), (std::vector<std::string>{""}));
  }
  {
    o.wrap = WrapPolicy::size_based(195);
    EXPECT_EQ(unit_names(*fully_shard(build(), pg, o)).size(), 4u);
    o.wrap = WrapPolicy::size_based(196);  // no block is big enough alone: all fold into the root
    auto m = fully_shard(build(), pg, o);
    EXPECT_EQ(unit_names(*m), (std::vector<std::string>{""}));
    EXPECT_EQ(m->units()[0].numel, 7 * 5 + 3 * 7 + 3 * 195);
  }
  {
    o.wrap = WrapPolicy::root_only();
    auto m = fully_shard(build(), pg, o);
    ASSERT_EQ(m->units().size(), 1u);
    // Registration order: the root's own parameters first, then children.
    std::vector<std::string> names;
    for (const auto& p : m->units()[0].params) names.push_back(p.name);
    EXPECT_EQ(names.front(), "w_in");
    EXPECT_EQ(names[1], "w_out");
    EXPECT_EQ(names[2], "blocks.0.w1");
  }
}

TEST(Engine, ParametersBecomeViewsAndValuesSurviveSharding) {
  ToyConfig c;
  auto pg = single_process_group();
  auto plain = testing::make_toy(c, false, 5);
  auto x = torch::randn({4, c.d_in});
  auto y = torch::randn({4, c.d_out});
  const double before = plain->forward(x, y).item<double>();

  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    auto model = testing::make_toy(c, false, 5);
    FsdpOptions o;
    o.strategy = strategy;
    auto sharded = fully_shard(model.ptr(), pg, o);
    // Same loss through the sharded path, forward with and without grad.
    EXPECT_DOUBLE_EQ(model->forward(x, y).item<double>(), before) << to_string(strategy);
    {
      at::NoGradGuard ng;
      EXPECT_DOUBLE_EQ(model->forward(x, y).item<double>(), before) << to_string(strategy);
    }
    // Parameters keep their names and shapes.
    auto w1 = model->impl().blocks[0]->impl().w1;
    EXPECT_EQ(w1.sizes(), (std::vector<int64_t>{c.f, c.d}));
    EXPECT_TRUE(w1.requires_grad());
    // One rank, fp32: every strategy keeps the single copy (Note [One-rank shard
    // groups]): the parameters are views of the shards themselves.
    EXPECT_TRUE(internals::storage_allocated(w1)) << to_string(strategy);
    bool in_a_shard = false;
    for (const auto& s : sharded->shards()) in_a_shard |= w1.storage().is_alias_of(s.param.storage());
    EXPECT_TRUE(in_a_shard) << to_string(strategy) << ": w1 is not a view of a shard";
  }
  // With a bf16 compute copy the strategy stands: FULL_SHARD at world size 1
  // still frees the unsharded bytes between uses.
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    auto model = testing::make_toy(c, false, 5);
    FsdpOptions o;
    o.strategy = strategy;
    o.mixed_precision = MixedPrecision::preset("bf16");
    auto sharded = fully_shard(model.ptr(), pg, o);
    model->forward(x, y).backward();
    auto w1 = model->impl().blocks[0]->impl().w1;
    EXPECT_EQ(w1.scalar_type(), at::kBFloat16);
    EXPECT_FALSE(internals::storage_allocated(w1)) << to_string(strategy);
  }
}

TEST(Engine, GradientShardsEqualThePlainModelsGradientsAtWorldSizeOne) {
  ToyConfig c;
  auto pg = single_process_group();
  auto x = torch::randn({4, c.d_in});
  auto y = torch::randn({4, c.d_out});
  auto plain = testing::make_toy(c, false, 9);
  plain->forward(x, y).backward();
  std::map<std::string, at::Tensor> want;
  for (auto& p : plain->named_parameters()) want[p.key()] = p.value().grad();

  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    auto model = testing::make_toy(c, false, 9);
    FsdpOptions o;
    o.strategy = strategy;
    auto sharded = fully_shard(model.ptr(), pg, o);
    auto loss = model->forward(x, y);
    ASSERT_TRUE(loss.requires_grad());
    loss.backward();
    const auto shards = sharded->shards();
    for (size_t u = 0; u < shards.size(); ++u) {
      for (const auto& p : sharded->units()[u].params) {
        at::Tensor got = shards[u].grad.narrow(0, p.flat_offset, p.numel).view(p.shape);
        EXPECT_TRUE(got.equal(want.at(p.name))) << to_string(strategy) << " " << p.name;
      }
    }
    // Parameters of a resharded unit carry no stale .grad views.
    EXPECT_FALSE(model->impl().blocks[1]->impl().w1.grad().defined()) << to_string(strategy);
  }
}

TEST(Engine, MetaModelMaterializesTheSameValuesAsAnEagerOne) {
  ToyConfig c;
  auto pg = single_process_group();
  auto eager = testing::make_toy(c, false, 77);
  auto meta = testing::make_toy(c, true, 77);
  FsdpOptions o;
  o.init_rule = testing::toy_init_rule;
  o.seed = 77;
  auto a = fully_shard(eager.ptr(), pg, o);
  auto b = fully_shard(meta.ptr(), pg, o);
  for (size_t u = 0; u < a->units().size(); ++u) {
    EXPECT_TRUE(a->shards()[u].param.equal(b->shards()[u].param)) << "unit " << u;
  }
}

// Note [Frozen shards in the param dtype]: under bf16, a frozen entry's shard
// is bf16 holding the fp32 values rounded once (what each gather would give),
// a trainable one keeps fp32 masters; under NO_SHARD the frozen shard is the
// module's parameter itself; under FULL_SHARD the parameter is resharded.
TEST(Engine, FrozenShardsHoldTheParamDtypeRoundedFromTheMasterValues) {
  ToyConfig c;
  auto pg = single_process_group();
  auto reference = testing::make_toy(c, false, 5);  // fp32 values, materialized eagerly
  std::map<std::string, at::Tensor> want;
  for (const auto& p : reference->named_parameters(true)) want[p.key()] = p.value().detach().reshape({-1});
  for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    auto model = testing::make_toy(c, true, 5);
    for (auto& p : model->named_parameters(true)) {
      if (p.key().find("w1") != std::string::npos) p.value().set_requires_grad(false);
    }
    FsdpOptions o;
    o.strategy = s;
    o.mixed_precision = MixedPrecision::preset("bf16");
    o.init_rule = testing::toy_init_rule;
    o.seed = 5;
    auto sharded = fully_shard(model.ptr(), pg, o);
    int frozen = 0;
    for (size_t u = 0; u < sharded->units().size(); ++u) {
      const UnitInfo& info = sharded->units()[u];
      const at::Tensor shard = sharded->shards()[u].param;
      ASSERT_EQ(shard.scalar_type(), info.trainable ? at::kFloat : at::kBFloat16) << info.name;
      for (const ParamPlacement& p : info.params) {
        const at::Tensor expected = info.trainable ? want.at(p.name) : want.at(p.name).to(at::kBFloat16);
        EXPECT_TRUE(shard.narrow(0, p.flat_offset, p.numel).equal(expected)) << to_string(s) << " " << p.name;
      }
      if (info.trainable) continue;
      ++frozen;
      const at::Tensor w1 = model->impl().blocks[0]->impl().w1;
      if (info.name != "blocks.0") continue;
      if (s == ShardingStrategy::kNoShard) {
        EXPECT_EQ(w1.data_ptr(), shard.data_ptr());  // the single copy: no compute copy beside it
      } else {
        EXPECT_THROW((void)w1.data_ptr(), c10::Error);  // resharded between uses
      }
    }
    EXPECT_EQ(frozen, c.blocks) << to_string(s);
  }
}

TEST(Engine, MetaModelWithoutInitRuleIsAUsageError) {
  auto pg = single_process_group();
  auto meta = testing::make_toy(ToyConfig{}, true, 1);
  try {
    fully_shard(meta.ptr(), pg, FsdpOptions{});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("init_rule"), std::string::npos) << e.what();
  }
}

namespace {
// Two names for one tensor inside the root (tied weights).
struct TiedImpl : torch::nn::Module {
  torch::Tensor emb;  // (V, D)
  torch::Tensor head; // the same tensor as emb
  TiedImpl() {
    emb = register_parameter("emb", torch::randn({6, 4}));
    head = register_parameter("head", emb);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(emb.t()).matmul(head).sum(); }
};
}  // namespace

TEST(Engine, TiedParametersAreStoredOnce) {
  auto pg = single_process_group();
  auto m = nn::make_unit<TiedImpl>();
  auto sharded = fully_shard(m.ptr(), pg, FsdpOptions{});
  ASSERT_EQ(sharded->units().size(), 1u);
  EXPECT_EQ(sharded->units()[0].numel, 24);
  EXPECT_TRUE(m->impl().emb.is_same(m->impl().head));
  auto loss = m->forward(torch::randn({2, 4}));
  loss.backward();
  EXPECT_GT(sharded->grad_norm(), 0.0);
}

// Note [Norm without fp64 copies] in api.cpp: the norm of the gradient shards
// equals the fp64 reference within 1e-6 relative — on values spanning eight
// orders of magnitude — and computing it allocates nothing near the size of a
// gradient (9fc8542 made two fp64 copies of each: 2 x 8 bytes per element).
TEST(Engine, GradNormEqualsTheFp64ReferenceWithoutFp64CopiesOfTheGradients) {
  ToyConfig c;  // blocks of 2 x 256 x 1024 + 1024 parameters: 2 MiB of fp32 gradient each
  c.d_in = 64;
  c.d = 256;
  c.f = 1024;
  c.d_out = 64;
  c.blocks = 2;
  auto pg = single_process_group();
  auto model = testing::make_toy(c, false, 4);
  auto sharded = fully_shard(model.ptr(), pg, FsdpOptions{});
  model->forward(torch::randn({8, c.d_in}), torch::randn({8, c.d_out})).backward();
  int64_t largest_grad = 0;
  double want_sq = 0;
  {
    at::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (const ShardRef& r : sharded->shards()) {
      // Heavy tails: where fp32 accumulation over a whole shard would be off by 3e-4.
      r.grad.mul_(at::exp(at::randn(r.grad.sizes(), gen) * 2));
      want_sq += r.grad.to(at::kDouble).pow(2).sum().item<double>();
      largest_grad = std::max(largest_grad, static_cast<int64_t>(r.grad.nbytes()));
    }
  }
  ASSERT_GE(largest_grad, int64_t{1} << 20);
  c10::Allocator* original = c10::GetCPUAllocator();
  static testing::CountingAllocator& counting = *new testing::CountingAllocator(original);
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  counting.reset_peak();
  const double got = sharded->grad_norm_tensor().item<double>();
  const int64_t largest_allocation = counting.largest();
  c10::SetCPUAllocator(original, /*priority=*/101);
  const double want = std::sqrt(want_sq);
  std::cout << "[grad norm] " << got << " vs fp64 " << want << " (relative " << std::abs(got - want) / want
            << "); largest allocation " << largest_allocation << " bytes, largest gradient " << largest_grad << "\n";
  EXPECT_NEAR(got, want, 1e-6 * want);
  // The per-row temporaries: (n / 4096) floats and doubles, far below a gradient.
  EXPECT_LT(largest_allocation, largest_grad / 64);
}

TEST(Engine, StrategyAndPrefetchNamesParse) {
  EXPECT_EQ(parse_sharding_strategy("grad-op"), ShardingStrategy::kShardGradOp);
  EXPECT_EQ(parse_sharding_strategy("HYBRID_SHARD"), ShardingStrategy::kHybridShard);
  EXPECT_THROW(parse_sharding_strategy("half"), UsageError);
  EXPECT_EQ(parse_backward_prefetch("post"), BackwardPrefetch::kPost);
  EXPECT_THROW(parse_backward_prefetch("later"), UsageError);
}

}  // namespace fsdp

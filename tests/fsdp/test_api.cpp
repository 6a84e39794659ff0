// FSDP2's API in fsdp-cpp beyond what the peer test compares numerically
// (tests/peers/api_parity.py): what is refused and how, what a handle or a
// summoned scope leaves readable, custom collectives' allocate calls, and the
// state dicts' strict loads. At 2 ranks, FULL_SHARD, the toy model.
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "fsdp/state_dict.h"
#include "parity.h"
#include "support/errors.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using testing::borrow;
namespace {

struct Sharded {
  nn::Unit<testing::ToyNetImpl> model{nullptr};
  std::shared_ptr<ShardedModel> sharded;
};

Sharded make(comm::ProcessGroup& pg, FsdpOptions o = {}) {
  Sharded s;
  s.model = testing::make_toy(testing::ToyConfig{}, /*meta=*/true, 3);
  o.init_rule = testing::toy_init_rule;
  o.seed = 3;
  s.sharded = fully_shard(s.model.ptr(), borrow(pg), o);
  return s;
}

// Expects f to throw a UsageError whose message holds every one of `parts`.
void expect_usage(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string m = testing::usage_error_of(f);
  for (const auto& p : parts) EXPECT_CONTAINS(m, p);
}

void step(Sharded& s) {
  s.model->forward(at::randn({4, 5}), at::randn({4, 3})).backward();
}

TEST(Api, UnknownUnitNamesAreRefusedListingTheUnits) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    Sharded s = make(pg);
    expect_usage([&] { s.sharded->set_reshard_after_forward(false, "blocks.9"); },
                                {"set_reshard_after_forward", "blocks.9", "'blocks.0'"});
    expect_usage([&] { s.sharded->unshard("layers.0"); }, {"unshard", "layers.0"});
    FsdpOptions o;
    UnitOverride ov{{"nope"}, {}, {}};
    ov.options.reshard_after_forward = ReshardAfterForward(false);
    o.unit_overrides = {ov};
    expect_usage([&] { make(pg, o); }, {"unit_overrides", "'nope'"});
    FsdpOptions g;
    g.reshard_after_forward = ReshardAfterForward::to_group(3);  // does not divide 2
    expect_usage([&] { make(pg, g); }, {"reshard_after_forward = 3", "divide"});
    FsdpOptions u;  // one unit's override: checked when the plan resolves it, in that unit's name
    UnitOverride one{{"blocks.0"}, {}, {}};
    one.options.reshard_after_forward = ReshardAfterForward::to_group(3);
    u.unit_overrides = {one};
    expect_usage([&] { make(pg, u); }, {"unit 'blocks.0': reshard_after_forward = 3", "divide the shard-group size 2"});
  });
}

TEST(Api, UnshardHandleAndReshardMakeParametersReadableAndNotAgain) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    Sharded s = make(pg);
    step(s);
    const at::Tensor w = s.model->impl().blocks[1]->impl().w1;
    EXPECT_THROW(w.sum().item<float>(), c10::Error);  // resharded: refuses with its name
    UnshardHandle h = s.sharded->unshard("blocks.1", /*async_op=*/true);
    h.wait();
    const at::Tensor full = s.sharded->gather_unit(2);  // entry 2: blocks.1 (root, blocks.0, blocks.1, ...)
    EXPECT_TRUE(at::equal(w.reshape({-1}), full.narrow(0, 0, w.numel()))) << "unsharded values are the shards'";
    step(s);  // the forward uses (and then frees) what the handle gathered
    EXPECT_THROW(w.sum().item<float>(), c10::Error);
    s.sharded->unshard("blocks.1");
    EXPECT_NO_THROW(w.sum().item<float>());
    s.sharded->reshard("blocks.1");
    EXPECT_THROW(w.sum().item<float>(), c10::Error);
  });
}

TEST(Api, SummonFullParamsWritesBackAndRefusesWritebackUnderMixedPrecision) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    Sharded s = make(pg);
    step(s);
    const at::Tensor before = s.sharded->gather_unit(1);
    {
      FullParams full = s.sharded->summon_full_params(/*writeback=*/true);
      at::NoGradGuard no_grad;
      s.model->impl().blocks[0]->impl().w1.mul_(2.0);
    }
    const at::Tensor after = s.sharded->gather_unit(1);
    const int64_t n = s.model->impl().blocks[0]->impl().w1.numel();
    EXPECT_TRUE(at::equal(after.narrow(0, 0, n), before.narrow(0, 0, n) * 2));
    EXPECT_TRUE(at::equal(after.narrow(0, n, after.numel() - n), before.narrow(0, n, before.numel() - n)));
    FsdpOptions bf16;
    bf16.mixed_precision = MixedPrecision::preset("bf16");
    Sharded b = make(pg, bf16);
    expect_usage([&] { b.sharded->summon_full_params(true); }, {"writeback", "mixed precision"});
  });
}

// Counts what the engine asks of a custom collective.
struct Counting : AllGatherComm, ReduceScatterComm {
  int64_t gathers = 0, scatters = 0, gather_buffers = 0, scatter_buffers = 0;
  at::Tensor allocate(int64_t numel, at::ScalarType dtype, at::Device device) override {
    return AllGatherComm::allocate(numel, dtype, device);
  }
  comm::WorkPtr operator()(const at::Tensor& out, const at::Tensor& in, comm::ProcessGroup& g) override {
    ++gathers;
    return g.all_gather(out, in);
  }
  comm::WorkPtr operator()(const at::Tensor& out, const at::Tensor& in, comm::ProcessGroup& g,
                           comm::ReduceOp op) override {
    ++scatters;
    return g.reduce_scatter(out, in, op);
  }
};
struct CountingGather : AllGatherComm {
  std::shared_ptr<Counting> c;
  at::Tensor allocate(int64_t n, at::ScalarType d, at::Device v) override {
    ++c->gather_buffers;
    return AllGatherComm::allocate(n, d, v);
  }
  comm::WorkPtr operator()(const at::Tensor& o, const at::Tensor& i, comm::ProcessGroup& g) override {
    return (*static_cast<AllGatherComm*>(c.get()))(o, i, g);
  }
};
struct CountingScatter : ReduceScatterComm {
  std::shared_ptr<Counting> c;
  at::Tensor allocate(int64_t n, at::ScalarType d, at::Device v) override {
    ++c->scatter_buffers;
    return ReduceScatterComm::allocate(n, d, v);
  }
  comm::WorkPtr operator()(const at::Tensor& o, const at::Tensor& i, comm::ProcessGroup& g, comm::ReduceOp op) override {
    return (*static_cast<ReduceScatterComm*>(c.get()))(o, i, g, op);
  }
};

TEST(Api, CustomCollectivesAllocateEveryBufferTheyFill) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    Sharded s = make(pg);
    auto counts = std::make_shared<Counting>();
    auto gather = std::make_shared<CountingGather>();
    gather->c = counts;
    auto scatter = std::make_shared<CountingScatter>();
    scatter->c = counts;
    s.sharded->set_custom_all_gather(gather, "blocks.1", /*recurse=*/false);
    s.sharded->set_custom_reduce_scatter(scatter, "blocks.1", /*recurse=*/false);
    step(s);
    // FULL_SHARD: gathered in forward and again in backward; one reduction with
    // its input copy and output from allocate.
    EXPECT_EQ(counts->gathers, 2);
    EXPECT_EQ(counts->gather_buffers, 2);
    EXPECT_EQ(counts->scatters, 1);
    EXPECT_EQ(counts->scatter_buffers, 2);
  });
}

TEST(Api, StrictStateDictLoadsRefuseMissingAndUnknownNames) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    Sharded s = make(pg);
    step(s);
    StateDictOptions full;
    full.full_state_dict = true;
    StateDict sd = get_model_state_dict(*s.sharded, full);
    StateDict extra = sd;
    extra.emplace_back("no.such", StateDictTensor{at::zeros({1}), {1}, 0, true});
    expect_usage([&] { set_model_state_dict(*s.sharded, extra, full); }, {"unexpected [no.such]"});
    StateDict missing(sd.begin() + 1, sd.end());
    expect_usage([&] { set_model_state_dict(*s.sharded, missing, full); },
                                {"missing [" + sd.front().first + "]"});
    // Round trip: what was got is what is set.
    const at::Tensor before = s.sharded->gather_unit(0);
    set_model_state_dict(*s.sharded, sd, full);
    EXPECT_TRUE(at::equal(before, s.sharded->gather_unit(0)));
  });
}

}  // namespace
}  // namespace fsdp

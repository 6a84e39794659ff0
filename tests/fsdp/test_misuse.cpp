// Misuse of a sharded model gets a clear error, never a crash, and leaves the
// model usable where the contract in fsdp.h says so: touching a resharded
// parameter, a second forward before backward, evaluation while a graph awaits
// backward, create_graph, a second backward through one graph, a graph that
// outlives its ShardedModel, a unit called on its own, a forward that throws.
// One process; bf16 compute, so that FULL_SHARD frees unsharded parameters
// even with one rank (Note [One-rank shard groups]).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/error.h"
#include "fsdp/common/internals.h"
#include "fsdp/fsdp.h"
#include "toy_models.h"

namespace fsdp {
namespace {

using testing::ToyConfig;

comm::ProcessGroupPtr single_process_group() {
  static comm::Runtime rt = comm::init_process_group(comm::WorldInfo{});
  return rt.world_group;
}

// Runs `fn`, which must throw `E` whose message contains `needle`.
template <class E>
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected another exception type; got: " << e.what();
    return;
  }
  ADD_FAILURE() << "no exception; expected one saying '" << needle << "'";
}

struct Fixture {
  ToyConfig c;
  nn::Unit<testing::ToyNetImpl> model = testing::make_toy(c, false, 3);
  std::shared_ptr<ShardedModel> sharded;
  at::Tensor x = torch::randn({4, c.d_in});
  at::Tensor y = torch::randn({4, c.d_out});

  Fixture() {
    FsdpOptions o;
    o.strategy = ShardingStrategy::kFullShard;
    o.mixed_precision.param_dtype = at::kBFloat16;
    sharded = fully_shard(model.ptr(), single_process_group(), o);
  }
  at::Tensor loss() { return model->forward(x, y); }
  // A whole step's gradients; the model must be usable for it.
  void step() {
    loss().backward();
    EXPECT_EQ(sharded->unsharded_memory().now.total(), 0) << "a step left unsharded buffers behind";
  }
};

TEST(Misuse, TouchingAReshardedParameterThrowsNamingIt) {
  Fixture f;
  f.step();
  const at::Tensor w1 = f.model->impl().blocks[0]->impl().w1;
  EXPECT_FALSE(internals::storage_allocated(w1));
  // Before the fix, LibTorch's kernels read the freed bytes through a null
  // pointer (a segfault); now the read is refused with the parameter's name.
  expect_error<c10::Error>([&] { (void)w1.sum().item<float>(); }, "parameter 'blocks.0.w1' is resharded");
  expect_error<c10::Error>([&] { (void)w1.data_ptr(); }, "gather_unit");
  EXPECT_EQ(f.sharded->gather_unit(1).numel(), f.sharded->units()[1].numel);
  f.step();
}

TEST(Misuse, SecondForwardBeforeBackwardIsAUsageError) {
  Fixture f;
  at::Tensor first = f.loss();
  expect_error<UsageError>([&] { (void)f.loss(); }, "one forward per backward");
  first.backward();  // the first iteration goes on
  EXPECT_EQ(f.sharded->unsharded_memory().now.total(), 0);
  f.step();
}

TEST(Misuse, EvaluationWhileAGraphAwaitsBackwardIsAUsageError) {
  Fixture f;
  at::Tensor first = f.loss();
  expect_error<UsageError>(
      [&] {
        at::NoGradGuard no_grad;
        (void)f.loss();
      },
      "awaits backward");
  first.backward();
  at::NoGradGuard no_grad;
  EXPECT_TRUE(f.loss().defined());  // evaluation between steps is fine
}

TEST(Misuse, DroppingTheGraphEndsTheIteration) {
  Fixture f;
  {
    at::Tensor discarded = f.loss();
    EXPECT_GT(f.sharded->unsharded_memory().now.params, 0);  // the root stays gathered for backward
  }
  // Note [Graph lifetime]: the graph's destruction released the root.
  EXPECT_EQ(f.sharded->unsharded_memory().now.total(), 0);
  f.step();
}

TEST(Misuse, CreateGraphIsAUsageError) {
  Fixture f;
  {
    at::Tensor l = f.loss();
    expect_error<UsageError>([&] { l.backward({}, /*retain_graph=*/true, /*create_graph=*/true); }, "create_graph");
  }
  f.step();
}

TEST(Misuse, SecondBackwardThroughOneGraphIsAUsageError) {
  Fixture f;
  at::Tensor l = f.loss();
  l.backward({}, /*retain_graph=*/true);
  expect_error<UsageError>([&] { l.backward(); }, "one backward per forward");
  f.step();
}

TEST(Misuse, GraphOutlivingItsModelIsAUsageError) {
  Fixture f;
  at::Tensor l = f.loss();
  f.sharded.reset();  // the ShardedModel goes; the graph and the module stay
  expect_error<UsageError>([&] { l.backward(); }, "ShardedModel was destroyed");
}

TEST(Misuse, AUnitCalledOutsideTheRootsForwardIsAUsageError) {
  Fixture f;
  expect_error<UsageError>([&] { (void)f.model->impl().blocks[0](torch::randn({4, f.c.d})); },
                           "outside its model's forward");
  f.step();
}

TEST(Misuse, AForwardThatThrowsLeavesTheModelUsable) {
  Fixture f;
  const at::Tensor wrong = torch::randn({4, f.c.d_in + 1});
  EXPECT_THROW((void)f.model->forward(wrong, f.y), c10::Error);
  EXPECT_EQ(f.sharded->unsharded_memory().now.total(), 0);
  f.step();
}

TEST(Misuse, StepApiBetweenForwardAndBackwardIsRefusedOnlyWhereUnsafe) {
  Fixture f;
  at::Tensor l = f.loss();
  f.sharded->zero_grad();  // allowed: PyTorch users call it before or after forward
  l.backward();
  EXPECT_GE(f.sharded->grad_norm(), 0.0);
}

}  // namespace
}  // namespace fsdp

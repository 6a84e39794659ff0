// A small sharded model with a non-AdamW optimizer for checkpoint tests: the
// MLP of the FSDP tutorial (a non-Llama family) trained with SGD momentum.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>

#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/state.h"
#include "fsdp/models/mlp.h"
#include "fsdp/optim/sgd.h"

namespace fsdp::testing {

inline const models::MlpConfig kMlp{13, 3};  // 3 x (169 + 13) = 546 parameters: padded at 2 and 3 ranks

struct ShardedMlp {
  std::shared_ptr<nn::UnitImpl<models::MlpImpl>> root;
  std::shared_ptr<ShardedModel> sharded;
  std::unique_ptr<optim::SgdMomentum> opt;
  // The MLP family's configuration, as its checkpoint metadata.
  MetadataState model{checkpoint::kModelKey, {{"family", "mlp"}, {"config", {{"width", kMlp.width}, {"layers", kMlp.layers}}}}};

  // Loss of a forward+backward+step on this rank's rows of a fixed global batch of 6.
  double step(int64_t s, int world, int rank) {
    at::Tensor x = at::sin(at::arange(6 * kMlp.width, at::kFloat).reshape({6, kMlp.width}) * (0.37 + 0.01 * s));
    at::Tensor y = at::cos(x * 1.3);
    const int64_t rows = 6 / world;
    x = x.narrow(0, rank * rows, rows);
    y = y.narrow(0, rank * rows, rows);
    sharded->zero_grad();
    at::Tensor loss = (root->forward(x) - y).pow(2).mean();  // MlpImpl::loss, through the root unit
    loss.backward();
    opt->step();
    // The mean over the global batch (every rank's rows have the same count).
    at::Tensor l = loss.detach().to(at::kDouble).reshape({1});
    if (world > 1) sharded->shard_group()->all_reduce(l, comm::ReduceOp::kSum)->wait();
    return l.item<double>() / world;
  }
};

inline ShardedMlp make_mlp(comm::ProcessGroup& pg, uint64_t seed) {
  ShardedMlp m;
  auto impl = std::make_shared<models::MlpImpl>(kMlp, at::TensorOptions().device(at::kMeta), seed);
  m.root = std::make_shared<nn::UnitImpl<models::MlpImpl>>(impl);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::kFullShard;
  fo.wrap = WrapPolicy::by_type({models::mlp_block_type()});
  fo.init_rule = models::mlp_init_rule(kMlp);
  fo.seed = seed;
  m.sharded = fully_shard(m.root, comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {}), fo);
  m.opt = std::make_unique<optim::SgdMomentum>(optim::SgdOptions{0.05, 0.9, 0.01});
  m.opt->add_shards(m.sharded->shards());
  return m;
}

}  // namespace fsdp::testing

// The engine over c10d's ProcessGroupGloo (fsdp/comm/c10d.h) against the same
// engine over our TCP group: the same seeded small model trained 20 steps with
// AdamW (clipped) on the same per-rank batches, once per backend, each rank
// recording its losses and its trained shards. Then, in the parent:
//  - gloo (the adapter's rank-order reductions): the TCP run's bits, every
//    loss and every shard;
//  - gloo-native (Gloo's own reduce_scatter and allreduce, its ring's
//    summation order): every loss within 1e-6 relative, and every shard
//    within 1e-6 of the TCP run's, relative to the shard's largest value.
// For FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, hpZ (reshard_after_forward to
// a group of 2) and the compressed wires (bf16 and int8 gathers and
// reduce-scatters, which run on the adapter's all_to_all).
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "fsdp/nn/unit.h"
#include "fsdp/optim/adamw.h"
#include "parity.h"
#include "support/multiproc.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <fstream>

namespace fsdp {
namespace {

using testing::borrow;
using testing::run_distributed;

constexpr int kSteps = 20;
const char* const kBackends[] = {"tcp", "gloo", "gloo-native"};

struct Run {
  std::vector<double> losses;  // mean over the ranks, every step
  std::vector<at::Tensor> shards;  // this rank's trained shards, unit order
};

// A residual MLP with LibTorch's default initialization (a loss of order 1, so
// that 20 steps of AdamW stay in the smooth regime where summation order
// moves results by rounding only); odd sizes: padding, and int8 blocks that
// end inside a shard.
constexpr int64_t kIn = 9, kWidth = 45, kOut = 5;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(kWidth, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : proj_in(register_module("proj_in", torch::nn::Linear(kIn, kWidth))),
        proj_out(register_module("proj_out", torch::nn::Linear(kWidth, kOut))) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(nn::make_unit<BlockImpl>());
      list->push_back(blocks.back().ptr());
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {  // x (B, kIn), y (B, kOut)
    auto h = proj_in(x);
    for (auto& b : blocks) h = b(h);
    return torch::mse_loss(proj_out(h), y);
  }
  torch::nn::Linear proj_in, proj_out;
  std::vector<nn::Unit<BlockImpl>> blocks;
};

Run train(comm::ProcessGroup& pg, const FsdpOptions& options) {
  torch::manual_seed(11);  // the same model on every rank and backend
  auto model = nn::make_unit<NetImpl>();
  auto sharded = fully_shard(model.ptr(), borrow(pg), options);
  optim::AdamW opt({/*lr=*/1e-2});
  opt.add_shards(sharded->shards());
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    at::Generator gen = at::detail::createCPUGenerator(1000 * step + pg.rank());
    const at::Tensor x = at::randn({4, kIn}, gen);
    const at::Tensor y = x.narrow(1, 0, kOut).sin();
    at::Tensor loss = model->forward(x, y);
    loss.backward();
    sharded->clip_grad_norm(1.0);
    opt.step();
    sharded->zero_grad();
    const at::Tensor mean = loss.detach().to(at::kDouble).reshape({1}).clone();
    pg.all_reduce(mean, comm::ReduceOp::kAvg)->wait();
    run.losses.push_back(mean.item<double>());
  }
  for (const auto& s : sharded->shards()) run.shards.push_back(s.param.to(at::kDouble).clone());
  return run;
}

std::string path_of(const std::string& dir, const std::string& backend, int rank) {
  return dir + "/" + backend + "-rank" + std::to_string(rank) + ".bin";
}

// Losses, then each shard's size and values, as doubles.
void save(const Run& run, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](double v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); };
  for (double l : run.losses) put(l);
  put(static_cast<double>(run.shards.size()));
  for (const auto& s : run.shards) {
    put(static_cast<double>(s.numel()));
    out.write(static_cast<const char*>(s.data_ptr()), static_cast<std::streamsize>(s.numel() * sizeof(double)));
  }
  ASSERT_TRUE(out.good()) << "writing " << path;
}

Run load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  auto get = [&] {
    double v = 0;
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    return v;
  };
  Run run;
  for (int s = 0; s < kSteps; ++s) run.losses.push_back(get());
  const auto units = static_cast<int64_t>(get());
  for (int64_t u = 0; u < units && in; ++u) {
    const auto n = static_cast<int64_t>(get());
    at::Tensor t = at::empty({n}, at::kDouble);
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n * sizeof(double)));
    run.shards.push_back(t);
  }
  EXPECT_TRUE(in.good()) << "reading " << path;
  return run;
}

// Trains on each backend at `world` ranks, then compares every rank's runs (parent only).
void compare_backends(int world, const FsdpOptions& options) {
  const std::string dir = testing::temp_dir("runs");
  for (const char* backend : kBackends) {
    run_distributed(
        world,
        [&](comm::ProcessGroup& pg) {
          EXPECT_EQ(pg.backend(), std::string(backend) == "tcp" ? "tcp" : "c10d-gloo");
          save(train(pg, options), path_of(dir, backend, pg.rank()));
        },
        std::chrono::seconds(120), {{"FSDP_TEST_BACKEND", backend}});
  }
  if (testing::is_worker()) return;
  for (int r = 0; r < world; ++r) {
    const Run tcp = load(path_of(dir, "tcp", r));
    const Run gloo = load(path_of(dir, "gloo", r));
    const Run native = load(path_of(dir, "gloo-native", r));
    ASSERT_EQ(tcp.shards.size(), gloo.shards.size());
    ASSERT_EQ(tcp.shards.size(), native.shards.size());
    double worst_loss = 0, worst_param = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(gloo.losses[s], tcp.losses[s]) << "rank " << r << " step " << s << ": gloo (rank order) vs tcp";
      const double rel = std::abs(native.losses[s] - tcp.losses[s]) / std::abs(tcp.losses[s]);
      worst_loss = std::max(worst_loss, rel);
      EXPECT_LE(rel, 1e-6) << "rank " << r << " step " << s << ": gloo-native loss " << native.losses[s]
                           << " vs tcp " << tcp.losses[s];
    }
    for (size_t u = 0; u < tcp.shards.size(); ++u) {
      EXPECT_TRUE(gloo.shards[u].equal(tcp.shards[u])) << "rank " << r << " unit " << u << ": gloo vs tcp";
      const double scale = std::max(1e-30, tcp.shards[u].abs().max().item<double>());
      const double rel = (native.shards[u] - tcp.shards[u]).abs().max().item<double>() / scale;
      worst_param = std::max(worst_param, rel);
      EXPECT_LE(rel, 1e-6) << "rank " << r << " unit " << u << ": gloo-native shard vs tcp";
    }
    std::cout << "[c10d parity] W=" << world << " rank " << r << ": gloo == tcp; gloo-native worst loss rel "
              << worst_loss << ", worst shard rel " << worst_param << "\n";
  }
}

FsdpOptions strategy(ShardingStrategy s) {
  FsdpOptions o;
  o.strategy = s;
  return o;
}

}  // namespace

TEST(C10dParity, FullShardOverGlooMatchesTcp) {
  compare_backends(2, strategy(ShardingStrategy::kFullShard));
  compare_backends(4, strategy(ShardingStrategy::kFullShard));
}

TEST(C10dParity, ShardGradOpOverGlooMatchesTcp) { compare_backends(3, strategy(ShardingStrategy::kShardGradOp)); }

TEST(C10dParity, HybridOverGlooMatchesTcp) {
  FsdpOptions o = strategy(ShardingStrategy::kHybridShard);
  o.hybrid_shard_size = 2;  // 2 shard groups x 2 replicas: Gloo sub-groups
  compare_backends(4, o);
}

TEST(C10dParity, HpzOverGlooMatchesTcp) {
  FsdpOptions o = strategy(ShardingStrategy::kFullShard);
  o.reshard_after_forward = ReshardAfterForward::to_group(2);  // backward gathers within pairs
  compare_backends(4, o);
}

TEST(C10dParity, CompressedWiresOverGlooMatchTcp) {
  FsdpOptions o = strategy(ShardingStrategy::kFullShard);
  o.compression.all_gather = WireFormat::kBf16;
  o.compression.reduce_scatter = WireFormat::kInt8;
  o.compression.block_size = 64;
  compare_backends(2, o);
  o.compression.all_gather = WireFormat::kInt8;
  o.compression.reduce_scatter = WireFormat::kBf16;
  compare_backends(3, o);
}

}  // namespace fsdp

// A program that already does data parallelism with PyTorch's own c10d — a TCPStore and a
// ProcessGroupGloo it built itself, the way a LibTorch user hand-rolls DDP — shards a model with that
// same backend: no second set of connections, no second rendezvous, one timeout.
//
//   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./c10d_backend &   # one per process
//   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./c10d_backend
//   torchrun --no-python --standalone --nproc-per-node 2 ./c10d_backend --steps 6
//   ./c10d_backend                                                                   # one process
//
// Flags: --steps N (default 8), --hybrid (HYBRID_SHARD over pairs of ranks: sub-groups made from the
// store), --lanes 2 (a second ProcessGroupGloo for the reduce lane, so gathers and reductions need not
// interleave alike on every rank). Prints "step N loss X grad_norm Y" per step on rank 0.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // needs Gloo's headers: see README.md
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fsdp/c10d.h"
#include "fsdp/optim/adamw.h"

namespace {

constexpr int64_t kIn = 16, kWidth = 32, kBlocks = 3;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(kWidth, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};

struct NetImpl : torch::nn::Module {  // x (B, kIn) -> a scalar loss against y (B, 1)
  NetImpl()
      : proj_in(register_module("proj_in", torch::nn::Linear(kIn, kWidth))),
        proj_out(register_module("proj_out", torch::nn::Linear(kWidth, 1))) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < kBlocks; ++i) {
      blocks.push_back(fsdp::nn::make_unit<BlockImpl>());  // a shard boundary
      list->push_back(blocks.back().ptr());
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = proj_in(x);
    for (auto& b : blocks) h = b(h);
    return torch::mse_loss(proj_out(h), y);
  }
  torch::nn::Linear proj_in, proj_out;
  std::vector<fsdp::nn::Unit<BlockImpl>> blocks;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 8, lanes = 1;
  bool hybrid = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--lanes") && i + 1 < argc) {
      lanes = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--hybrid")) {
      hybrid = true;
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--hybrid] [--lanes 1|2]\n", argv[0]);
      return 2;
    }
  }
  // ---- The program's own c10d setup, as PyTorch's env:// rendezvous does it.
  const int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env_int("MASTER_PORT", 29500));
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");  // torchrun hosts the store itself
  so.isServer = rank == 0 && !(agent && std::string(agent) == "True");
  so.numWorkers = world;
  const char* addr = std::getenv("MASTER_ADDR");
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(addr ? addr : "127.0.0.1", so);
  store = c10::make_intrusive<c10d::PrefixStore>("my-program", store);
  auto gloo = [&](const c10::intrusive_ptr<c10d::Store>& s, int r, int n) {
    auto o = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
    o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::make_intrusive<c10d::ProcessGroupGloo>(s, r, n, o);
  };
  c10::intrusive_ptr<c10d::Backend> pg = gloo(c10::make_intrusive<c10d::PrefixStore>("pg", store), rank, world);

  // What such a program already does with it: agree on a seed by hand.
  std::vector<at::Tensor> seed{torch::full({1}, rank == 0 ? 1234 : 0, torch::kLong)};
  pg->broadcast(seed)->wait();
  torch::manual_seed(seed[0].item<int64_t>());

  // ---- The same backend shards the model.
  fsdp::comm::C10dGroupOptions g;
  g.store = store;  // HYBRID's shard and replicate groups are made under it
  g.timeout = std::chrono::seconds(60);
  g.make_subgroup = [&](const c10::intrusive_ptr<c10d::Store>& s, const std::vector<int>& ranks, int r,
                        std::chrono::milliseconds) { return gloo(s, r, static_cast<int>(ranks.size())); };
  if (lanes == 2) g.reduce_backend = gloo(c10::make_intrusive<c10d::PrefixStore>("pg-reduce", store), rank, world);
  fsdp::FsdpOptions options;
  if (hybrid) {
    options.strategy = fsdp::ShardingStrategy::kHybridShard;
    options.hybrid_shard_size = world % 2 == 0 ? 2 : 1;
  }
  auto model = fsdp::nn::make_unit<NetImpl>();  // same seed on every rank: the same model
  auto sharded = fsdp::fully_shard(model.ptr(), pg, options, g);
  if (rank == 0) {
    std::printf("process group: %s (%s), %d processes, %s\n", sharded->shard_group()->backend().c_str(),
                sharded->shard_group()->transport().c_str(), world, fsdp::to_string(options.strategy));
  }
  fsdp::optim::AdamW opt({/*lr=*/1e-2});
  opt.add_shards(sharded->shards());

  // Every rank takes its slice of the same global batch of 16: the losses are the same at any world size.
  const int64_t per_rank = 16 / world;
  for (int step = 1; step <= steps; ++step) {
    torch::manual_seed(100 + step);
    const auto x = torch::randn({16, kIn}), y = x.sum(1, true).sin();
    auto loss = model->forward(x.narrow(0, rank * per_rank, per_rank), y.narrow(0, rank * per_rank, per_rank));
    loss.backward();
    const double norm = sharded->clip_grad_norm(1.0);
    opt.step();
    sharded->zero_grad();
    std::vector<at::Tensor> mean{loss.detach().reshape({1}) / world};
    pg->allreduce(mean)->wait();  // the program's own all-reduce, between the engine's collectives
    if (rank == 0) std::printf("step %d loss %.6f grad_norm %.6f\n", step, mean[0].item<double>(), norm);
  }
  pg->barrier()->wait();
  return 0;
}

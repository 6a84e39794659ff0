// A vision transformer with DeepViT blocks (re-attention: Zhou et al. 2021, arXiv:2103.11886),
// trained with fsdp-cpp on generated images: each image is noise with one bright square, and the
// class is the quadrant the square is in. Every block is its own FSDP unit; --precision and
// --activation-checkpointing switch on mixed precision and recomputation.
//
//   vit --steps 20                        one process
//   vit --steps 20 --nproc-per-node 2     two processes, started by the library's launcher
//   torchrun --no-python --standalone --nproc-per-node 2 ./vit --steps 20
//
// Every process builds the same model (same seed) and generates the same global batch of each
// step; rank r trains on its slice. The losses printed are the global batch's, so a run on any
// number of processes prints the same numbers (fp32: up to summation order).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <typeindex>

#include "fsdp/all.h"

namespace {

struct VitConfig {
  int64_t image = 16;    // images are (C, image, image)
  int64_t channels = 3;  // C
  int64_t patch = 4;     // P: (image / P)^2 patches of P*P*C values
  int64_t dim = 64;      // D
  int64_t depth = 4;     // blocks
  int64_t heads = 4;     // H
  int64_t head_dim = 16; // Dh
  int64_t mlp_dim = 128;
  int64_t classes = 4;
  int64_t patches() const { return (image / patch) * (image / patch); }  // N
};

// Re-attention (DeepViT): the heads' attention maps are mixed by a learned H x H matrix and
// normalized across heads before they weigh the values; it keeps deep stacks from collapsing to
// identical maps.
struct ReAttentionImpl : torch::nn::Module {
  explicit ReAttentionImpl(const VitConfig& c)
      : heads(c.heads), head_dim(c.head_dim),
        qkv(register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(c.dim, 3 * c.heads * c.head_dim).bias(false)))),
        reattn(register_parameter("reattn", torch::randn({c.heads, c.heads}))),
        reattn_norm(register_module("reattn_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.heads})))),
        out(register_module("out", torch::nn::Linear(c.heads * c.head_dim, c.dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {  // (B, N+1, D)
    const int64_t B = x.size(0), T = x.size(1);
    auto qkv_ = qkv(x).view({B, T, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
    auto q = qkv_[0], k = qkv_[1], v = qkv_[2];
    auto attn = torch::softmax(q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim)), -1);
    attn = torch::einsum("bhij,hg->bgij", {attn, reattn});                // mix the heads' maps
    attn = reattn_norm(attn.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});  // normalize across heads
    auto y = attn.matmul(v).transpose(1, 2).reshape({B, T, heads * head_dim});
    return out(y);
  }

  int64_t heads, head_dim;
  torch::nn::Linear qkv;
  torch::Tensor reattn;  // (H, H)
  torch::nn::LayerNorm reattn_norm;
  torch::nn::Linear out;
};
TORCH_MODULE(ReAttention);

// One DeepViT block: pre-norm re-attention and pre-norm MLP, each with a residual.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const VitConfig& c)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        attn(register_module("attn", ReAttention(c))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        fc1(register_module("fc1", torch::nn::Linear(c.dim, c.mlp_dim))),
        fc2(register_module("fc2", torch::nn::Linear(c.mlp_dim, c.dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attn(norm1(x));
    return h + fc2(torch::gelu(fc1(norm2(h))));
  }

  torch::nn::LayerNorm norm1;
  ReAttention attn;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear fc1, fc2;
};

// The whole model; its forward returns the loss, so that the root unit runs it all.
struct VitImpl : torch::nn::Module {
  explicit VitImpl(const VitConfig& c)
      : cfg(c),
        patch_embed(register_module("patch_embed", torch::nn::Linear(c.patch * c.patch * c.channels, c.dim))),
        cls_token(register_parameter("cls_token", torch::randn({1, 1, c.dim}))),
        pos_embed(register_parameter("pos_embed", torch::randn({1, c.patches() + 1, c.dim}))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})))),
        head(register_module("head", torch::nn::Linear(c.dim, c.classes))) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.depth; ++i) {
      blocks.push_back(fsdp::nn::make_unit<BlockImpl>(c));
      list->push_back(blocks.back().ptr());
    }
  }

  // images (B, C, S, S) float, labels (B) int64 -> mean cross-entropy (fp32).
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& labels) {
    const int64_t B = images.size(0), P = cfg.patch;
    // (B, C, S, S) -> (B, N, P*P*C), in the parameters' dtype (bf16 under mixed precision).
    auto patches = images.unfold(2, P, P).unfold(3, P, P)       // (B, C, S/P, S/P, P, P)
                       .permute({0, 2, 3, 4, 5, 1})
                       .reshape({B, cfg.patches(), P * P * cfg.channels})
                       .to(patch_embed->weight.scalar_type());
    auto x = torch::cat({cls_token.expand({B, 1, cfg.dim}), patch_embed(patches)}, 1) + pos_embed;
    for (auto& block : blocks) x = block(x);  // each block gathers its parameters as it runs
    auto logits = head(norm(x.select(1, 0))).to(torch::kFloat);
    return torch::cross_entropy_loss(logits, labels);
  }

  VitConfig cfg;
  torch::nn::Linear patch_embed;
  torch::Tensor cls_token;  // (1, 1, D)
  torch::Tensor pos_embed;  // (1, N+1, D)
  std::vector<fsdp::nn::Unit<BlockImpl>> blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};

// The global batch of `step`: the same on every process, whatever the world size.
std::pair<torch::Tensor, torch::Tensor> make_batch(const VitConfig& c, int64_t batch, uint64_t seed, int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + static_cast<uint64_t>(step));
  auto labels = torch::randint(c.classes, {batch}, gen, torch::kLong);
  auto images = torch::randn({batch, c.channels, c.image, c.image}, gen) * 0.5;
  const int64_t half = c.image / 2, side = c.image / 4;
  auto offsets = torch::randint(half - side + 1, {batch, 2}, gen, torch::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q = labels[b].item<int64_t>();
    const int64_t row = (q / 2) * half + offsets[b][0].item<int64_t>();
    const int64_t col = (q % 2) * half + offsets[b][1].item<int64_t>();
    images[b].narrow(1, row, side).narrow(2, col, side) += 2.0;
  }
  return {images, labels};
}

struct Flags {
  int nproc = 1;
  int64_t steps = 20;
  int64_t batch = 32;  // global: split over the processes
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string precision = "fp32";
  bool activation_checkpointing = false;
  std::string device = "cpu";
};

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"A DeepViT-style vision transformer trained with fsdp-cpp on generated images."};
  app.add_option("--nproc-per-node", f.nproc, "Processes to start on this machine (ignored under torchrun)");
  app.add_option("--steps", f.steps, "Optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", f.batch, "Global batch (images per step over all processes)")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "AdamW learning rate");
  app.add_option("--seed", f.seed, "Seed of the model and the data");
  app.add_option("--precision", f.precision, "fp32 | bf16 (bf16 compute, fp32 reductions and master weights) | bf16-pure");
  app.add_flag("--activation-checkpointing", f.activation_checkpointing, "Recompute each block in backward");
  app.add_option("--device", f.device, "cpu | cuda (one GPU per process, NCCL)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    throw fsdp::UsageError(std::string(e.what()) + " (see vit --help)");
  }

  FSDP_CHECK(f.precision != "fp16", "--precision fp16 needs a gradient scaler, which this example does not use — "
             "use bf16");
  // Under torchrun (or Slurm, a PyTorchJob) a worker; on its own with --nproc-per-node 2, the
  // launcher of two workers running this same program.
  fsdp::comm::Job job = fsdp::comm::start_job("vit", argc, argv, f.nproc, f.device);
  if (job.launched) return *job.launched;
  const fsdp::comm::Runtime& rt = job.runtime;
  fsdp::FsdpOptions options;
  options.device = job.device;
  const int rank = rt.world.rank, world_size = rt.world.world_size;
  FSDP_CHECK(f.batch % world_size == 0, "--batch ", f.batch, " must be a multiple of the number of processes ",
             world_size, " (every process trains on an equal slice)");

  const VitConfig cfg;
  torch::manual_seed(f.seed);  // the same initial model on every process
  auto model = fsdp::nn::make_unit<VitImpl>(cfg);
  options.wrap = fsdp::WrapPolicy::by_type({std::type_index(typeid(BlockImpl))});  // one unit per block
  options.mixed_precision = fsdp::MixedPrecision::preset(f.precision);
  if (f.activation_checkpointing) options.checkpoint_types = {std::type_index(typeid(BlockImpl))};
  auto sharded = fsdp::fully_shard(model.ptr(), rt.world_group, options);
  fsdp::optim::AdamWOptions adamw;
  adamw.lr = f.lr;
  if (options.mixed_precision.master_dtype == at::kBFloat16) adamw.kahan_summation = true;
  fsdp::optim::AdamW opt(adamw);
  opt.add_shards(sharded->shards());
  // Host-side sums (the loss, the accuracy) go over the CPU group when the world group is NCCL's.
  const fsdp::comm::ProcessGroupPtr& host_group = rt.cpu_group ? rt.cpu_group : rt.world_group;
  int64_t checkpointed = 0;
  for (const fsdp::UnitInfo& u : sharded->units()) checkpointed += u.checkpointed ? 1 : 0;
  if (rank == 0)
    std::printf("vit: %d process(es), %lld units (%lld checkpointed), precision %s\n", world_size,
                static_cast<long long>(fsdp::count_units(sharded->units())), static_cast<long long>(checkpointed),
                f.precision.c_str());

  const int64_t local = f.batch / world_size;
  for (int64_t step = 0; step < f.steps; ++step) {
    auto [images, labels] = make_batch(cfg, f.batch, f.seed, step);
    images = images.narrow(0, rank * local, local).to(options.device);
    labels = labels.narrow(0, rank * local, local).to(options.device);
    torch::Tensor loss = model(images, labels);
    loss.backward();
    const double norm = sharded->clip_grad_norm(1.0);
    opt.step();
    sharded->zero_grad();
    // Each process's loss is its slice's mean; their mean is the global batch's.
    at::Tensor global = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
    host_group->all_reduce(global, fsdp::comm::ReduceOp::kSum)->wait();
    if (rank == 0)
      std::printf("step %lld loss %.9g grad_norm %.9g\n", static_cast<long long>(step + 1),
                  global.item<double>() / world_size, norm);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("vit", [&] { return run(argc, argv); }); }

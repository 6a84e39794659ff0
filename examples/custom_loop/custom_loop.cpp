// Your own training loop around fsdp-cpp's pieces: a model of your own with one unit per block,
// the sharded AdamW with a warmup-cosine schedule, gradient accumulation without communication
// until the last micro-batch, gradient clipping, sharded checkpoints saved and resumed (at any
// number of processes), and the full state dict exported as one safetensors file.
//
//   custom_loop --steps 12 --checkpoint-dir ckpt --stop-after 6             # steps 1..6, saved
//   custom_loop --steps 12 --checkpoint-dir ckpt --resume --nproc-per-node 2 --export model.safetensors
//                                                          # steps 7..12 on 2 processes, then exported
//   torchrun --no-python --standalone --nproc-per-node 2 ./custom_loop --steps 6
//
// The task: regress the output of a fixed random "teacher" network. Every process builds the same
// student (same seed) and generates the same global batch of each step, so the losses printed, the
// checkpoints and the export are the same at any number of processes (up to summation order).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <typeindex>

#include <nlohmann/json.hpp>

#include "fsdp/all.h"

namespace {

constexpr int64_t kIn = 32;      // input features
constexpr int64_t kWidth = 64;   // W
constexpr int64_t kBlocks = 4;

// A residual block: x + fc2(gelu(fc1(norm(x)))).
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))),
        fc1(register_module("fc1", torch::nn::Linear(kWidth, 4 * kWidth))),
        fc2(register_module("fc2", torch::nn::Linear(4 * kWidth, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};

// The student: input projection, blocks, output; the forward returns the mean squared error.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : proj_in(register_module("proj_in", torch::nn::Linear(kIn, kWidth))),
        proj_out(register_module("proj_out", torch::nn::Linear(kWidth, 1))) {
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < kBlocks; ++i) {
      blocks.push_back(fsdp::nn::make_unit<BlockImpl>());
      list->push_back(blocks.back().ptr());
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {  // x (B, kIn), y (B, 1)
    auto h = proj_in(x);
    for (auto& block : blocks) h = block(h);
    return torch::mse_loss(proj_out(h), y);
  }
  torch::nn::Linear proj_in;
  std::vector<fsdp::nn::Unit<BlockImpl>> blocks;
  torch::nn::Linear proj_out;
};

// The global batch of `step`, the same on every process: x ~ N(0, 1), y = the teacher's output.
std::pair<torch::Tensor, torch::Tensor> make_batch(int64_t batch, uint64_t seed, int64_t step) {
  auto teacher = at::make_generator<at::CPUGeneratorImpl>(seed + 7);
  const auto w1 = torch::randn({kIn, 16}, teacher) / std::sqrt(static_cast<double>(kIn));
  const auto w2 = torch::randn({16, 1}, teacher) / 4.0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + static_cast<uint64_t>(step));
  auto x = torch::randn({batch, kIn}, gen);
  return {x, torch::tanh(x.matmul(w1)).matmul(w2)};
}

// The full state dict: every parameter by name, whole, in fp32, as PyTorch's FULL_STATE_DICT with
// rank0_only. Each unit is gathered in turn (collective: every process calls it), so no process
// holds more than one unit's full parameters beside what rank 0 collects.
std::vector<std::pair<std::string, at::Tensor>> full_state_dict(fsdp::ShardedModel& sharded, bool keep) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& units = sharded.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const at::Tensor flat = sharded.gather_unit(u);  // (numel) unpadded, master dtype
    if (!keep) continue;
    for (const fsdp::ParamPlacement& p : units[u].params)
      out.emplace_back(p.name, flat.narrow(0, p.flat_offset, p.numel).view(p.shape).to(at::kFloat).clone());
  }
  return out;
}

struct Flags {
  int nproc = 1;
  int64_t steps = 6;
  int64_t batch = 32;       // global batch: over all processes and micro-batches
  int64_t grad_accum = 2;   // micro-batches per step
  double lr = 3e-3;
  int64_t warmup = 2;
  double clip = 1.0;
  uint64_t seed = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool resume = false;
  std::string export_path;
  int64_t stop_after = 0;
};

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"A training loop of your own with fsdp-cpp's sharded optimizer, checkpoints and export."};
  app.add_option("--nproc-per-node", f.nproc, "Processes to start on this machine (ignored under torchrun)");
  app.add_option("--steps", f.steps, "Train until this many optimizer steps are done")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "Global batch per step (over processes and micro-batches)")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad-accum", f.grad_accum, "Micro-batches per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "Peak learning rate (linear warmup, cosine decay to lr/10 at --steps)");
  app.add_option("--warmup", f.warmup, "Warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", f.clip, "Clip the global gradient norm to this")->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed, "Seed of the model and the data");
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "Save sharded checkpoints here");
  app.add_option("--checkpoint-every", f.checkpoint_every, "Save every N steps (and after the last one)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", f.resume, "Continue from the newest checkpoint in --checkpoint-dir");
  app.add_option("--stop-after", f.stop_after,
                 "Stop after this step as if interrupted (a checkpoint is saved with --checkpoint-dir); "
                 "--resume continues")
      ->check(CLI::PositiveNumber);
  app.add_option("--export", f.export_path, "After training, write the full state dict here (.safetensors)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    throw fsdp::UsageError(std::string(e.what()) + " (see custom_loop --help)");
  }
  FSDP_CHECK(!f.resume || !f.checkpoint_dir.empty(), "--resume needs --checkpoint-dir DIR");

  // Under torchrun (or Slurm, a PyTorchJob) a worker; on its own with --nproc-per-node 2, the
  // launcher of two workers running this same program.
  fsdp::comm::Job job = fsdp::comm::start_job("custom_loop", argc, argv, f.nproc, "cpu");
  if (job.launched) return *job.launched;
  const fsdp::comm::Runtime& rt = job.runtime;
  const int rank = rt.world.rank, world_size = rt.world.world_size;
  FSDP_CHECK(f.batch % (world_size * f.grad_accum) == 0, "--batch ", f.batch, " must be a multiple of processes x ",
             "--grad-accum = ", world_size, " x ", f.grad_accum, " (equal micro-batches everywhere)");

  torch::manual_seed(f.seed);  // the same initial model on every process
  auto model = fsdp::nn::make_unit<NetImpl>();
  fsdp::FsdpOptions options;
  options.wrap = fsdp::WrapPolicy::by_type({std::type_index(typeid(BlockImpl))});
  auto sharded = fsdp::fully_shard(model.ptr(), rt.world_group, options);
  fsdp::optim::AdamWOptions adamw;
  adamw.lr = f.lr;
  fsdp::optim::AdamW opt(adamw);
  opt.add_shards(sharded->shards());
  fsdp::optim::LrSchedule schedule;
  schedule.lr = f.lr;
  schedule.min_lr = f.lr / 10;
  schedule.warmup_steps = f.warmup;
  schedule.max_steps = std::max<int64_t>(f.steps, 1);
  schedule.validate();
  fsdp::comm::ProcessGroup& group = *rt.world_group;  // checkpoints, export and the loss: between steps

  // Checkpoints: a directory this run owns (locked; leftovers of a crashed save removed).
  fsdp::checkpoint::CheckpointDirHold hold;
  int64_t step = 0;
  if (!f.checkpoint_dir.empty()) {
    hold = fsdp::checkpoint::open_checkpoint_dir(f.checkpoint_dir, group);
    if (f.resume) {
      // Re-cuts the saved shards for this number of processes; restores AdamW's moments and step count.
      const auto r = fsdp::checkpoint::load_latest_checkpoint(f.checkpoint_dir, *sharded, {&opt}, group);
      FSDP_CHECK(r.loaded, "--resume: no checkpoint in ", f.checkpoint_dir, " — run without --resume first");
      step = r.step;
      if (rank == 0) std::printf("resumed from %s (step %lld)\n", r.path.c_str(), static_cast<long long>(step));
    }
  }
  auto save = [&] {
    // What the checkpoint holds (Note [State seam]): the optimizer's slots and step, and metadata of ours.
    fsdp::MetadataState model_meta(fsdp::checkpoint::kModelKey, {{"config", {{"blocks", kBlocks}, {"width", kWidth}}}});
    fsdp::MetadataState loop_meta(fsdp::checkpoint::kTrainerKey, {{"step", step}, {"seed", f.seed}});
    const auto r = fsdp::checkpoint::save_checkpoint(f.checkpoint_dir, step, *sharded, {&model_meta, &loop_meta, &opt},
                                                     group);
    if (rank == 0) std::printf("saved %s\n", r.path.c_str());
  };
  if (rank == 0)
    std::printf("custom_loop: %d process(es), %lld units, %lld micro-batches per step\n", world_size,
                static_cast<long long>(fsdp::count_units(sharded->units())), static_cast<long long>(f.grad_accum));

  const int64_t micro = f.batch / (world_size * f.grad_accum);  // examples per micro-batch per process
  const int64_t last = f.stop_after > 0 ? std::min(f.stop_after, f.steps) : f.steps;
  while (step < last) {
    opt.set_lr(schedule.at(step));
    auto [x, y] = make_batch(f.batch, f.seed, step);
    // This process's slice of the global batch, cut into micro-batches.
    x = x.narrow(0, rank * micro * f.grad_accum, micro * f.grad_accum);
    y = y.narrow(0, rank * micro * f.grad_accum, micro * f.grad_accum);
    double step_loss = 0;
    for (int64_t m = 0; m < f.grad_accum; ++m) {
      // Gradients stay local (unsharded, accumulated) until the last micro-batch reduces them.
      sharded->set_requires_gradient_sync(m == f.grad_accum - 1);
      torch::Tensor loss = model(x.narrow(0, m * micro, micro), y.narrow(0, m * micro, micro)) / f.grad_accum;
      loss.backward();
      step_loss += loss.item<double>();
    }
    const double norm = sharded->clip_grad_norm(f.clip);
    opt.step();
    sharded->zero_grad();
    ++step;
    at::Tensor global = torch::full({1}, step_loss, torch::kDouble);
    group.all_reduce(global, fsdp::comm::ReduceOp::kSum)->wait();
    if (rank == 0)
      std::printf("step %lld loss %.9g grad_norm %.9g lr %.6g\n", static_cast<long long>(step),
                  global.item<double>() / world_size, norm, opt.lr());
    if (!f.checkpoint_dir.empty() && ((f.checkpoint_every > 0 && step % f.checkpoint_every == 0) || step == last))
      save();
  }

  if (!f.export_path.empty()) {
    const auto tensors = full_state_dict(*sharded, rank == 0);
    if (rank == 0) {
      // Written beside the target and renamed into place: an interrupted export never leaves a
      // half-written file under the name asked for.
      const std::string tmp = f.export_path + ".tmp";
      fsdp::checkpoint::save_safetensors(tmp, tensors, {{"format", "pt"}});
      std::filesystem::rename(tmp, f.export_path);
      std::printf("exported %zu tensors to %s\n", tensors.size(), f.export_path.c_str());
    }
    group.barrier(std::chrono::minutes(5));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return fsdp::run_main("custom_loop", [&] { return run(argc, argv); }); }

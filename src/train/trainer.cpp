#include "fsdp/train/trainer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"

namespace fsdp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

WrapPolicy parse_wrap(const std::string& s) {
  if (s == "block") return WrapPolicy::by_type({models::llama_block_type()});
  if (s == "root") return WrapPolicy::root_only();
  if (s.rfind("size:", 0) == 0) {
    int64_t n = 0;
    try {
      size_t used = 0;
      n = std::stoll(s.substr(5), &used);
      FSDP_CHECK(used == s.size() - 5, "");
    } catch (const std::exception&) {
      FSDP_CHECK(false, "--wrap ", s, ": the minimum parameter count after 'size:' must be an integer, e.g. size:1000000");
    }
    FSDP_CHECK(n >= 1, "--wrap ", s, ": the minimum parameter count must be >= 1");
    return WrapPolicy::size_based(n);
  }
  FSDP_CHECK(false, "--wrap '", s, "' is not one of: block, size:N, root");
  return {};
}

}  // namespace

void validate_options(const TrainOptions& o) {
  FSDP_CHECK(o.device == "cpu" || o.device == "cuda", "--device '", o.device, "' is not one of: cpu, cuda");
  FSDP_CHECK(o.device == "cpu", "--device cuda needs a CUDA build of fsdp-cpp (cmake -DFSDP_WITH_CUDA=ON "
             "-DFSDP_WITH_NCCL=ON against a CUDA LibTorch) and a GPU; this build is CPU-only — use --device cpu");
  FSDP_CHECK(o.step.batch_size >= 1, "--batch-size must be >= 1, got ", o.step.batch_size);
  FSDP_CHECK(o.step.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.step.grad_accum);
  FSDP_CHECK(o.step.max_steps >= 1, "--max-steps must be >= 1, got ", o.step.max_steps);
  FSDP_CHECK(o.step.clip_grad >= 0, "--clip-grad must be >= 0 (0 disables clipping), got ", o.step.clip_grad);
  FSDP_CHECK(o.log.log_every >= 1, "--log-every must be >= 1, got ", o.log.log_every);
  FSDP_CHECK(o.data.seq_len >= 1, "--seq-len must be >= 1, got ", o.data.seq_len);
  FSDP_CHECK(o.data.prefetch >= 1, "the loader's prefetch depth must be >= 1, got ", o.data.prefetch);
  FSDP_CHECK(!o.data.path.empty(), "--data is required: a text file, a JSON-lines file, a binary token file or a "
             "directory of .bin shards");
  FSDP_CHECK(std::filesystem::exists(o.data.path), "--data ", o.data.path, ": no such file or directory");
  optim::LrSchedule sched = o.schedule;
  sched.max_steps = o.step.max_steps;
  sched.validate();
  FSDP_CHECK(o.adamw.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.adamw.weight_decay);
  parse_sharding_strategy(o.sharding.strategy);
  parse_wrap(o.sharding.wrap);
  FSDP_CHECK(o.sharding.hybrid_shard_size >= 0, "--hybrid-shard-size must be >= 1 (or 0 for LOCAL_WORLD_SIZE), got ",
             o.sharding.hybrid_shard_size);
  const models::LlamaConfig cfg = models::resolve_model_config(o.model);
  FSDP_CHECK(o.data.seq_len <= cfg.max_position_embeddings, "--seq-len ", o.data.seq_len, " is longer than model '",
             cfg.name, "' supports (max_position_embeddings = ", cfg.max_position_embeddings,
             "); use --seq-len <= ", cfg.max_position_embeddings);
  if (!o.log.metrics_file.empty()) {
    const auto parent = std::filesystem::path(o.log.metrics_file).parent_path();
    FSDP_CHECK(parent.empty() || std::filesystem::is_directory(parent), "--metrics-file ", o.log.metrics_file,
               ": directory ", parent.string(), " does not exist");
  }
}

TrainSummary train(const TrainOptions& o, const comm::Runtime& rt) {
  validate_options(o);
  const comm::ProcessGroupPtr& world = rt.world_group;
  const int rank = world->rank();
  const int W = world->size();
  const bool lead = rank == 0;
  auto say = [&](const std::string& line) {
    if (lead && !o.log.quiet) std::cout << timestamp() << " I [fsdp-train] " << line << std::endl;
  };

  // --- model configuration and data
  const models::LlamaConfig cfg = models::resolve_model_config(o.model);
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(o.data.tokenizer);
  FSDP_CHECK(tokenizer->vocab_size() <= cfg.vocab_size, "tokenizer ", tokenizer->name(), " has ",
             tokenizer->vocab_size(), " tokens but model '", cfg.name, "' has vocab_size ", cfg.vocab_size,
             "; choose a model with a large enough vocabulary or another tokenizer");
  data::DatasetOptions dopt;
  dopt.path = o.data.path;
  dopt.format = o.data.format;
  dopt.text_field = o.data.text_field;
  dopt.token_dtype = o.data.token_dtype;
  auto dataset = data::load_dataset(dopt, tokenizer.get());
  dataset->validate(cfg.vocab_size);

  data::SamplerOptions sopt;
  sopt.seq_len = o.data.seq_len;
  sopt.batch_size = o.step.batch_size;
  sopt.world_size = W;
  sopt.rank = rank;
  sopt.grad_accum = o.step.grad_accum;
  sopt.seed = o.step.seed;
  sopt.shuffle = o.data.shuffle;
  auto sampler = std::make_shared<const data::BatchSampler>(dataset, sopt);
  data::LoaderOptions lopt;
  lopt.queue_depth = o.data.prefetch;
  data::BackgroundLoader loader(sampler, /*start_step=*/0, lopt);

  // --- model, built on the meta device; each rank materializes its shards
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), o.step.seed);
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);

  FsdpOptions fo;
  fo.strategy = parse_sharding_strategy(o.sharding.strategy);
  fo.wrap = parse_wrap(o.sharding.wrap);
  fo.hybrid_shard_size = o.sharding.hybrid_shard_size > 0 ? o.sharding.hybrid_shard_size : rt.world.local_world_size;
  fo.sync_module_states = o.sharding.sync_module_states;
  fo.init_rule = models::llama_init_rule(cfg);
  fo.seed = o.step.seed;
  auto sharded = fully_shard(root.ptr(), world, fo);

  optim::AdamWOptions aopt = o.adamw;
  optim::AdamW opt(aopt);
  opt.add_shards(sharded->shards());
  optim::LrSchedule sched = o.schedule;
  sched.max_steps = o.step.max_steps;

  // Scalars the trainer reduces (loss) go through their own group, so the
  // FSDP byte counts in the metrics are the engine's alone.
  comm::ProcessGroupPtr scalars = W > 1 ? world->new_group([&] {
    std::vector<int> all(static_cast<size_t>(W));
    for (int i = 0; i < W; ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }(), "trainer") : world;

  TrainSummary summary;
  summary.parameters = cfg.num_parameters();
  summary.plan = sharded->describe();
  const int64_t G = sampler->global_batch_size();
  say(fmt::format("model {} ({} parameters), {} ranks ({}), {} units, global batch {} x {} tokens", cfg.name,
                  cfg.num_parameters(), W, rt.world.launcher, sharded->units().size(), G, o.data.seq_len));
  say(fmt::format("data {}, {} windows of {} tokens per epoch", dataset->describe(), sampler->samples_per_epoch(),
                  o.data.seq_len));
  if (lead && !o.log.quiet) std::cout << summary.plan << std::flush;

  std::ofstream metrics;
  if (lead && !o.log.metrics_file.empty()) {
    metrics.open(o.log.metrics_file, std::ios::app);
    FSDP_CHECK(metrics.good(), "--metrics-file ", o.log.metrics_file, ": cannot open for appending");
  }

  sharded->take_step_counters();
  auto interval_start = Clock::now();
  int64_t interval_steps = 0;
  for (int64_t step = 0; step < o.step.max_steps; ++step) {
    const auto t0 = Clock::now();
    const double lr = sched.at(step);
    opt.set_lr(lr);
    sharded->zero_grad();
    double local = 0.0;
    for (int64_t a = 0; a < o.step.grad_accum; ++a) {
      data::Batch batch = loader.next();
      sharded->set_requires_gradient_sync(a == o.step.grad_accum - 1);
      at::Tensor loss = root(batch.inputs, batch.targets) / static_cast<double>(o.step.grad_accum);
      loss.backward();
      local += loss.item<double>();
    }
    const double norm = o.step.clip_grad > 0 ? sharded->clip_grad_norm(o.step.clip_grad) : sharded->grad_norm();
    opt.step();

    at::Tensor lt = at::full({1}, local, at::TensorOptions().dtype(at::kDouble));
    scalars->all_reduce(lt, comm::ReduceOp::kAvg)->wait();
    StepRecord rec;
    rec.step = step;
    rec.loss = lt.item<double>();
    rec.lr = lr;
    rec.grad_norm = norm;
    rec.step_time_s = seconds_since(t0);
    rec.comm = sharded->take_step_counters();
    rec.peak_mem_bytes = peak_rss_bytes();
    FSDP_CHECK(std::isfinite(rec.loss), "the loss became ", rec.loss, " at step ", step, " (lr ", lr,
               "); lower --lr or raise --warmup-steps, or clip harder with --clip-grad");
    ++interval_steps;
    const bool log_now = (step % o.log.log_every == 0) || step == o.step.max_steps - 1;
    if (log_now) {
      const double dt = seconds_since(interval_start);
      rec.samples_per_s = static_cast<double>(G * interval_steps) / dt;
      rec.tokens_per_s = rec.samples_per_s * static_cast<double>(o.data.seq_len);
      say(fmt::format("Batch {} Loss: {:.5f}, Speed: {:.2f} samples/sec, lr: {:.6f}", step, rec.loss,
                      rec.samples_per_s, lr));
      if (metrics.is_open()) {
        nlohmann::json j = {{"step", step},
                            {"loss", rec.loss},
                            {"lr", lr},
                            {"grad_norm", norm},
                            {"samples_per_s", rec.samples_per_s},
                            {"tokens_per_s", rec.tokens_per_s},
                            {"step_time_s", rec.step_time_s},
                            {"peak_mem_bytes", rec.peak_mem_bytes},
                            {"allgather_bytes", rec.comm.allgather_bytes},
                            {"reduce_scatter_bytes", rec.comm.reduce_scatter_bytes},
                            {"allreduce_bytes", rec.comm.allreduce_bytes},
                            {"world_size", W}};
        metrics << j.dump() << "\n" << std::flush;
      }
      interval_start = Clock::now();
      interval_steps = 0;
    }
    summary.steps.push_back(rec);
  }
  loader.stop();
  return summary;
}

}  // namespace fsdp::train

// The trainer with checkpoints and evaluation, in process: an exact resume,
// a resume at other world sizes, and --eval-only against a direct computation.
#include <gtest/gtest.h>

#include <filesystem>
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/trainer.h"
#include "support/files.h"
#include "support/multiproc.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;

const std::string kCorpus = std::string(FSDP_SOURCE_DIR) + "/data/fallback_corpus.jsonl";
const std::string kValCorpus = std::string(FSDP_SOURCE_DIR) + "/data/fallback_corpus.val.jsonl";

train::TrainOptions options(int world, int64_t max_steps) {
  train::TrainOptions o;
  o.model = "tiny";
  o.data.path = kCorpus;
  o.data.seq_len = 32;
  o.step.batch_size = 4 / world;  // global batch 4 at every world size
  o.step.max_steps = max_steps;
  o.schedule.lr = 3e-3;
  o.schedule.min_lr = 3e-4;
  o.schedule.warmup_steps = 2;
  o.log.quiet = true;
  return o;
}

comm::Runtime runtime_of(comm::ProcessGroup& pg) {
  comm::Runtime rt;
  rt.world.rank = pg.rank();
  rt.world.world_size = pg.size();
  rt.world.local_world_size = pg.size();
  rt.world.launcher = "test";
  rt.world_group = comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {});
  return rt;
}

// A stop request after `n` polls (one poll per step): what SIGTERM does.
std::function<int()> stop_after(int n) {
  auto polls = std::make_shared<int>(0);
  return [polls, n] { return ++*polls >= n ? 15 : 0; };
}

void write_losses(const std::string& path, const train::TrainSummary& s) {
  std::ofstream out(path, std::ios::app);
  for (const auto& r : s.steps) out << r.step << " " << std::setprecision(17) << r.loss << "\n";
}

std::map<int64_t, double> read_losses(const std::string& path) {
  std::map<int64_t, double> m;
  std::ifstream in(path);
  int64_t step;
  double loss;
  while (in >> step >> loss) m[step] = loss;
  return m;
}

// Resumes dir/ckpt (saved at step `from` of a 4-rank run whose losses are in
// dir/straight) at 2 and at 1 rank, with options_at(world) running to `total`:
// each resumed step's loss follows the straight run's, to summation order.
// Each world size resumes from its own copy (dir/ckpt2, dir/ckpt1).
void resume_at_two_and_one(const std::string& dir, const std::function<train::TrainOptions(int)>& options_at,
                           int64_t from, int64_t total) {
  if (!testing::is_worker()) {
    for (const char* to : {"/ckpt2", "/ckpt1"}) fs::copy(dir + "/ckpt", dir + to, fs::copy_options::recursive);
  }
  for (int w : {2, 1}) {
    testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
      auto o = options_at(w);
      o.checkpoint.dir = dir + "/ckpt" + std::to_string(w);
      o.checkpoint.resume = true;
      auto s = train::train(o, runtime_of(pg));
      EXPECT_EQ(s.start_step, from);
      EXPECT_EQ(s.steps.size(), static_cast<size_t>(total - from));
      if (pg.rank() == 0) write_losses(dir + "/resumed" + std::to_string(w), s);
    });
  }
  if (testing::is_worker()) return;
  const auto straight = read_losses(dir + "/straight");
  ASSERT_EQ(straight.size(), static_cast<size_t>(total));
  for (int w : {2, 1}) {
    const auto resumed = read_losses(dir + "/resumed" + std::to_string(w));
    ASSERT_EQ(resumed.size(), static_cast<size_t>(total - from)) << w;
    for (const auto& [step, loss] : resumed) {
      EXPECT_NEAR(loss, straight.at(step), 1e-5 * std::abs(straight.at(step))) << "world " << w << " step " << step;
    }
  }
}

}  // namespace

// 20 steps straight vs 10 steps, a stop (as on SIGTERM: a checkpoint is
// saved), a resume and 10 more: bit-identical losses (CPU, fp32).
TEST(Resume, IsBitExact) {
  const std::string dir = testing::temp_dir("resume-exact");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto straight = train::train(options(2, 20), runtime_of(pg));
    ASSERT_EQ(straight.steps.size(), 20u);

    auto o = options(2, 20);
    o.checkpoint.dir = dir + "/ckpt";
    o.checkpoint.resume = true;  // nothing there yet: from scratch
    o.stop_requested = stop_after(10);
    auto first = train::train(o, runtime_of(pg));
    EXPECT_EQ(first.start_step, 0);
    EXPECT_EQ(first.end_step, 10);
    EXPECT_EQ(first.stop_reason, 15);
    EXPECT_EQ(first.last_checkpoint, dir + "/ckpt/step_00000010");

    o.stop_requested = nullptr;
    auto second = train::train(o, runtime_of(pg));
    EXPECT_EQ(second.start_step, 10);
    EXPECT_EQ(second.resumed_from, dir + "/ckpt/step_00000010");
    ASSERT_EQ(second.steps.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(first.steps[i].loss, straight.steps[i].loss) << "step " << i;
      EXPECT_EQ(second.steps[i].step, static_cast<int64_t>(10 + i));
      EXPECT_EQ(second.steps[i].loss, straight.steps[10 + i].loss) << "step " << 10 + i;
      EXPECT_EQ(second.steps[i].lr, straight.steps[10 + i].lr) << "step " << 10 + i;
    }
    EXPECT_EQ(second.last_checkpoint, dir + "/ckpt/step_00000020");
  });
}

// --async-checkpoint (Note [Asynchronous save]): a run stopped at step 7
// (checkpoints at 3, 6 and 7, written in the background while the next steps
// run) leaves the same bytes as a synchronous run, in our format and DCP's,
// and the resume from it continues bit for bit.
TEST(Resume, FromAnAsyncSaveIsBitExact) {
  const std::string dir = testing::temp_dir("resume-async");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    const auto straight = train::train(options(2, 12), runtime_of(pg));
    for (const std::string format : {"sharded", "dcp"}) {
      for (const bool async : {false, true}) {
        auto o = options(2, 12);
        // Names of one length: DCP's .metadata holds the checkpoint's path, and the manifest its size.
        o.checkpoint.dir = dir + "/" + format + (async ? "-asyn" : "-sync");
        o.checkpoint.format = format;
        o.checkpoint.async = async;
        o.checkpoint.every = 3;
        o.checkpoint.resume = true;
        o.stop_requested = stop_after(7);
        const auto first = train::train(o, runtime_of(pg));
        EXPECT_EQ(first.end_step, 7);
        ASSERT_EQ(first.checkpoints.size(), 3u) << format;
        for (const auto& c : first.checkpoints) {
          EXPECT_TRUE(c.committed) << format << " step " << c.step;
          EXPECT_EQ(c.async, async);
          EXPECT_EQ(c.staged, async) << "within the staging limit";
          EXPECT_EQ(c.staging_bytes > 0, async);
        }
        EXPECT_EQ(first.last_checkpoint, o.checkpoint.dir + "/step_00000007");
        o.stop_requested = nullptr;
        const auto second = train::train(o, runtime_of(pg));
        EXPECT_EQ(second.start_step, 7) << format;
        ASSERT_EQ(second.steps.size(), 5u);
        for (size_t i = 0; i < 5; ++i) {
          EXPECT_EQ(second.steps[i].loss, straight.steps[7 + i].loss) << format << " step " << 7 + i;
        }
        EXPECT_EQ(second.last_checkpoint, o.checkpoint.dir + "/step_00000012");
      }
      pg.barrier(std::chrono::seconds(60));
      if (pg.rank() == 0) {
        for (const char* step : {"/step_00000006", "/step_00000007", "/step_00000012"}) {
          testing::expect_same_files(dir + "/" + format + "-sync" + step, dir + "/" + format + "-asyn" + step);
        }
      }
    }
  });
}

// The loss scale is part of the saved state: a run whose first scale overflows
// (so it skips steps and backs off) continues after a resume with exactly the
// scales, skips and losses of the uninterrupted run. bf16 + --loss-scaling on
// drives the fp16 recipe's scaler on this CPU (no fp16 matmul here).
TEST(Resume, RestoresTheLossScale) {
  const std::string dir = testing::temp_dir("resume-scale");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto scaled = [](int64_t steps) {
      auto o = options(2, steps);
      o.fsdp.mixed_precision.param_dtype = at::kBFloat16;  // --mixed-precision bf16
      o.fsdp.mixed_precision.buffer_dtype = at::kBFloat16;
      o.step.loss_scaling = train::LossScaling::kOn;
      o.step.initial_loss_scale = std::ldexp(1.0, 131);  // beyond fp32: the first ~9 steps overflow
      return o;
    };
    auto straight = train::train(scaled(16), runtime_of(pg));
    auto o = scaled(16);
    o.checkpoint.dir = dir + "/ckpt";
    o.checkpoint.resume = true;
    o.stop_requested = stop_after(4);
    auto first = train::train(o, runtime_of(pg));
    o.stop_requested = nullptr;
    auto second = train::train(o, runtime_of(pg));
    ASSERT_EQ(second.steps.size(), 12u);
    int64_t skipped = 0;
    for (const auto& r : straight.steps) skipped += r.skipped ? 1 : 0;
    EXPECT_GE(skipped, 5) << "the initial scale should overflow for several steps";
    EXPECT_LT(skipped, 16) << "the scale should come down to a finite range";
    for (size_t i = 0; i < 12; ++i) {
      const auto& want = straight.steps[4 + i];
      EXPECT_EQ(second.steps[i].loss_scale, want.loss_scale) << "step " << want.step;
      EXPECT_EQ(second.steps[i].skipped, want.skipped) << "step " << want.step;
      EXPECT_EQ(second.steps[i].loss, want.loss) << "step " << want.step;
    }
  });
}

// 10 steps on 4 ranks, then 5 more on 2 ranks and on 1: the same losses as 15
// straight steps on 4 ranks, within fp32 rounding (the global batch is the
// same set of samples at every world size).
TEST(Resume, AtOtherWorldSizes) {
  const std::string dir = testing::temp_dir("resume-ws");
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    auto straight = train::train(options(4, 15), runtime_of(pg));
    if (pg.rank() == 0) write_losses(dir + "/straight", straight);
    auto o = options(4, 15);
    o.checkpoint.dir = dir + "/ckpt";
    o.stop_requested = stop_after(10);
    auto first = train::train(o, runtime_of(pg));
    EXPECT_EQ(first.end_step, 10);
  });
  resume_at_two_and_one(dir, [](int w) { return options(w, 15); }, 10, 15);
}

// --stop-at-step: a run that stops at step 5 (a checkpoint, no export, the
// trace of the steps it ran written) and is
// resumed trains steps 5..11 as a straight 12-step run does, bit for bit: the
// schedule still ends at --max-steps.
TEST(Resume, StopAtStepThenResumeIsBitExact) {
  const std::string dir = testing::temp_dir("resume-stop-at");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    auto straight = train::train(options(2, 12), runtime_of(pg));
    auto o = options(2, 12);
    o.checkpoint.dir = dir + "/ckpt";
    o.checkpoint.resume = true;
    o.hf.export_dir = dir + "/hf";
    o.step.stop_at_step = 5;
    o.log.profile_begin = 3;  // traced steps 3..7: the stop ends the trace at step 5
    o.log.profile_end = 8;
    o.log.profile_file = dir + "/trace.json";
    auto first = train::train(o, runtime_of(pg));
    EXPECT_EQ(first.end_step, 5);
    EXPECT_EQ(first.stop_reason, 0);
    EXPECT_EQ(first.last_checkpoint, dir + "/ckpt/step_00000005");
    EXPECT_FALSE(fs::exists(dir + "/hf")) << "a stopped run exports nothing";
    if (pg.rank() == 0) EXPECT_EQ(first.trace_file, dir + "/trace.json");
    o.log.profile_end = 0;
    auto again = train::train(o, runtime_of(pg));  // resumed at the stop: nothing to train
    EXPECT_EQ(again.start_step, 5);
    EXPECT_TRUE(again.steps.empty());
    o.step.stop_at_step = 0;
    auto second = train::train(o, runtime_of(pg));
    EXPECT_EQ(second.start_step, 5);
    ASSERT_EQ(second.steps.size(), 7u);
    for (size_t i = 0; i < 7; ++i) {
      EXPECT_EQ(second.steps[i].loss, straight.steps[5 + i].loss) << "step " << 5 + i;
      EXPECT_EQ(second.steps[i].lr, straight.steps[5 + i].lr) << "step " << 5 + i;
    }
    EXPECT_TRUE(fs::exists(dir + "/hf/model.safetensors"));
  });
}

// --global-batch-size (Note [Global batch across world sizes]): 4 ranks x 1
// row, stopped at step 6, resumed at 2 ranks (2 micro-steps of 1 row) and at
// 1 rank (4 micro-steps): the same rows per step, so the losses follow the
// straight 4-rank run's to summation order. The checkpoint's trainer state
// records the accumulation each world size used.
TEST(Resume, AGlobalBatchKeptAcrossWorldSizes) {
  const std::string dir = testing::temp_dir("resume-global-batch");
  auto global = [](int world, int64_t steps) {
    auto o = options(world, steps);
    o.step.batch_size = 1;
    o.step.global_batch_size = 4;
    return o;
  };
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    auto straight = train::train(global(4, 10), runtime_of(pg));
    if (pg.rank() == 0) write_losses(dir + "/straight", straight);
    auto o = global(4, 10);
    o.checkpoint.dir = dir + "/ckpt";
    o.step.stop_at_step = 6;
    EXPECT_EQ(train::train(o, runtime_of(pg)).end_step, 6);
  });
  resume_at_two_and_one(dir, [&](int w) { return global(w, 10); }, 6, 10);
  if (testing::is_worker()) return;
  for (int w : {2, 1}) {
    const auto manifest = nlohmann::json::parse(
        testing::file_bytes(dir + "/ckpt" + std::to_string(w) + "/step_00000010/manifest.json"));
    EXPECT_EQ(manifest.at("state").at("trainer").at("grad_accum"), 4 / w) << manifest.at("state").dump();
  }
  // A global batch that a world size does not divide, and a --grad-accum that disagrees: named, with values.
  auto bad = global(4, 10);
  bad.step.global_batch_size = 6;
  try {
    (void)train::at_world_size(bad, 4);
    ADD_FAILURE() << "--global-batch-size 6 at 4 ranks x 1 row was accepted";
  } catch (const UsageError& e) {
    // The library names its fields (fsdp-train says --global-batch-size and --batch-size).
    EXPECT_NE(std::string(e.what()).find("StepOptions::global_batch_size 6 is not a multiple of "
                                         "StepOptions::batch_size 1 x 4 ranks"),
              std::string::npos) << e.what();
  }
  bad = global(4, 10);
  bad.step.grad_accum = 3;
  EXPECT_THROW((void)train::at_world_size(bad, 2), UsageError);
  EXPECT_EQ(train::at_world_size(global(1, 10), 1).step.grad_accum, 4);
}

// The summed loss the evaluation uses: mean x number of targets; 0 when every
// target is ignored (the mean would be NaN).
TEST(Eval, SummedLossIsTheMeanTimesTheTargets) {
  const auto cfg = *models::llama_preset("tiny");
  models::LlamaForCausalLMImpl model(cfg, at::TensorOptions(), 3);
  at::NoGradGuard g;
  const at::Tensor in = at::randint(0, 256, {2, 8}, at::kLong);
  at::Tensor tg = at::randint(0, 256, {2, 8}, at::kLong);
  tg.index_put_({1, at::indexing::Slice(3, at::indexing::None)}, models::kIgnoreIndex);  // 11 targets
  const double mean = model.loss(in, tg).item<double>();
  const double sum = model.loss(in, tg, models::LossReduction::kSum).item<double>();
  EXPECT_NEAR(sum, mean * 11, 1e-5 * sum);
  EXPECT_EQ(model.loss(in, tg, models::LossReduction::kMean).item<double>(), mean);
  EXPECT_EQ(model.loss(in, at::full({2, 8}, models::kIgnoreIndex, at::kLong), models::LossReduction::kSum).item<double>(), 0.0);
}

// --eval-only over the whole validation set equals a direct single-process
// computation on the same weights (an unsharded model, every window of the
// token stream, summed cross-entropy / number of targets), at 1 and 2 ranks.
TEST(Eval, EvalOnlyMatchesADirectComputation) {
  const std::string dir = testing::temp_dir("eval-only");
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    auto o = options(1, 3);
    o.hf.export_dir = dir + "/hf";
    o.eval.val_data = kValCorpus;
    o.eval.every = 3;  // periodic evaluation also works (after the last step)
    auto s = train::train(o, runtime_of(pg));
    ASSERT_EQ(s.evals.size(), 1u);
    EXPECT_EQ(s.evals[0].step, 3);
  });
  // The direct computation, in the parent (it has no process group).
  double direct = 0;
  int64_t n_targets = 0;
  if (!testing::is_worker()) {
    const auto cfg = models::resolve_model_config(dir + "/hf");
    models::LlamaForCausalLMImpl model(cfg, at::TensorOptions(), 0);
    checkpoint::SafetensorsFile f(dir + "/hf/model.safetensors");
    at::NoGradGuard g;
    for (auto& p : model.named_parameters()) p.value().copy_(f.tensor(p.key()));
    auto tok = data::make_tokenizer("byte");
    data::DatasetOptions dopt;
    dopt.path = kValCorpus;
    const auto ds = data::load_dataset(dopt, tok.get());
    const int64_t n = ds->size();
    std::vector<int32_t> t(static_cast<size_t>(n));
    ds->read(0, n, t.data());
    const int64_t T = 32;
    double sum = 0;
    for (int64_t start = 0; start + 1 < n; start += T) {
      const int64_t len = std::min(T, n - 1 - start);
      at::Tensor in = at::empty({1, len}, at::kLong), tg = at::empty({1, len}, at::kLong);
      for (int64_t i = 0; i < len; ++i) {
        in[0][i] = t[static_cast<size_t>(start + i)];
        tg[0][i] = t[static_cast<size_t>(start + i + 1)];
      }
      const at::Tensor logits = model.forward(in).reshape({len, cfg.vocab_size});
      sum += at::cross_entropy_loss(logits, tg.reshape({len}), {}, at::Reduction::Sum).item<double>();
      n_targets += len;
    }
    EXPECT_EQ(n_targets, n - 1);
    direct = sum / static_cast<double>(n_targets);
  }
  for (int w : {1, 2}) {
    testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
      auto o = options(w, 3);
      o.model = dir + "/hf";
      o.hf.init_from = dir + "/hf";
      o.eval.val_data = kValCorpus;
      o.mode = train::Mode::kEvaluate;
      o.step.batch_size = 3;  // windows do not divide evenly: padding rows and a partial last window
      o.log.metrics_file = dir + "/metrics" + std::to_string(w) + ".jsonl";
      auto s = train::train(o, runtime_of(pg));
      ASSERT_EQ(s.evals.size(), 1u);
      EXPECT_TRUE(s.steps.empty());
      if (pg.rank() == 0) {
        std::ofstream(dir + "/eval" + std::to_string(w)) << std::setprecision(17) << s.evals[0].loss << " "
                                                         << s.evals[0].targets;
      }
    });
  }
  if (testing::is_worker()) return;
  for (int w : {1, 2}) {
    double loss = 0;
    int64_t targets = 0;
    std::ifstream(dir + "/eval" + std::to_string(w)) >> loss >> targets;
    EXPECT_EQ(targets, n_targets) << w;
    EXPECT_NEAR(loss, direct, 1e-6 * direct) << "world " << w;
    std::ifstream m(dir + "/metrics" + std::to_string(w) + ".jsonl");
    std::string line;
    std::getline(m, line);
    EXPECT_NE(line.find("\"eval_loss\":"), std::string::npos) << line;
  }
}

}  // namespace fsdp

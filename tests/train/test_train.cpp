// The trainer end to end: in-process runs at several world sizes, and the
// fsdp-train binary (flags, exit codes, the local launcher, every strategy).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/train/trainer.h"
#include "support/errors.h"
#include "support/multiproc.h"
#include "train_test_util.h"

namespace fsdp {
namespace {

using testing::Command;
using testing::kCorpus;
using testing::kTrainBin;
using testing::run_command;

train::TrainOptions tiny_options() {
  train::TrainOptions o;
  o.model = "tiny";
  o.data.path = kCorpus;
  o.data.seq_len = 32;
  o.step.batch_size = 4;
  o.step.max_steps = 8;
  o.schedule.lr = 3e-3;
  o.schedule.min_lr = 3e-4;
  o.schedule.warmup_steps = 2;
  o.log.quiet = true;
  return o;
}

comm::Runtime runtime_of(comm::ProcessGroup& pg, int local_world_size) {
  comm::Runtime rt;
  rt.world.rank = pg.rank();
  rt.world.world_size = pg.size();
  rt.world.local_world_size = local_world_size;
  rt.world.launcher = "test";
  rt.world_group = comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {});
  return rt;
}

std::string tiny_flags() {
  return " --model tiny --data " + kCorpus + " --seq-len 32 --batch-size 2 --max-steps 3 --log-every 1 --lr 1e-3";
}

}  // namespace

// The global batch of a step is the same set of samples whatever the world
// size, so runs at 1, 2 and 4 ranks agree step by step.
TEST(Train, LossesAgreeAcrossWorldSizes) {
  const std::string dir = testing::temp_dir("train-ws");
  for (int w : {1, 2, 4}) {
    testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
      train::TrainOptions o = tiny_options();
      o.step.batch_size = 4 / pg.size();
      auto s = train::train(o, runtime_of(pg, pg.size()));
      if (pg.rank() == 0) {
        std::ofstream out(dir + "/losses" + std::to_string(pg.size()));
        for (const auto& r : s.steps) out << std::setprecision(17) << r.loss << "\n";
      }
    });
  }
  if (testing::is_worker()) return;  // the comparison runs in the parent
  auto read = [&](int w) {
    std::vector<double> v;
    std::ifstream in(dir + "/losses" + std::to_string(w));
    double x;
    while (in >> x) v.push_back(x);
    return v;
  };
  const auto l1 = read(1), l2 = read(2), l4 = read(4);
  ASSERT_EQ(l1.size(), 8u);
  ASSERT_EQ(l2.size(), 8u);
  ASSERT_EQ(l4.size(), 8u);
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l2[i], l1[i], 1e-5 * std::abs(l1[i])) << "step " << i;
    EXPECT_NEAR(l4[i], l1[i], 1e-5 * std::abs(l1[i])) << "step " << i;
  }
  EXPECT_LT(l1.back(), l1.front() - 0.5) << "the loss should fall";
}

// --kernels fused clips inside the optimizer's kernel (Note [Clipping inside
// the fused step]): with a max norm that clips every step it trains within
// 1e-6 of the reference kernels (which clip by a pass of their own), and
// without clipping it trains otherwise — so the clip took effect.
TEST(Train, FusedKernelsClipInsideTheOptimizerStep) {
  const std::string dir = testing::temp_dir("train-clip");
  struct Run {
    const char* tag;
    models::LayerKernels kernels;
    double clip;
  };
  const Run runs[] = {{"reference", models::LayerKernels::kReference, 0.05},
                      {"fused", models::LayerKernels::kFused, 0.05},
                      {"fused-unclipped", models::LayerKernels::kFused, 0.0}};
  testing::run_distributed(1, [&](comm::ProcessGroup& pg) {
    for (const Run& r : runs) {
      train::TrainOptions o = tiny_options();
      o.step.kernels = r.kernels;
      o.step.clip_grad = r.clip;
      const auto s = train::train(o, runtime_of(pg, 1));
      std::ofstream out(dir + "/" + r.tag);
      out << std::setprecision(17);
      for (const auto& rec : s.steps) out << rec.loss << " " << rec.grad_norm << "\n";
    }
  });
  if (testing::is_worker()) return;
  auto read = [&](const char* tag) {
    std::vector<std::pair<double, double>> v;
    std::ifstream in(dir + "/" + tag);
    double loss, norm;
    while (in >> loss >> norm) v.emplace_back(loss, norm);
    return v;
  };
  const auto ref = read("reference"), fused = read("fused"), unclipped = read("fused-unclipped");
  ASSERT_EQ(ref.size(), 8u);
  ASSERT_EQ(fused.size(), 8u);
  ASSERT_EQ(unclipped.size(), 8u);
  double apart = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_GT(ref[i].second, 0.05) << "step " << i << ": nothing to clip, the test shows nothing";
    EXPECT_NEAR(fused[i].first, ref[i].first, 1e-6 * std::abs(ref[i].first)) << "step " << i;
    apart = std::max(apart, std::abs(unclipped[i].first - fused[i].first) / std::abs(fused[i].first));
  }
  EXPECT_GT(apart, 1e-3) << "clipping changed nothing: the fused step ignored it";
}

// The Trainer's methods are the pieces of run(): a loop of restore(),
// train_step(), evaluate() and save() gives run()'s steps, evaluations and
// checkpoint bit for bit. A method called out of order is a UsageError that
// changes nothing (the phases of src/train/trainer_phase.h): before
// restore(), restore() twice, run() after the methods, any call after run().
TEST(Train, AHandWrittenLoopEqualsRun) {
  const std::string dir = testing::temp_dir("train-loop");
  auto options = [&](const std::string& tag) {
    train::TrainOptions o = tiny_options();
    o.step.batch_size = 2;
    o.eval.val_data = kCorpus;
    o.eval.every = 4;
    o.eval.max_windows = 8;
    o.checkpoint.dir = dir + "/ckpt-" + tag;
    return o;
  };
  auto record = [&](const std::string& tag, const train::TrainSummary& s) {
    std::ofstream out(dir + "/" + tag);
    out << std::setprecision(17);
    for (const auto& r : s.steps) out << r.step << " " << r.loss << " " << r.grad_norm << " " << r.lr << "\n";
    for (const auto& e : s.evals) out << "eval " << e.step << " " << e.loss << " " << e.targets << "\n";
    out << "checkpoint " << std::filesystem::path(s.last_checkpoint).filename().string() << "\n";
  };
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    train::Trainer whole(options("run"), runtime_of(pg, pg.size()));
    const train::TrainSummary ran = whole.run();
    EXPECT_CONTAINS(testing::usage_error_of([&] { whole.save(); }),
                    "Trainer::save: run() finished this Trainer's run; construct a new Trainer for another (phase "
                    "Finished -> Saving is not legal)");
    train::Trainer t(options("loop"), runtime_of(pg, pg.size()));
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.train_step(); }), "call restore() first");
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.evaluate(8); }), "Trainer::evaluate: it needs the weights in "
                    "place: call restore() first (phase Constructed -> Evaluating is not legal)");
    t.restore();
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.restore(); }), "the weights are restored already; call it once");
    while (t.step() < 8) {
      t.train_step();
      if (t.step() % 4 == 0) t.evaluate(/*max_windows=*/8);
    }
    t.save();
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.train_step(); }), "8 steps are done, step.max_steps is 8");
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.export_hf(); }), "needs hf.export_dir");
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.run(); }), "run() runs the whole training from the start");
    if (pg.rank() == 0) {
      record("run", ran);
      record("loop", t.summary());
    }
  });
  if (testing::is_worker()) return;
  const std::string ran = testing::read_file(dir + "/run");
  ASSERT_EQ(testing::count(ran, "\n"), 11u) << ran;
  EXPECT_EQ(testing::read_file(dir + "/loop"), ran);
  for (const char* shard : {"shard-00000-of-00002.bin", "shard-00001-of-00002.bin"}) {
    const std::string saved = testing::read_file(dir + "/ckpt-run/step_00000008/" + shard);
    EXPECT_FALSE(saved.empty()) << shard;
    EXPECT_EQ(testing::read_file(dir + "/ckpt-loop/step_00000008/" + shard), saved) << shard;
  }
}

// An agreed stop (options.stop_requested on any rank) ends the steps:
// train_step() is then refused with what to do instead, and save() goes on
// (the phase Stopping of src/train/trainer_phase.h).
TEST(Train, AnAgreedStopEndsTheSteps) {
  const std::string dir = testing::temp_dir("train-stop");
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    train::TrainOptions o = tiny_options();
    o.step.batch_size = 2;
    o.checkpoint.dir = dir + "/ckpt";
    int calls = 0;
    // Rank 1 alone asks, at its second step: every rank stops after it.
    o.stop_requested = [&calls, rank = pg.rank()] { return ++calls == 2 && rank == 1 ? 15 : 0; };
    train::Trainer t(o, runtime_of(pg, pg.size()));
    t.restore();
    t.train_step();
    EXPECT_FALSE(t.stop_requested());
    t.train_step();
    EXPECT_TRUE(t.stop_requested());
    EXPECT_CONTAINS(testing::usage_error_of([&] { t.train_step(); }),
                    "Trainer::train_step: a rank asked to stop at the last step (stop_requested()); save() and end "
                    "the run (phase Stopping -> Training is not legal)");
    EXPECT_EQ(t.step(), 2);
    EXPECT_EQ(std::filesystem::path(t.save()).filename().string(), "step_00000002");
    EXPECT_TRUE(t.stop_requested()) << "a save returns to the phase it was called in";
  });
}

// --sync-module-states: rank 0 alone materializes (or loads --init-from) and
// broadcasts. Rank 1 is pointed at other weights of the same shapes: with the
// flag its files are not read and the run equals one where every rank loads
// rank 0's weights; without it the run differs (so the comparison can fail).
TEST(Train, SyncModuleStatesTakesRankZerosWeights) {
  const std::string dir = testing::temp_dir("train-sync");
  const std::string a = dir + "/hf-a", b = dir + "/hf-b";
  if (!testing::is_worker()) {
    for (const auto& [out, seed] : {std::pair{a, 1}, std::pair{b, 2}}) {
      Command c = run_command(kTrainBin + tiny_flags() + " --max-steps 1 --seed " + std::to_string(seed) +
                              " --export-hf " + out);
      ASSERT_EQ(c.exit_code, 0) << c.output;
    }
  }
  auto run = [&](const std::string& tag, const std::string& rank1_from, bool sync) {
    testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
      train::TrainOptions o = tiny_options();
      o.step.batch_size = 2;
      o.hf.init_from = pg.rank() == 0 ? a : rank1_from;
      o.fsdp.sync_module_states = sync;
      auto s = train::train(o, runtime_of(pg, pg.size()));
      if (pg.rank() == 0) {
        std::ofstream out(dir + "/" + tag);
        for (const auto& r : s.steps) out << std::setprecision(17) << r.loss << "\n";
      }
    });
  };
  run("all-a", a, false);
  run("sync", b, true);
  run("mixed", b, false);
  if (testing::is_worker()) return;
  const std::string all_a = testing::read_file(dir + "/all-a");
  ASSERT_EQ(testing::count(all_a, "\n"), 8u) << all_a;
  EXPECT_EQ(testing::read_file(dir + "/sync"), all_a);
  EXPECT_NE(testing::read_file(dir + "/mixed"), all_a);
}

// From the command line, with and without --init-from, on 1 and 2 processes:
// --sync-module-states gives the same run as each rank initializing (or
// loading) its own shards.
TEST(TrainCli, SyncModuleStatesMatchesShardedInit) {
  const std::string dir = testing::temp_dir("train-sync-cli");
  Command c = run_command(kTrainBin + tiny_flags() + " --max-steps 1 --export-hf " + dir + "/hf");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const std::string from : {std::string(), " --init-from " + dir + "/hf"}) {
    for (int n : {1, 2}) {
      std::string metrics[2];
      for (int sync : {0, 1}) {
        metrics[sync] = dir + "/m" + std::to_string(n) + std::to_string(sync) + (from.empty() ? "" : "-hf");
        const std::string flags = tiny_flags() + from + " --nproc-per-node " +
                                  std::to_string(n) + (sync ? " --sync-module-states" : "") + " --metrics-file " +
                                  metrics[sync];
        Command r = run_command(kTrainBin + flags);
        ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
        if (sync) EXPECT_NE(r.output.find("--sync-module-states: rank 0's"), std::string::npos) << r.output;
      }
      // Losses (the first field of each record that differs is timing, so compare the losses).
      auto losses = [](const std::string& path) {
        std::vector<double> v;
        std::ifstream in(path);
        for (std::string line; std::getline(in, line);) {
          auto j = nlohmann::json::parse(line);
          if (j.contains("loss")) v.push_back(j["loss"].get<double>());
        }
        return v;
      };
      const auto l0 = losses(metrics[0]);
      EXPECT_FALSE(l0.empty());
      EXPECT_EQ(losses(metrics[1]), l0) << "n=" << n << from;
    }
  }
}

TEST(TrainCli, HelpDocumentsTheFlags) {
  Command c = run_command(kTrainBin + " --help");
  EXPECT_EQ(c.exit_code, 0);
  for (const char* flag : {"--model", "--data", "--token-dtype", "--seq-len", "--batch-size", "--grad-accum", "--lr",
                           "--warmup-steps", "--min-lr", "--weight-decay", "--clip-grad", "--max-steps", "--seed",
                           "--log-every", "--metrics-file", "--nproc-per-node", "--device", "--sharding", "--wrap",
                           "--hybrid-shard-size", "--checkpoint-dir", "--checkpoint-every", "--keep-last",
                           "--resume", "--init-from", "--export-hf", "--export-dtype", "--export-shard-size",
                           "--val-data", "--eval-every", "--eval-windows", "--eval-only", "--mixed-precision",
                           "--reduce-dtype", "--activation-checkpointing", "--offload-activations", "--cpu-offload",
                           "--backward-prefetch", "--forward-prefetch", "--limit-all-gathers", "--loss-scaling",
                           "--initial-loss-scale"}) {
    EXPECT_NE(c.output.find(flag), std::string::npos) << flag;
  }
}

// Bad input: one line naming the flag or file and the accepted values, exit
// code 2, never a stack trace.
TEST(TrainCli, BadInputIsAOneLineUsageError) {
  const std::string dir = testing::temp_dir("train-bad");
  {
    // token ids beyond the tiny model's 512-token vocabulary
    std::ofstream bin(dir + "/big.bin", std::ios::binary);
    for (uint16_t i = 0; i < 200; ++i) {
      const uint16_t v = i == 150 ? 60000 : i;
      bin.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  std::filesystem::create_directories(dir + "/ckpt/step_00000010");  // another run's checkpoint
  std::ofstream(dir + "/ckpt/step_00000010/manifest.json") << "{}";
  std::filesystem::create_directories(dir + "/foreign");
  std::ofstream(dir + "/foreign/notes.txt") << "not an export";
  struct Case {
    std::string args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"--model nosuch --data " + kCorpus, "nosuch"},
      {"--model tiny --data /nonexistent/corpus.txt", "/nonexistent/corpus.txt"},
      {"--model tiny --data " + kCorpus + " --seq-len 100000", "--seq-len"},
      {"--model tiny --data " + kCorpus + " --batch-size 0", "--batch-size"},
      {"--model tiny --data " + kCorpus + " --batch-size 2 --global-batch-size 5", "--global-batch-size 5 is not a multiple"},
      {"--model tiny --data " + kCorpus + " --global-batch-size 16 --grad-accum 3", "give one or the other"},
      {"--model tiny --data " + kCorpus + " --stop-at-step 12 --max-steps 10", "--stop-at-step must be in [0, --max-steps 10]"},
      {"--model tiny --data " + kCorpus + " --stop-at-step 2", "needs its state: give --checkpoint-dir"},
      {"--model tiny --data " + dir + "/big.bin --seq-len 16", "60000"},
      {"--model tiny --data " + kCorpus + " --sharding half", "full, grad-op, none, hybrid"},
      {"--model tiny --data " + kCorpus + " --wrap leaves", "block, size:N, root"},
      {"--model tiny --data " + kCorpus + " --mixed-precision fp8", "--mixed-precision"},
      {"--model tiny --data " + kCorpus + " --reduce-dtype fp64", "--reduce-dtype"},
      {"--model tiny --data " + kCorpus + " --backward-prefetch later", "--backward-prefetch"},
      {"--model tiny --data " + kCorpus + " --limit-all-gathers 0", "--limit-all-gathers must be >= 1"},
      {"--model tiny --data " + kCorpus + " --offload-activations", "--activation-checkpointing"},
      {"--model tiny --data " + kCorpus + " --initial-loss-scale -1", "--initial-loss-scale"},
      {"--model tiny --data " + kCorpus + " --sharding hybrid --hybrid-shard-size 3 --nproc-per-node 2",
       "not a multiple of the hybrid shard size 3"},
      {"--model tiny --data " + kCorpus + " --token-dtype u8", "--token-dtype"},
      {"--model tiny --data " + kCorpus + " --device tpu", "--device"},
      {"--model tiny --data " + kCorpus + " --device cuda:x", "cpu, cuda, cuda:N"},
      // No GPU here: the CPU build names the build, the CUDA build the count it sees.
      {"--model tiny --data " + kCorpus + " --device cuda:0 --nproc-per-node 2", "--device cuda"},
      {"--model tiny --data " + kCorpus + " --nproc-per-node 2 --batch-size 0", "--batch-size"},
      {"--model tiny --data " + kCorpus + " --no-such-flag", "--no-such-flag"},
      {"--model tiny --data " + kCorpus + " --resume", "--resume needs --checkpoint-dir"},
      {"--model tiny --data " + kCorpus + " --checkpoint-every 5", "--checkpoint-every needs --checkpoint-dir"},
      {"--model tiny --data " + kCorpus + " --eval-every 5", "--eval-every needs --val-data"},
      {"--model tiny --data " + kCorpus + " --val-data /nonexistent/val.jsonl --eval-every 5", "/nonexistent/val.jsonl"},
      {"--model tiny --data " + kCorpus + " --val-data " + kCorpus + " --eval-only", "--eval-only evaluates existing weights"},
      {"--model tiny --data " + kCorpus + " --init-from /nonexistent/hf", "/nonexistent/hf"},
      {"--model tiny --data " + kCorpus + " --export-hf " + dir + "/foreign", "notes.txt"},
      {"--model tiny --data " + kCorpus + " --export-hf " + dir + "/new --export-shard-size 5XB", "--export-shard-size"},
      {"--model tiny --data " + kCorpus + " --export-hf " + dir + "/new --export-dtype int8", "--export-dtype"},
      {"--model tiny --data " + kCorpus + " --checkpoint-dir " + dir + "/big.bin", "is not a directory"},
      {"--model tiny --data " + kCorpus + " --checkpoint-dir " + dir + "/ckpt", "add --resume"},
      {"--model tiny --data " + kCorpus + " --profile-steps 5", "is not A:B"},
      {"--model tiny --data " + kCorpus + " --profile-steps 5:x", "is not A:B"},
      {"--model tiny --data " + kCorpus + " --profile-steps 5:3", "must be after the start 5"},
      {"--model tiny --data " + kCorpus + " --profile-steps 20:30 --max-steps 10", "nothing would be traced"},
      {"--model tiny --data " + kCorpus + " --profile-steps 1:2 --profile-file /nonexistent/t.json", "/nonexistent"},
      {"--model tiny --data " + kCorpus + " --tensorboard " + dir + "/big.bin", "--tensorboard"},
      {"--config /nonexistent/run.toml", "/nonexistent/run.toml"},
      // An encoder-decoder's flags and data (models.md, T5).
      {"--model tiny --data " + kCorpus + " --target-len 8", "--target-len is the decoder's width"},
      {"--model t5-tiny --data " + kCorpus + " --data-format text", "(input, target) pairs from JSON lines"},
      {"--model t5-tiny --data " + kCorpus + " --seq-len 16", "no field \"input\""},
      {"--model t5-tiny --data " + kCorpus + " --seq-len 16 --input-field text --target-field text",
       "must name two different fields"},
  };
  // --device cuda is a usage error only where it cannot run: a CPU-only build
  // says so; a CUDA build on a machine without a GPU names the device count;
  // with a GPU it trains (the cuda-labelled tests cover that).
  if (!cuda_built()) {
    cases.push_back({"--model tiny --data " + kCorpus + " --device cuda", "CPU-only"});
  } else if (cuda_device_count() == 0) {
    cases.push_back({"--model tiny --data " + kCorpus + " --device cuda", "sees 0 devices"});
  }
  for (const auto& k : cases) {
    Command c = run_command(kTrainBin + " " + k.args);
    EXPECT_EQ(c.exit_code, 2) << k.args << "\n" << c.output;
    EXPECT_NE(c.output.find(k.expect), std::string::npos) << k.args << "\n" << c.output;
    EXPECT_EQ(c.output.find("frame #"), std::string::npos) << "stack trace for " << k.args << "\n" << c.output;
    EXPECT_LE(std::count(c.output.begin(), c.output.end(), '\n'), 2) << k.args << "\n" << c.output;
  }
}

// fsdp-train trains with every strategy on 2 and 4 local processes; the
// metrics file has the documented fields.
TEST(TrainCli, EveryStrategyOnTwoAndFourProcesses) {
  const std::string dir = testing::temp_dir("train-cli");
  for (const std::string s : {"full", "grad-op", "none", "hybrid"}) {
    for (int n : {2, 4}) {
      const std::string metrics = dir + "/m-" + s + "-" + std::to_string(n) + ".jsonl";
      std::string cmd = kTrainBin + tiny_flags() + " --sharding " + s + " --nproc-per-node " + std::to_string(n) +
                        " --metrics-file " + metrics;
      if (s == "hybrid") cmd += " --hybrid-shard-size 2";
      Command c = run_command(cmd);
      ASSERT_EQ(c.exit_code, 0) << cmd << "\n" << c.output;
      EXPECT_NE(c.output.find("Batch 2 Loss: "), std::string::npos) << c.output;
      std::ifstream in(metrics);
      std::string line;
      int lines = 0;
      while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line);
        for (const char* k : {"step", "loss", "lr", "samples_per_s", "tokens_per_s", "step_time_s", "peak_mem_bytes",
                              "allgather_bytes", "reduce_scatter_bytes", "allreduce_bytes"}) {
          EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
        }
        EXPECT_EQ(j["world_size"].get<int>(), n);
        if (s == "none") {
          EXPECT_EQ(j["allgather_bytes"].get<int64_t>(), 0);
          EXPECT_GT(j["allreduce_bytes"].get<int64_t>(), 0);
        } else {
          EXPECT_GT(j["allgather_bytes"].get<int64_t>(), 0);
          EXPECT_GT(j["reduce_scatter_bytes"].get<int64_t>(), 0);
        }
        ++lines;
      }
      EXPECT_EQ(lines, 3) << metrics;
    }
  }
}

// The memory and precision flags, combined, on 2 processes; bf16 parameters
// halve the all-gather bytes of the same run in fp32 (the reduction stays fp32).
TEST(TrainCli, MemoryAndPrecisionFlagsOnTwoProcesses) {
  const std::string dir = testing::temp_dir("train-mem");
  auto bytes = [&](const std::string& metrics, const char* key) {
    return testing::read_metrics(metrics).at(0)[key].get<int64_t>();
  };
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"fp32", ""},
      {"bf16", " --mixed-precision bf16 --activation-checkpointing --offload-activations --cpu-offload "
               "--backward-prefetch post --forward-prefetch --limit-all-gathers 1"},
      {"pure", " --mixed-precision bf16-pure --sharding grad-op --backward-prefetch none"},
  };
  for (const auto& [name, flags] : runs) {
    const std::string cmd = kTrainBin + tiny_flags() + " --nproc-per-node 2 --metrics-file " + dir + "/" + name +
                            ".jsonl" + flags;
    Command c = run_command(cmd);
    ASSERT_EQ(c.exit_code, 0) << cmd << "\n" << c.output;
    EXPECT_NE(c.output.find("Batch 2 Loss: "), std::string::npos) << c.output;
    EXPECT_NE(c.output.find("memory per rank: parameter shards"), std::string::npos) << c.output;
  }
  EXPECT_EQ(2 * bytes(dir + "/bf16.jsonl", "allgather_bytes"), bytes(dir + "/fp32.jsonl", "allgather_bytes"));
  EXPECT_EQ(bytes(dir + "/bf16.jsonl", "reduce_scatter_bytes"), bytes(dir + "/fp32.jsonl", "reduce_scatter_bytes"));
}

// Note [Last units kept]: by default the output head and the last decoder layer
// keep their parameters after forward, so a step all-gathers every unit's
// buffer once less for those two than with --reshard-after-forward true (every
// unit reshards); the losses stay the same to the digit.
TEST(TrainCli, TheHeadAndTheLastLayerKeepTheirParametersAfterForward) {
  const std::string dir = testing::temp_dir("train-kept");
  auto first_step = [&](const std::string& name) { return testing::read_metrics(dir + "/" + name + ".jsonl").at(0); };
  std::string log;
  for (const auto& [name, flags] : std::vector<std::pair<std::string, std::string>>{
           {"default", ""}, {"every", " --reshard-after-forward true"}}) {
    const std::string cmd =
        kTrainBin + tiny_flags() + " --nproc-per-node 2 --metrics-file " + dir + "/" + name + ".jsonl" + flags;
    Command c = run_command(cmd);
    ASSERT_EQ(c.exit_code, 0) << cmd << "\n" << c.output;
    if (name == "default") log = c.output;
  }
  // The two units' gathered buffers, from the plan the log prints ("unit 'NAME' TYPE: P params, E elements,
  // padded N, shard S"): the head and the highest-numbered layer.
  auto padded = [&](const std::string& unit) -> int64_t {
    const size_t at = log.find("unit '" + unit + "'");
    if (at == std::string::npos) return -1;
    const size_t p = log.find("padded ", at);
    return std::stoll(log.substr(p + 7));
  };
  int last = -1;
  while (log.find("unit 'model.layers." + std::to_string(last + 1) + "'") != std::string::npos) ++last;
  ASSERT_GE(last, 1) << log;
  const int64_t head = padded("lm_head"), layer = padded("model.layers." + std::to_string(last));
  ASSERT_GT(head, 0) << log;
  ASSERT_GT(layer, 0) << log;
  const nlohmann::json kept = first_step("default"), every = first_step("every");
  EXPECT_EQ(every["allgather_bytes"].get<int64_t>() - kept["allgather_bytes"].get<int64_t>(),
            (head + layer) * static_cast<int64_t>(sizeof(float)))
      << "default " << kept.dump() << "\nevery unit resharded " << every.dump();
  EXPECT_EQ(kept["reduce_scatter_bytes"], every["reduce_scatter_bytes"]);
  EXPECT_EQ(kept["loss"], every["loss"]);
}

// A worker that dies makes the launcher stop the others and report which rank
// failed and how. Rank 1 is killed with SIGKILL once training has started.
TEST(TrainCli, LauncherReportsAKilledRank) {
  const std::string dir = testing::temp_dir("train-kill");
  const std::string script = dir + "/kill.sh";
  {
    std::ofstream sh(script);
    sh << "set -u\n"
       << kTrainBin << tiny_flags() << " --max-steps 100000 --nproc-per-node 2 > " << dir << "/log 2>&1 &\n"
       << "L=$!\n"
       << "for i in $(seq 1 1200); do grep -q 'Batch 1 Loss' " << dir << "/log && break; sleep 0.1; done\n"
       << "for p in $(pgrep -P $L); do tr '\\0' '\\n' < /proc/$p/environ | grep -qx RANK=1 && kill -9 $p; done\n"
       << "wait $L; echo \"launcher exit $?\"\n"
       << "cat " << dir << "/log\n";
  }
  Command c = run_command("bash " + script);
  EXPECT_NE(c.output.find("launcher exit 137"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("rank 1 was killed by signal 9"), std::string::npos) << c.output;
  // No worker is left behind (the bracket keeps the pattern from matching this shell).
  EXPECT_EQ(run_command("pgrep -f 'max-steps 10000[0] --nproc-per-node 2'").output.find_first_of("0123456789"),
            std::string::npos);
}

}  // namespace fsdp

// fsdp-train against hostile directories and outputs (issue 16, findings 1
// and 5): what it did not create is never deleted, one run at a time writes a
// directory, outputs that cannot be written are refused before training, and
// write errors and non-finite results are errors, never a silent exit 0.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>

#include "fsdp/checkpoint/safetensors.h"
#include "support/multiproc.h"
#include "train_test_util.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using testing::Command;
using testing::kCorpus;
using testing::kTrainBin;
using testing::kValCorpus;
using testing::run_command;

// fsdp-train for `max_steps` steps on the tiny model.
std::string flags(int max_steps) { return testing::tiny_train_command(max_steps); }

void write_notes(const std::string& dir) {
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "notes";
}

// Runs `script` (bash) with its output; `script` is written to a file first.
Command run_script(const std::string& dir, const std::string& script, int limit_s = 120) {
  std::ofstream(dir + "/run.sh") << "set -u\n" << script;
  return run_command("bash " + dir + "/run.sh", limit_s);
}

#define EXPECT_REFUSED_BEFORE_TRAINING(c, code, needle)                                     \
  do {                                                                                      \
    EXPECT_EQ((c).exit_code, code) << (c).output;                                           \
    EXPECT_NE((c).output.find(needle), std::string::npos) << (c).output;                    \
    EXPECT_EQ((c).output.find("Batch "), std::string::npos) << "trained first: " << (c).output; \
  } while (0)

}  // namespace

// Finding 1: the reproduction (a user's step_00000002 under
// --checkpoint-dir) and an export next to someone else's .tmp-out / .old-out:
// refused at start with exit 2 naming the path; every file survives.
TEST(TrainCli, NeverDeletesWhatItDidNotCreate) {
  const std::string dir = testing::temp_dir("cli-foreign");
  write_notes(dir + "/ck/step_00000002");
  Command c = run_command(flags(4) + " --checkpoint-dir " + dir + "/ck --checkpoint-every 2", 120);
  EXPECT_REFUSED_BEFORE_TRAINING(c, 2, "holds step_00000002 (no manifest.json): named like a checkpoint but not one");
  EXPECT_TRUE(fs::exists(dir + "/ck/step_00000002/notes.txt"));

  write_notes(dir + "/hf/.tmp-out");
  Command t = run_command(flags(1) + " --export-hf " + dir + "/hf/out", 120);
  EXPECT_REFUSED_BEFORE_TRAINING(t, 2, dir + "/hf/.tmp-out exists but was not created by fsdp-cpp");
  EXPECT_TRUE(fs::exists(dir + "/hf/.tmp-out/notes.txt"));
  fs::remove_all(dir + "/hf/.tmp-out");

  // A previous export in out/ and someone's .old-out beside it.
  ASSERT_EQ(run_command(flags(1) + " --export-hf " + dir + "/hf/out", 120).exit_code, 0);
  EXPECT_FALSE(fs::exists(dir + "/hf/out/.fsdp-cpp-owned")) << "the model directory carries no marker of ours";
  write_notes(dir + "/hf/.old-out");
  Command o = run_command(flags(1) + " --export-hf " + dir + "/hf/out", 120);
  EXPECT_REFUSED_BEFORE_TRAINING(o, 2, dir + "/hf/.old-out exists but was not created by fsdp-cpp");
  EXPECT_TRUE(fs::exists(dir + "/hf/.old-out/notes.txt"));
  EXPECT_TRUE(fs::exists(dir + "/hf/out/model.safetensors"));
}

// One writer per directory: while another process holds the lock of
// --checkpoint-dir (or of an --export-hf target), a run is refused with exit 2
// naming the holder, on every rank. The lock is held here by the test's shell
// (flock(1) on the same lock file).
TEST(TrainCli, ASecondRunOnTheSameDirectoryIsRefused) {
  const std::string dir = testing::temp_dir("cli-lock");
  Command c = run_script(dir, "mkdir -p " + dir + "/ck\n"
                         "echo 'pid 4242 on host elsewhere' > " + dir + "/ck/.lock\n"
                         "exec 9<" + dir + "/ck/.lock\nflock -n 9 || exit 99\n" +
                         flags(2) + " --nproc-per-node 2 --checkpoint-dir " + dir + "/ck\n");
  EXPECT_REFUSED_BEFORE_TRAINING(c, 2, "--checkpoint-dir " + dir + "/ck is in use by another fsdp-cpp process (pid "
                                       "4242 on host elsewhere");
  EXPECT_FALSE(fs::exists(dir + "/ck/step_00000002"));

  Command e = run_script(dir, "echo 'pid 4343 on host elsewhere' > " + dir + "/.out.lock\n"
                         "exec 9<" + dir + "/.out.lock\nflock -n 9 || exit 99\n" +
                         flags(1) + " --export-hf " + dir + "/out\n");
  EXPECT_EQ(e.exit_code, 2) << e.output;
  EXPECT_NE(e.output.find("--export-hf " + dir + "/out is in use by another fsdp-cpp process (pid 4343"),
            std::string::npos) << e.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));

  // Unlocked, the same commands run; the lock files are gone afterwards.
  Command ok = run_command(flags(2) + " --nproc-per-node 2 --checkpoint-dir " + dir + "/ck --export-hf " + dir + "/out",
                           120);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir + "/ck/step_00000002/manifest.json"));
  EXPECT_FALSE(fs::exists(dir + "/ck/.lock"));
  EXPECT_FALSE(fs::exists(dir + "/.out.lock"));
}

// Finding 5: outputs that cannot be written are refused before training
// (exit 2); a metrics file that fails on write fails the run (exit 1); a loss
// scale of inf or nan is refused.
TEST(TrainCli, OutputsThatCannotBeWrittenAreErrors) {
  const std::string dir = testing::temp_dir("cli-outputs");
  std::ofstream(dir + "/a-file") << "not a directory";
  Command ck = run_command(flags(2) + " --checkpoint-dir " + dir + "/a-file/ck", 60);
  EXPECT_REFUSED_BEFORE_TRAINING(ck, 2, "--checkpoint-dir " + dir + "/a-file/ck cannot be created: " + dir +
                                            "/a-file is not a directory");
  Command hf = run_command(flags(2) + " --export-hf " + dir + "/a-file/out", 60);
  EXPECT_REFUSED_BEFORE_TRAINING(hf, 2, "--export-hf " + dir + "/a-file/out: directory " + dir +
                                            "/a-file exists and is not a directory");
  Command metrics = run_command(flags(2) + " --metrics-file /dev/full", 60);
  EXPECT_EQ(metrics.exit_code, 1) << metrics.output;
  EXPECT_NE(metrics.output.find("--metrics-file /dev/full: writing failed (No space left on device)"),
            std::string::npos) << metrics.output;
  for (const char* scale : {"inf", "nan"}) {
    Command s = run_command(flags(2) + " --loss-scaling on --initial-loss-scale " + scale, 60);
    // The command line's strict number parsing refuses it (the trainer's own check covers the API).
    EXPECT_REFUSED_BEFORE_TRAINING(s, 2, std::string("--initial-loss-scale: '") + scale + "' is not a finite number");
  }
}

// Finding 5: --eval-only on weights that produce NaN is an error (exit 1)
// saying so, never "Eval Loss: nan" and exit 0. Weights that hold a NaN are
// refused as they are read (exit 2, naming the tensor and file); finite weights
// whose logits overflow reach the evaluation's own check.
TEST(TrainCli, ANonFiniteEvalLossIsAnError) {
  const std::string dir = testing::temp_dir("cli-nan-eval");
  ASSERT_EQ(run_command(flags(1) + " --export-hf " + dir + "/hf", 120).exit_code, 0);
  const std::string path = dir + "/hf/model.safetensors";
  const auto rewrite = [&](const std::function<void(const std::string&, at::Tensor&)>& change) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    {
      checkpoint::SafetensorsFile f(path);
      for (const auto& e : f.entries()) {
        at::Tensor t = f.tensor(e.name).clone();
        change(e.name, t);
        tensors.emplace_back(e.name, t);
      }
    }
    checkpoint::save_safetensors(path, tensors);
  };
  const std::string eval = kTrainBin + " --init-from " + dir + "/hf --data " + kCorpus + " --val-data " + kValCorpus +
                           " --seq-len 32 --batch-size 2 --eval-only";
  const std::string original = dir + "/original.safetensors";
  std::filesystem::copy_file(path, original);

  rewrite([](const std::string&, at::Tensor& t) { t.fill_(std::numeric_limits<float>::quiet_NaN()); });
  Command nan = run_command(eval, 120);
  EXPECT_EQ(nan.exit_code, 2) << nan.output;
  EXPECT_NE(nan.output.find("model.safetensors holds NaN at element 0 — the weights are damaged"), std::string::npos)
      << nan.output;
  EXPECT_EQ(nan.output.find("Eval Loss:"), std::string::npos) << nan.output;

  std::filesystem::copy_file(original, path, std::filesystem::copy_options::overwrite_existing);
  rewrite([](const std::string& name, at::Tensor& t) {
    if (name == "lm_head.weight") t.fill_(3e38f);  // finite, but the logits overflow to inf
  });
  Command e = run_command(eval, 120);
  EXPECT_EQ(e.exit_code, 1) << e.output;
  EXPECT_NE(e.output.find("at step 0: the weights or the --val-data produce NaN/inf"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("Eval Loss:"), std::string::npos) << e.output;
}

}  // namespace fsdp

// fsdp-train end to end with checkpoints, preemption, Hugging Face files,
// evaluation and torchrun: the binary, real processes, signals sent from the
// test scripts (the product has no test hooks).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "support/multiproc.h"
#include "train_test_util.h"

namespace fsdp {
namespace {

namespace fs = std::filesystem;
using testing::Command;
using testing::count;
using testing::kCorpus;
using testing::kTrainBin;
using testing::kValCorpus;
using testing::read_file;
using testing::read_metrics;
using testing::run_command;

// fsdp-train for `max_steps` steps on the tiny model, logging every step.
std::string flags(int max_steps) { return testing::tiny_train_command(max_steps, " --lr 1e-3 --log-every 1"); }

// Shell snippet: the pid of the worker with RANK=<rank> among processes whose
// command line matches <pattern> (the launcher and torchrun have no RANK).
std::string find_rank_fn() {
  return "rank_pid() { for p in $(pgrep -f \"$1\"); do tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | "
         "grep -qx \"RANK=$2\" && { echo $p; return; }; done; }\n";
}

// Waits (up to 60 s) for a file or directory.
std::string wait_for(const std::string& path) {
  return "for i in $(seq 1 600); do [ -e " + path + " ] && break; sleep 0.1; done\n";
}

// The step after which a SIGTERM stopped the run (the lead's "stopped by
// SIGTERM after N steps"); -1 when the log has no such line.
int sigterm_step(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("stopped by SIGTERM after (\\d+) steps")) ? std::stoi(m[1].str()) : -1;
}

// Checkpoint `step`'s directory name, step_NNNNNNNN (spelled out here, not taken from the library).
std::string step_dir(int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08d", step);
  return name;
}

// torchrun starting 2 workers on this host (the command follows), its own logs in DIR/torchrun-logs.
std::string torchrun_two_workers(const std::string& dir, int max_restarts) {
  return "torchrun --no_python --redirects 1 --tee 1 --standalone --nnodes 1 --nproc_per_node 2 --max_restarts " +
         std::to_string(max_restarts) + " --log_dir " + dir + "/torchrun-logs ";
}

// No process of this test is left behind.
void expect_no_leftovers(const std::string& marker) {
  // The bracket keeps the pattern from matching the shell that runs pgrep.
  Command c = run_command("pgrep -f '[" + marker.substr(0, 1) + "]" + marker.substr(1) + "' || true");
  EXPECT_EQ(c.output.find_first_of("0123456789"), std::string::npos) << "left behind: " << c.output;
}

// What identifies the processes of a run of `max_steps` at 2 processes into DIR/ckpt (for pgrep).
std::string run_marker(const std::string& dir, int max_steps) {
  return "max-steps " + std::to_string(max_steps) + " --nproc-per-node 2 --checkpoint-dir " + dir;
}

// fsdp-train for `max_steps` at 2 processes with --checkpoint-dir DIR/ckpt and `extra`, its output in
// DIR/log; SIGTERM to rank 1 once step 3 is logged. Returns the script's output ("launcher exit N").
Command sigterm_rank_1(const std::string& dir, int max_steps, const std::string& extra) {
  {
    std::ofstream sh(dir + "/run.sh");
    sh << "set -u\n" << find_rank_fn()
       << flags(max_steps) << " --nproc-per-node 2 --checkpoint-dir " << dir << "/ckpt" << extra << " > " << dir
       << "/log 2>&1 &\n"
       << "L=$!\n"
       << "for i in $(seq 1 600); do grep -q 'Batch 3 Loss' " << dir << "/log && break; sleep 0.1; done\n"
       << "kill -TERM $(rank_pid '" << run_marker(dir, max_steps) << "' 1)\n"
       << "wait $L; echo \"launcher exit $?\"\n";
  }
  return run_command("bash " + dir + "/run.sh", 120);
}

}  // namespace

// SIGTERM to ONE worker (signals reach ranks at different times): every rank
// finishes the step, a checkpoint is saved, the job exits 0, and --resume
// continues from that step. Without --checkpoint-dir, SIGTERM to the launcher
// stops the run after the step with exit code 143 and says nothing was saved.
TEST(TrainCli, SigtermSavesACheckpointAndResumeContinues) {
  const std::string dir = testing::temp_dir("cli-sigterm");
  const std::string marker = run_marker(dir, 400);
  Command c = sigterm_rank_1(dir, 400, "");
  const std::string log = read_file(dir + "/log");
  EXPECT_NE(c.output.find("launcher exit 0"), std::string::npos) << c.output << log;
  const int n = sigterm_step(log);
  ASSERT_GE(n, 0) << log;
  EXPECT_GE(n, 4);
  const std::string name = step_dir(n);
  EXPECT_TRUE(fs::exists(dir + "/ckpt/" + name + "/manifest.json")) << log;
  EXPECT_NE(log.find(std::string("Saved checkpoint ") + name), std::string::npos) << log;
  expect_no_leftovers(marker);

  // Resume on one process, for 2 more steps.
  Command r = run_command(flags(n + 2) + " --checkpoint-dir " + dir + "/ckpt --resume", 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Resumed from " + dir + "/ckpt/" + name + " (step " + std::to_string(n) + ")"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Batch " + std::to_string(n) + " Loss"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Batch " + std::to_string(n - 1) + " Loss"), std::string::npos) << r.output;

  // No --checkpoint-dir: exit 143, nothing saved, said so.
  {
    std::ofstream sh(dir + "/run2.sh");
    sh << "set -u\n"
       << flags(400) << " --nproc-per-node 2 > " << dir << "/log2 2>&1 &\n"
       << "L=$!\n"
       << "for i in $(seq 1 600); do grep -q 'Batch 2 Loss' " << dir << "/log2 && break; sleep 0.1; done\n"
       << "kill -TERM $L\n"
       << "wait $L; echo \"launcher exit $?\"\n";
  }
  Command c2 = run_command("bash " + dir + "/run2.sh", 120);
  const std::string log2 = read_file(dir + "/log2");
  EXPECT_NE(c2.output.find("launcher exit 143"), std::string::npos) << c2.output << log2;
  EXPECT_NE(log2.find("the training state was NOT saved"), std::string::npos) << log2;
}

// A worker SIGKILLed in the middle of a save (frozen with SIGSTOP while the
// temporary directory exists and the checkpoint is not yet complete, then
// killed): the half-written directory is never taken for a checkpoint; the
// resume removes it and continues from the previous complete checkpoint.
// `extra`: more flags (--async-checkpoint: the save's writer thread runs
// beside the next step, which the commit follows).
namespace {

void crash_during_a_save(const std::string& tag, const std::string& extra) {
  const std::string dir = testing::temp_dir(tag);
  const std::string ck = dir + "/ckpt";
  const std::string marker = "max-steps 100000 --nproc-per-node 2 --checkpoint-dir " + ck;
  {
    std::ofstream sh(dir + "/run.sh");
    sh << "set -u\nshopt -s nullglob\n" << find_rank_fn()
       << flags(100000) << " --nproc-per-node 2 --checkpoint-dir " << ck << " --checkpoint-every 1" << extra << " > "
       << dir << "/log 2>&1 &\n"
       << "L=$!\n"
       << "for i in $(seq 1 600); do grep -q 'Batch 2 Loss' " << dir << "/log && break; sleep 0.1; done\n"
       << "R1=$(rank_pid '" << marker << "' 1)\n"
       << "for attempt in $(seq 1 100); do\n"
       << "  t=()\n"
       << "  while ((${#t[@]} == 0)); do t=(" << ck << "/.tmp-step_*); done\n"  // busy-wait for a save to start
       << "  kill -STOP $R1\n"
       << "  n=${t[0]##*.tmp-}\n"
       << "  sleep 0.5\n"
       << "  if [ -d " << ck << "/$n ]; then kill -CONT $R1; sleep 0.05; continue; fi\n"  // it had finished: next save
       << "  kill -KILL $R1; echo \"killed during $n\"; break\n"
       << "done\n"
       << "wait $L; echo \"launcher exit $?\"\n";
  }
  Command c = run_command("bash " + dir + "/run.sh", 200);
  const std::string log = read_file(dir + "/log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(c.output, m, std::regex("killed during step_(\\d+)"))) << c.output << log;
  const int n = std::stoi(m[1].str());
  EXPECT_NE(c.output.find("launcher exit 137"), std::string::npos) << c.output << log;
  char tmp[64], prev[32];
  std::snprintf(tmp, sizeof(tmp), ".tmp-step_%08d", n);
  std::snprintf(prev, sizeof(prev), "step_%08d", n - 1);
  EXPECT_TRUE(fs::exists(ck + "/" + tmp)) << "the interrupted save's directory";
  EXPECT_FALSE(fs::exists(ck + "/" + std::string(tmp).substr(5))) << "an incomplete checkpoint became visible";
  EXPECT_TRUE(fs::exists(ck + "/" + prev + "/manifest.json")) << "the previous checkpoint";
  if (!extra.empty()) {  // the saves before the kill did go to the background
    EXPECT_NE(log.find("writing in the background"), std::string::npos) << log;
  }
  expect_no_leftovers(marker);

  Command r = run_command(flags(n + 1) + " --nproc-per-node 2 --checkpoint-dir " + ck + " --resume" + extra, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("removed " + ck + "/" + tmp + ", left by an interrupted save"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Resumed from " + ck + "/" + prev), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(ck + "/" + tmp));
  char last[32];
  std::snprintf(last, sizeof(last), "step_%08d", n + 1);
  EXPECT_TRUE(fs::exists(ck + "/" + last + "/manifest.json"));
}

}  // namespace

TEST(TrainCli, CrashDuringASaveKeepsThePreviousCheckpoint) { crash_during_a_save("cli-crash", ""); }

TEST(TrainCli, CrashDuringAnAsyncSaveKeepsThePreviousCheckpoint) {
  crash_during_a_save("cli-crash-async", " --async-checkpoint");
}

// --async-checkpoint: SIGTERM to one worker; the save of the stopping step
// goes to the background and the run waits for it before exiting 0.
TEST(TrainCli, SigtermWaitsForTheAsyncSaveInFlight) {
  const std::string dir = testing::temp_dir("cli-sigterm-async");
  const std::string marker = run_marker(dir, 401);
  Command c = sigterm_rank_1(dir, 401, " --checkpoint-every 1 --async-checkpoint --metrics-file " + dir + "/m.jsonl");
  const std::string log = read_file(dir + "/log");
  EXPECT_NE(c.output.find("launcher exit 0"), std::string::npos) << c.output << log;
  const int n = sigterm_step(log);
  ASSERT_GE(n, 0) << log;
  const std::string name = step_dir(n);
  EXPECT_TRUE(fs::exists(dir + "/ckpt/" + name + "/manifest.json")) << log;
  const size_t saved = log.find("Saved checkpoint " + name);
  EXPECT_NE(saved, std::string::npos) << log;
  EXPECT_LT(saved, log.find("stopped by SIGTERM")) << log;
  EXPECT_NE(log.find("writing in the background"), std::string::npos) << log;
  EXPECT_NE(log.find("its commit held training"), std::string::npos) << log;
  // Every step record says what the saves since the previous one cost; the
  // staging buffers, once made, stay (reused by the next save).
  const auto records = read_metrics(dir + "/m.jsonl");
  ASSERT_GE(records.size(), 3u) << log;
  for (size_t i = 1; i < records.size(); ++i) {
    EXPECT_GE(records[i].value("checkpoint_stall_s", -1.0), 0.0) << records[i].dump();
    EXPECT_GE(records[i].value("checkpoint_wait_s", -1.0), 0.0) << records[i].dump();
    EXPECT_GT(records[i].value("checkpoint_staging_bytes", int64_t{0}), 0) << records[i].dump();
  }
  expect_no_leftovers(marker);
}

// --async-checkpoint: a writer that fails (a file size limit: write() returns
// EFBIG) stops the run at the next step, or at the end, with exit code 1 and
// the error; nothing is left that looks like a checkpoint.
TEST(TrainCli, AsyncSaveErrorsStopTheRun) {
  const std::string dir = testing::temp_dir("cli-async-error");
  const std::string limited = "trap '' XFSZ; ulimit -f 16; exec ";  // 16 KiB per file; SIGXFSZ ignored
  struct Case {
    int max_steps;
    const char* every;
    const char* after;  // the step line the error follows
  };
  for (const Case k : {Case{5, " --checkpoint-every 2", "Batch 2 Loss"}, Case{2, "", "Batch 1 Loss"}}) {
    const std::string ck = dir + "/ckpt" + std::to_string(k.max_steps);
    Command r = run_command("bash -c \"" + limited + flags(k.max_steps) + " --checkpoint-dir " + ck + k.every +
                            " --async-checkpoint\"", 120);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    const size_t error = r.output.find("saving checkpoint " + ck + "/step_00000002 failed");
    EXPECT_NE(error, std::string::npos) << r.output;
    EXPECT_NE(r.output.find("File too large"), std::string::npos) << r.output;
    EXPECT_LT(r.output.find(k.after), error) << r.output;
    for (const auto& e : fs::directory_iterator(ck)) {
      EXPECT_NE(e.path().filename().string().rfind("step_", 0), 0u) << e.path() << " after a failed save";
    }
  }
}

// --keep-last prunes; a corrupted file in the newest checkpoint is reported by
// name and the resume falls back to the previous one.
TEST(TrainCli, KeepLastAndADamagedCheckpoint) {
  const std::string dir = testing::temp_dir("cli-damage");
  const std::string ck = dir + "/ckpt";
  Command c = run_command(flags(6) + " --nproc-per-node 2 --checkpoint-dir " + ck +
                          " --checkpoint-every 2 --keep-last 2", 120);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("removed old checkpoint step_00000002 (--keep-last 2)"), std::string::npos) << c.output;
  EXPECT_FALSE(fs::exists(ck + "/step_00000002"));
  EXPECT_TRUE(fs::exists(ck + "/step_00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(ck + "/step_00000006/manifest.json"));
  // Flip one byte in the middle of rank 1's file of the newest checkpoint.
  const std::string victim = ck + "/step_00000006/shard-00001-of-00002.bin";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char b;
    f.get(b);
    f.seekp(1000);
    f.put(static_cast<char>(b ^ 1));
  }
  // Warnings go to stderr (issue 16, finding 7): stdout here, stderr in a file.
  Command r = run_command("sh -c '" + flags(8) + " --checkpoint-dir " + ck +
                          " --resume --checkpoint-every 2 --keep-last 2 2>" + dir + "/resume.err'", 120);
  const std::string err = read_file(dir + "/resume.err");
  EXPECT_EQ(r.exit_code, 0) << r.output << err;
  EXPECT_NE(err.find("checkpoint step_00000006 is damaged: file shard-00001-of-00002.bin: checksum mismatch"),
            std::string::npos) << err;
  EXPECT_NE(err.find("trying the previous checkpoint"), std::string::npos) << err;
  EXPECT_EQ(r.output.find("damaged"), std::string::npos) << "a warning on stdout: " << r.output;
  EXPECT_NE(r.output.find("Resumed from " + ck + "/step_00000004 (step 4)"), std::string::npos) << r.output;
  // Training went on and replaced the damaged checkpoint with a good one.
  EXPECT_NE(r.output.find("Saved checkpoint step_00000006"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(ck + "/step_00000008/manifest.json"));
  EXPECT_FALSE(fs::exists(ck + "/step_00000004"));
  Command again = run_command(flags(8) + " --checkpoint-dir " + ck + " --resume --eval-only --val-data " + kValCorpus, 120);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("Resumed from " + ck + "/step_00000008 (step 8)"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("damaged"), std::string::npos) << again.output;
}

// Export to Hugging Face files (several, with an index), start from them on
// another world size, evaluate, export again in bfloat16; --model that
// disagrees with the directory's config.json is a usage error.
TEST(TrainCli, HuggingFaceExportInitFromAndEvalOnly) {
  const std::string dir = testing::temp_dir("cli-hf");
  Command c = run_command(flags(3) + " --nproc-per-node 2 --export-hf " + dir + "/hf --export-shard-size 1MB", 120);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("Exported Hugging Face weights (float32) to " + dir + "/hf"), std::string::npos) << c.output;
  const auto index = nlohmann::json::parse(read_file(dir + "/hf/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 3u);  // 3.7 MB in files of at most 1 MB
  for (const auto& f : files) EXPECT_LE(fs::file_size(dir + "/hf/" + f), 1'000'000u) << f;
  const auto config = nlohmann::json::parse(read_file(dir + "/hf/config.json"));
  EXPECT_EQ(config["dtype"], "float32");
  EXPECT_EQ(config["eos_token_id"], 257);

  std::vector<double> losses;
  for (const char* procs : {" --nproc-per-node 2", ""}) {
    const std::string metrics = dir + "/eval" + std::to_string(std::string(procs).size()) + ".jsonl";
    // The evaluation mode in both spellings: `fsdp-train eval` and --eval-only.
    const std::string mode = *procs != '\0' ? " eval" : "";
    const std::string flag = *procs != '\0' ? "" : " --eval-only";
    Command e = run_command(kTrainBin + mode + " --init-from " + dir + "/hf --data " + kCorpus + " --val-data " +
                                kValCorpus + " --seq-len 32 --batch-size 3" + flag + " --metrics-file " + metrics + procs,
                            120);
    ASSERT_EQ(e.exit_code, 0) << e.output;
    EXPECT_NE(e.output.find("Initialized from " + dir + "/hf (" + std::to_string(files.size()) + " files)"),
              std::string::npos) << e.output;
    EXPECT_EQ(count(e.output, "Eval Loss: "), 1u) << e.output;
    const auto m = read_metrics(metrics);
    ASSERT_EQ(m.size(), 1u);
    losses.push_back(m[0]["eval_loss"].get<double>());
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-6 * losses[1]);

  // Fine-tune from the export, evaluating periodically, export bf16.
  Command f = run_command(kTrainBin + " --init-from " + dir + "/hf --data " + kCorpus + " --val-data " + kValCorpus +
                              " --seq-len 32 --batch-size 2 --max-steps 2 --eval-every 1 --eval-windows 4 "
                              "--export-hf " + dir + "/hf-bf16 --export-dtype bfloat16 --metrics-file " + dir + "/ft.jsonl", 120);
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(count(f.output, "Eval Loss: "), 2u) << f.output;
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/hf-bf16/config.json"))["dtype"], "bfloat16");
  int evals = 0;
  for (const auto& j : read_metrics(dir + "/ft.jsonl")) evals += j.contains("eval_loss") && j.contains("step");
  EXPECT_EQ(evals, 2);

  Command bad = run_command(kTrainBin + " --init-from " + dir + "/hf --model small --data " + kCorpus, 60);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("describe different models"), std::string::npos) << bad.output;
}

// The one-command conversion of a sharded checkpoint (fsdp-train convert, and
// its deprecated spelling --max-steps 0 with --resume --checkpoint-dir
// --export-hf): no data is read (--data names no file), the model comes from
// the checkpoint, and at world sizes 1, 2 and 3 the files equal the training
// run's own export at world size 2, byte for byte.
TEST(TrainCli, ConvertACheckpointToHuggingFaceWithoutData) {
  const std::string dir = testing::temp_dir("cli-convert");
  Command c = run_command(flags(3) + " --nproc-per-node 2 --checkpoint-dir " + dir + "/ck --export-hf " + dir + "/run",
                          120);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* procs : {"1", "3"}) {
    const std::string out = dir + "/converted-" + procs;
    Command v = run_command(kTrainBin + " --resume --checkpoint-dir " + dir + "/ck --export-hf " + out +
                                " --max-steps 0 --data " + dir + "/no-such-corpus --nproc-per-node " + procs, 120);
    ASSERT_EQ(v.exit_code, 0) << v.output;
    EXPECT_NE(v.output.find("Loaded checkpoint " + dir + "/ck/step_00000003 (step 3"), std::string::npos) << v.output;
    EXPECT_EQ(v.output.find("Batch "), std::string::npos) << "a conversion trains nothing: " << v.output;
    // The old spelling still works, and says so once (not once per worker).
    EXPECT_EQ(testing::count(v.output, "--max-steps 0 to convert a checkpoint is deprecated; use 'fsdp-train "
                                       "convert"), 1u) << v.output;
    for (const char* file : {"model.safetensors", "config.json"}) {
      EXPECT_EQ(read_file(out + "/" + file), read_file(dir + "/run/" + file)) << procs << " ranks: " << file;
    }
  }
  // The conversion's own mode: the same files, no deprecation line.
  Command m = run_command(kTrainBin + " convert --checkpoint-dir " + dir + "/ck --export-hf " + dir +
                              "/converted-mode --nproc-per-node 2", 120);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_EQ(m.output.find("deprecated"), std::string::npos) << m.output;
  for (const char* file : {"model.safetensors", "config.json"}) {
    EXPECT_EQ(read_file(dir + "/converted-mode/" + file), read_file(dir + "/run/" + file)) << "convert: " << file;
  }
  auto refused = [&](const std::string& args, const std::string& needle) {
    Command r = run_command(kTrainBin + " --max-steps 0 " + args, 60);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  };
  refused("--resume --checkpoint-dir " + dir + "/ck", "missing: --export-hf OUT");
  refused("--resume --checkpoint-dir " + dir + "/ck --export-hf " + dir + "/x --model small",
          "--model small and the checkpoints in " + dir + "/ck describe different models");
  fs::create_directories(dir + "/empty");
  refused("--resume --checkpoint-dir " + dir + "/empty --export-hf " + dir + "/x", "holds no checkpoint");
  EXPECT_FALSE(fs::exists(dir + "/x"));
}

// torchrun (the project's Python environment, first on the tests' PATH): an
// elastic restart after a worker is SIGKILLed resumes from the newest
// checkpoint and finishes the run.
TEST(TrainCli, TorchrunElasticRestartResumesFromTheNewestCheckpoint) {
  ASSERT_EQ(run_command("sh -c 'command -v torchrun'").exit_code, 0)
      << "torchrun not found on PATH: it comes with the project's Python environment (scripts/venv.sh)";
  const std::string dir = testing::temp_dir("cli-torchrun");
  const std::string ck = dir + "/ckpt";
  const std::string marker = "max-steps 40 --checkpoint-dir " + ck;
  {
    std::ofstream sh(dir + "/run.sh");
    sh << "set -u\n" << find_rank_fn()
       << torchrun_two_workers(dir, /*max_restarts=*/1) << flags(40) << " --checkpoint-dir " << ck
       << " --checkpoint-every 5 --resume --metrics-file " << dir << "/m.jsonl > " << dir << "/log 2>&1 &\n"
       << "T=$!\n"
       << wait_for(ck + "/step_00000010")
       << "kill -KILL $(rank_pid '" << marker << "' 1)\n"
       << "wait $T; echo \"torchrun exit $?\"\n";
  }
  Command c = run_command("bash " + dir + "/run.sh", 240);
  const std::string log = read_file(dir + "/log");
  EXPECT_NE(c.output.find("torchrun exit 0"), std::string::npos) << c.output << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("Resumed from " + ck + "/step_(\\d+) \\(step (\\d+)\\)"))) << log;
  const int resumed = std::stoi(m[2].str());
  EXPECT_GE(resumed, 10);
  EXPECT_EQ(resumed % 5, 0);
  EXPECT_EQ(count(log, "2 ranks (torchrun)"), 2u) << "one start and one restart\n" << log;
  EXPECT_TRUE(fs::exists(ck + "/step_00000040/manifest.json"));
  // The metrics: the first attempt's steps, then the restart's from the checkpoint's step to the end.
  const auto metrics = read_metrics(dir + "/m.jsonl");
  std::vector<int64_t> steps;
  for (const auto& j : metrics) steps.push_back(j["step"].get<int64_t>());
  // The restart starts at the last record of the resumed step.
  size_t restart = steps.size();
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] == resumed) restart = i;
  }
  ASSERT_LT(restart, steps.size()) << "no record of step " << resumed;
  EXPECT_EQ(steps.back(), 39);
  EXPECT_EQ(steps.size() - restart, static_cast<size_t>(40 - resumed));
  for (size_t i = restart + 1; i < steps.size(); ++i) EXPECT_EQ(steps[i], steps[i - 1] + 1);
  // The first attempt ran past the checkpoint; its record of the resumed step
  // has the same loss as the restart's (exact resume).
  size_t first = restart;
  for (size_t i = 0; i < restart; ++i) {
    if (steps[i] == resumed) first = i;
  }
  if (first < restart) EXPECT_EQ(metrics[first]["loss"], metrics[restart]["loss"]);
  expect_no_leftovers(marker);
}

// torchrun, SIGTERM to rank 1 only (Note [A peer's stop under torchrun] in
// apps/fsdp_train.cpp): rank 0 stops at the same step, and then waits for a
// signal of its own, since torchrun's agent takes its workers' exit 0 as the
// job finished. `second_signal`: the signal comes (as from an agent restarting
// its workers for a joining node) and rank 0 exits at once. Otherwise, after
// its 30 s, it says no signal came and exits 0: the stop was for the job.
// Either way torchrun exits 0 and the checkpoint of the agreed step is saved.
namespace {

void sigterm_rank_1_under_torchrun(const std::string& tag, bool second_signal) {
  const std::string dir = testing::temp_dir(tag);
  const std::string ck = dir + "/ckpt";
  const std::string marker = "max-steps 400 --checkpoint-dir " + ck;
  {
    std::ofstream sh(dir + "/run.sh");
    sh << "set -u\n" << find_rank_fn()
       << torchrun_two_workers(dir, /*max_restarts=*/0) << flags(400) << " --checkpoint-dir " << ck << " > " << dir
       << "/log 2>&1 &\n"
       << "T=$!\n"
       << "for i in $(seq 1 600); do grep -q 'Batch 3 Loss' " << dir << "/log && break; sleep 0.1; done\n"
       << "kill -TERM $(rank_pid '" << marker << "' 1)\n"
       << "for i in $(seq 1 600); do grep -q 'waiting up to' " << dir << "/log && break; sleep 0.1; done\n"
       << "S=$SECONDS\n";
    if (second_signal) sh << "kill -TERM $(rank_pid '" << marker << "' 0)\n";
    sh << "wait $T; echo \"torchrun exit $? after $((SECONDS - S)) s\"\n";
  }
  Command c = run_command("bash " + dir + "/run.sh", 120);
  const std::string log = read_file(dir + "/log");
  EXPECT_NE(log.find("fsdp-train: rank 0: stopped with the job by a SIGTERM another rank received; waiting up to 30 s "
                     "for torchrun's agent, which restarts this worker if a node is joining"),
            std::string::npos) << log;
  EXPECT_EQ(log.find("rank 1: stopped with the job"), std::string::npos) << "rank 1 had its own signal\n" << log;
  ASSERT_TRUE(std::regex_search(c.output, std::regex("torchrun exit 0 after \\d+ s"))) << c.output << log;
  const bool gave_up = log.find("fsdp-train: rank 0: no signal from torchrun's agent in 30 s: the job is stopped "
                                "(the checkpoint is saved)") != std::string::npos;
  // The line comes only at the wait's end: absent, the signal ended the wait; present, it ran its length.
  EXPECT_EQ(gave_up, !second_signal) << c.output << log;
  const int n = sigterm_step(log);
  ASSERT_GE(n, 0) << log;
  EXPECT_TRUE(fs::exists(ck + "/" + step_dir(n) + "/manifest.json")) << log;
  expect_no_leftovers(marker);
}

}  // namespace

TEST(TrainCli, TorchrunRankStoppedByAPeersSignalWaitsForItsOwn) {
  sigterm_rank_1_under_torchrun("cli-peer-stop", /*second_signal=*/true);
}

TEST(TrainCli, TorchrunRankStoppedByAPeersSignalAloneExitsZeroAfterItsWait) {
  sigterm_rank_1_under_torchrun("cli-peer-stop-alone", /*second_signal=*/false);
}

}  // namespace fsdp

// Hostile command lines, configs and data paths for fsdp-train and fsdp-inspect
// (issue 16, findings 3, 4 and 7): each is refused at once with exit 2 and one
// line naming the flag or file and the limit, never a backtrace, a hang, a
// silently clamped value or a host full of processes.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "support/multiproc.h"
#include "train/train_test_util.h"

namespace fsdp::testing {
namespace {

const std::string kInspectBin = FSDP_INSPECT_BIN;

struct Case {
  std::string args;    // after the program
  std::string expect;  // a substring of its one line
};

// Every case: exit 2 within the time limit, the expected text, one line, no backtrace.
void expect_refused(const std::string& program, const std::vector<Case>& cases, int limit_s = 60) {
  for (const auto& k : cases) {
    const Command c = run_command(program + " " + k.args, limit_s);
    EXPECT_EQ(c.exit_code, 2) << k.args << "\n" << c.output;
    EXPECT_NE(c.output.find(k.expect), std::string::npos) << k.args << "\n" << c.output;
    EXPECT_EQ(c.output.find("frame #"), std::string::npos) << "backtrace for " << k.args << "\n" << c.output;
    EXPECT_EQ(count(c.output, "\n"), 1u) << k.args << "\n" << c.output;
  }
}

// The tiny preset's config.json with one key changed, written under `dir`.
std::string config_with(const std::string& dir, const std::string& key, const nlohmann::json& value) {
  const Command c = run_command(kInspectBin + " --model tiny --write-hf-config " + dir + "/tiny.json", 60);
  EXPECT_EQ(c.exit_code, 0) << c.output;
  nlohmann::json j = nlohmann::json::parse(read_file(dir + "/tiny.json"));
  j[key] = value;
  const std::string path = dir + "/" + key + ".json";
  std::ofstream(path) << j.dump(2);
  return path;
}

TEST(InputCli, SizesFromConfigsAreRefusedBeforeAllocating) {
  const std::string dir = temp_dir("config");
  const std::string vocab = config_with(dir, "vocab_size", int64_t{1000000000000});
  const std::string hidden = config_with(dir, "hidden_size", int64_t{1} << 40);
  const std::string train = kTrainBin + " --data " + kCorpus + " --seq-len 32 --max-steps 1 --model ";
  expect_refused(train, {{vocab, "vocab_size = 1000000000000 is above the limit 2147483647"},
                         {hidden, "hidden_size = 1099511627776 is above the limit 1048576"}});
  expect_refused(kInspectBin + " --model ", {{vocab, "vocab_size = 1000000000000 is above the limit"},
                                             {hidden, "hidden_size = 1099511627776 is above the limit"}});
}

TEST(InputCli, ProductsOfFlagsAndOutOfRangeNumbersAreRefused) {
  const std::string train = kTrainBin + " --model tiny --data " + kCorpus + " --seq-len 32 --max-steps 1 ";
  expect_refused(train, {
      // Used to fail in vector::reserve (exit 1).
      {"--batch-size 9223372036854775807", "--batch-size 9223372036854775807"},
      // Used to overflow the global batch to a negative number and run forever.
      {"--grad-accum 4611686018427387904", "the global batch, --batch-size 8 x --grad-accum 4611686018427387904"},
      {"--batch-size 4611686018427387904 --max-steps 4", "--max-steps 4 global batches"},
      // Used to be clamped to 2^63 - 1 and 2^64 - 1 silently.
      {"--warmup-steps 18446744073709551616", "--warmup-steps: '18446744073709551616' is out of range"},
      {"--seed 18446744073709551616", "--seed: '18446744073709551616' is out of range"},
      {"--seed -1", "--seed: '-1' is negative"},
      {"--seq-len 0x20", "--seq-len: '0x20' is not a whole number in decimal digits"},
      {"--lr inf", "--lr: 'inf' is not a finite number"},
      {"--clip-grad nan", "--clip-grad: 'nan' is not a finite number"},
      {"--beta2 1e999", "--beta2: '1e999' is not a finite number"},
      // More processes than the machine can run (used to start them all).
      {"--nproc-per-node 1000", "--nproc-per-node 1000 is more processes than this machine can run: at most"},
      // The memory one micro-batch's logits need, against what the machine has.
      {"--batch-size 100000000", "of host memory per process"},
      // FSDP2's int must divide the shard group: refused before any process starts.
      {"--nproc-per-node 2 --reshard-after-forward 3",
       "--reshard-after-forward = 3 must divide the shard-group size 2"},
      {"--reshard-after-forward 0", "--reshard-after-forward '0' is not one of: default"},
  });
  expect_refused(kInspectBin, {{"--world-size 0", "--world-size must be >= 1"},
                               {"--world-size 4 --rank 4", "--rank 4 is outside [0, --world-size 4)"},
                               {"--world-size 99999999999", "--world-size"},
                               {"--sharding hybrid --world-size 4 --hybrid-shard-size 3", "--hybrid-shard-size"},
                               {"--limit-all-gathers 0", "--limit-all-gathers must be >= 1"},
                               {"--sharding hybrid --world-size 8 --hybrid-shard-size 4 --reshard-after-forward 3",
                                "--reshard-after-forward = 3 must divide the shard-group size 4"},
                               {"--reshard-after-forward yes", "--reshard-after-forward 'yes' is not one of"}});
}

TEST(InputCli, MemoryRefusalNamesNeedAndAvailable) {
  const Command c = run_command(kTrainBin + " --model tiny --data " + kCorpus +
                                " --seq-len 32 --max-steps 1 --batch-size 100000000 --nproc-per-node 2", 60);
  EXPECT_EQ(c.exit_code, 2) << c.output;
  EXPECT_NE(c.output.find("x 2 processes on this machine = "), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("logits of one micro-batch"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("available — reduce --batch-size"), std::string::npos) << c.output;
}

// --ac-policy selective keeps more between forward and backward than tail
// (models::llama_kept_bytes_per_token): the memory check counts it.
TEST(InputCli, MemoryCheckCountsWhatSelectiveCheckpointingKeeps) {
  const auto activations = [](const std::string& policy) {
    const Command c = run_command(kTrainBin + " --model tiny --data " + kCorpus +
                                      " --seq-len 32 --max-steps 1 --batch-size 100000000 "
                                      "--activation-checkpointing --ac-policy " + policy, 60);
    EXPECT_EQ(c.exit_code, 2) << c.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(c.output, m, std::regex("activations ([0-9.]+) TiB"))) << c.output;
    return m.empty() ? 0.0 : std::stod(m[1].str());
  };
  const double tail = activations("tail"), selective = activations("selective");
  EXPECT_GT(tail, 0);
  EXPECT_GT(selective, tail * 1.2);
}

// /dev/zero used to grow the process to gigabytes, a FIFO blocked in open().
TEST(InputCli, DataTokenizerAndModelPathsMustBeRegularFiles) {
  const std::string dir = temp_dir("paths");
  const std::string fifo = dir + "/corpus.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string train = kTrainBin + " --seq-len 32 --max-steps 1 ";
  expect_refused(train, {
      {"--model tiny --data /dev/zero", "data file /dev/zero is a character device, not a regular file"},
      {"--model tiny --data " + fifo, "data file " + fifo + " is a FIFO (named pipe), not a regular file"},
      {"--model tiny --data " + kCorpus + " --val-data /dev/zero --eval-every 1", "/dev/zero is a character device"},
      {"--model tiny --data " + kCorpus + " --tokenizer /dev/zero", "tokenizer file /dev/zero is a character device"},
      {"--model tiny --data " + kCorpus + " --tokenizer " + fifo, "is a FIFO (named pipe)"},
      {"--model /dev/zero --data " + kCorpus, "model config /dev/zero is a character device"},
      {"--model tiny --data " + kCorpus + " --nproc-per-node 2 --tokenizer /dev/zero", "tokenizer file /dev/zero"},
  });
}

// Library messages name the user's flags, not internal fields.
TEST(InputCli, MessagesNameTheFlags) {
  const std::string dir = temp_dir("fields");
  const std::string data = dir + "/c.jsonl";
  std::ofstream(data) << "{\"body\": \"hello there\"}\n";
  expect_refused(kTrainBin + " --model tiny --seq-len 4 --max-steps 1 --data " + data,
                 {{"", "set --text-field to the field holding the text"}});
}

}  // namespace
}  // namespace fsdp::testing

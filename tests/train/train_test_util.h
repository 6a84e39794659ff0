// Helpers for tests that run the fsdp-train binary.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp::testing {

inline const std::string kCorpus = std::string(FSDP_SOURCE_DIR) + "/data/fallback_corpus.jsonl";
inline const std::string kValCorpus = std::string(FSDP_SOURCE_DIR) + "/data/fallback_corpus.val.jsonl";
inline const std::string kTrainBin = FSDP_TRAIN_BIN;

// fsdp-train on the tiny model and the fallback corpus (32-token windows, batch 2) for
// `max_steps` steps; `extra` flags go before --max-steps.
inline std::string tiny_train_command(int max_steps, const std::string& extra = "") {
  return kTrainBin + " --model tiny --data " + kCorpus + " --seq-len 32 --batch-size 2" + extra + " --max-steps " +
         std::to_string(max_steps);
}

struct Command {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `cmd` under bash with a time limit (timeout -k 10 <limit_s>).
inline Command run_command(const std::string& cmd, int limit_s = 300) {
  Command c;
  FILE* p = popen(("timeout -k 10 " + std::to_string(limit_s) + " " + cmd + " 2>&1").c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) c.output.append(buf.data(), n);
  const int status = pclose(p);
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return c;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The records of a --metrics-file, one JSON object a line, in order.
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace fsdp::testing

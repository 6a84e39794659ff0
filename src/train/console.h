// Rank 0's console and the texts the trainer logs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/train/options.h"
#include "fsdp/train/records.h"

namespace fsdp::train {

using LogLine = std::function<void(const std::string&)>;

// "45s", "3m12s", "1h02m", "2d03h"; "?" for a negative or non-finite time.
std::string duration_text(double seconds);
// "12.3 MB" (10^6 bytes).
std::string megabytes(int64_t bytes);
// "SIGTERM", "SIGINT", else "stop request N".
std::string signal_name(int code);

// Rank 0's console: fsdp-train's log lines ("<time> I [fsdp-train] ..." for
// level 'I' on stdout, 'W' for warnings on stderr; none under --quiet), and,
// when stdout is a terminal, a progress line kept below them (redrawn after
// each step, erased before the next log line, so logs piped to a file or
// collected by Kubernetes never hold it).
class Console {
 public:
  Console(const LogOptions& log, bool lead);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  void line(char level, const std::string& text);
  LogLine level(char lv);
  // [#########...........] 45/100 steps, ETA 3m12s
  void progress(int64_t done, int64_t total, double eta_s);
  // Whether lines are printed (rank 0 without --quiet).
  bool on() const { return on_; }

 private:
  void erase_bar();
  const bool on_;
  const bool bar_;
  const std::function<std::string(const std::string&)> user_terms_;
  bool bar_shown_ = false;
};

// The end-of-run line: what was trained, how fast, the best evaluation, and
// where everything the run wrote went.
std::string run_summary(const TrainOptions& o, const TrainSummary& s, int64_t global_batch, double seconds);

}  // namespace fsdp::train

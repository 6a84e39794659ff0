#include "train/console.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iostream>

#include <unistd.h>

namespace fsdp::train {
namespace {

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

std::string signal_name(int code) {
  switch (code) {
    case 15: return "SIGTERM";
    case 2: return "SIGINT";
    default: return "stop request " + std::to_string(code);
  }
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

Console::Console(const LogOptions& log, bool lead)
    : on_(lead && !log.quiet), bar_(on_ && isatty(STDOUT_FILENO) == 1), user_terms_(log.user_terms) {}

Console::~Console() { erase_bar(); }

void Console::line(char level, const std::string& text) {
  if (!on_) return;
  erase_bar();
  (level == 'W' ? std::cerr : std::cout) << timestamp() << " " << level << " [fsdp-train] "
                                          << (user_terms_ ? user_terms_(text) : text) << std::endl;
}

LogLine Console::level(char lv) {
  return [this, lv](const std::string& text) { line(lv, text); };
}

void Console::progress(int64_t done, int64_t total, double eta_s) {
  if (!bar_ || total <= 0) return;
  constexpr int kWidth = 30;
  const auto filled = static_cast<int>(kWidth * std::min<int64_t>(done, total) / total);
  std::cout << "\r[" << std::string(static_cast<size_t>(filled), '#')
            << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << done << "/" << total
            << " steps, ETA " << duration_text(eta_s) << std::flush;
  bar_shown_ = true;
}

void Console::erase_bar() {
  if (!bar_shown_) return;
  std::cout << "\r\033[K" << std::flush;
  bar_shown_ = false;
}

std::string run_summary(const TrainOptions& o, const TrainSummary& s, int64_t global_batch, double seconds) {
  const int64_t steps = s.end_step - s.start_step;
  const int64_t tokens = steps * global_batch * o.data.seq_len;
  std::string text = fmt::format("Run summary: {} step{} ({} -> {}) in {}, {} tokens, {:.0f} tokens/s", steps,
                                 steps == 1 ? "" : "s", s.start_step, s.end_step, duration_text(seconds), tokens,
                                 seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
  if (!s.steps.empty()) text += fmt::format("; loss {:.5f} -> {:.5f}", s.steps.front().loss, s.steps.back().loss);
  if (!s.evals.empty()) {
    const auto best = std::min_element(s.evals.begin(), s.evals.end(),
                                       [](const EvalRecord& a, const EvalRecord& b) { return a.loss < b.loss; });
    text += fmt::format("; best eval loss {:.5f} (step {})", best->loss, best->step);
  }
  if (s.stop_reason != 0) text += fmt::format("; stopped by {}", signal_name(s.stop_reason));
  if (!s.last_checkpoint.empty()) text += fmt::format("; checkpoints in {} (last {})", o.checkpoint.dir,
                                                      std::filesystem::path(s.last_checkpoint).filename().string());
  if (!o.hf.export_dir.empty() && s.stop_reason == 0) text += fmt::format("; exported to {}", o.hf.export_dir);
  if (!o.log.metrics_file.empty()) text += fmt::format("; metrics in {}", o.log.metrics_file);
  if (!o.log.tensorboard_dir.empty()) text += fmt::format("; TensorBoard in {}", o.log.tensorboard_dir);
  if (!s.metrics_url.empty()) text += fmt::format("; Prometheus metrics at {}", s.metrics_url);
  if (!s.trace_file.empty()) text += fmt::format("; trace in {}", s.trace_file);
  return text;
}

}  // namespace fsdp::train

#include "progress.h"

#include <algorithm>
#include <cstdio>

#include "file_io.h"

namespace fsdp::checkpoint::io {
namespace {
constexpr double kDelay = 0.5;      // seconds before the bar appears
constexpr double kInterval = 0.1;   // seconds between redraws
constexpr int kWidth = 30;
}  // namespace

Progress::Progress(std::string what, int64_t total_bytes, bool enabled)
    : what_(std::move(what)), total_(total_bytes), enabled_(enabled && total_bytes > 0), start_(now_seconds()) {}

Progress::~Progress() { finish(); }

void Progress::add(int64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const double t = now_seconds();
  if (t - start_ < kDelay || t - last_draw_ < kInterval) return;
  last_draw_ = t;
  draw();
}

void Progress::draw() {
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : ' ';
  bar[kWidth] = '\0';
  const double dt = now_seconds() - start_;
  std::fprintf(stderr, "\r%s [%s] %3d%%  %.2f/%.2f GB  %.2f GB/s\x1b[K", what_.c_str(), bar,
               static_cast<int>(frac * 100), static_cast<double>(done_) / 1e9, static_cast<double>(total_) / 1e9,
               dt > 0 ? static_cast<double>(done_) / dt / 1e9 : 0.0);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
    drawn_ = false;
  }
  enabled_ = false;
}

}  // namespace fsdp::checkpoint::io

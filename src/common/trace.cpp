#include "fsdp/common/trace.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

namespace fsdp::trace {
namespace {

// The one process-wide recorder: tracing is a property of the process (every
// thread's spans go to one timeline), so it is global by design.
struct Recorder {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<Event> events;      // guarded by mu
  std::vector<std::string> names; // guarded by mu; by thread number
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: lane threads may record during exit
  return *r;
}

int number_thread() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.names.push_back("");
  return static_cast<int>(r.names.size()) - 1;
}

}  // namespace

bool enabled() { return recorder().on.load(std::memory_order_relaxed); }

void start() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
  r.on.store(true);
}

std::vector<Event> stop() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.on.store(false);
  return std::move(r.events);
}

int this_thread() {
  thread_local const int n = number_thread();
  return n;
}

void set_thread_name(const std::string& name) {
  const int n = this_thread();
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.names[static_cast<size_t>(n)] = name;
}

std::vector<std::string> thread_names() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out = r.names;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) out[i] = "thread " + std::to_string(i);
  }
  return out;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void record(const char* name, const char* cat, int64_t begin_us, int64_t end_us, int64_t bytes, std::string detail,
            int64_t step) {
  if (!enabled() || begin_us < 0) return;
  Event e;
  e.name = name;
  e.cat = cat;
  e.begin_us = begin_us;
  e.dur_us = std::max<int64_t>(0, end_us - begin_us);
  e.thread = this_thread();
  e.bytes = bytes;
  e.step = step;
  e.detail = std::move(detail);
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.on.load(std::memory_order_relaxed)) r.events.push_back(std::move(e));
}

Span::Span(const char* name, const char* cat, int64_t bytes, const std::string& detail, int64_t step)
    : name_(name), cat_(cat), bytes_(bytes), step_(step) {
  if (enabled()) {
    detail_ = detail;
    begin_us_ = now_us();
  }
}

Span::~Span() {
  if (begin_us_ >= 0) record(name_, cat_, begin_us_, now_us(), bytes_, std::move(detail_), step_);
}

}  // namespace fsdp::trace

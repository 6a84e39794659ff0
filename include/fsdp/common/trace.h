// A timeline of what one process does, for --profile-steps: spans (name,
// category, begin, duration, thread, bytes) recorded only while tracing is on.
//
// Cost while off: one relaxed atomic load per span site, no allocation. While
// on: one mutex per span (spans are coarse: a unit's gather, forward or
// backward, a collective on a lane, a step), so a traced step of the 7B preset
// records a few hundred of them.
//
// Threads: any thread may record; each gets a small number (its track in the
// trace) on first use and may name itself (set_thread_name) — the training
// thread is "main", each collective lane "comm: <lane> (<group>)".
// Times: microseconds of the system clock, so that ranks on different hosts
// line up as well as their clocks do (NTP), and ranks on one host exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::trace {

struct Event {
  std::string name;    // "all_gather", "forward", "step", ...
  std::string cat;     // "comm", "compute", "optim", "data", "eval", "checkpoint", "step"
  int64_t begin_us = 0;
  int64_t dur_us = 0;
  int thread = 0;      // the recording thread's number (thread_names()[thread])
  int64_t bytes = -1;  // collectives: bytes of the logical buffer; -1: none
  int64_t step = -1;   // "step" spans: the step's number; -1: none
  std::string detail;  // e.g. the unit's name or the collective's description; "" for none
};

// Whether spans are being recorded.
bool enabled();
// Starts recording (dropping anything recorded before).
void start();
// Stops recording and returns what was recorded, in the order spans ended.
std::vector<Event> stop();

// Names the calling thread's track (kept across start/stop).
void set_thread_name(const std::string& name);
// Every numbered thread's name ("thread N" where none was set), by number.
std::vector<std::string> thread_names();
// The calling thread's number.
int this_thread();

// Microseconds since the epoch, system clock.
int64_t now_us();

// Records a span that has ended (no-op while off).
void record(const char* name, const char* cat, int64_t begin_us, int64_t end_us, int64_t bytes = -1,
            std::string detail = {}, int64_t step = -1);

// A span from construction to destruction on the calling thread.
class Span {
 public:
  // `detail` is copied only while tracing is on.
  Span(const char* name, const char* cat, int64_t bytes = -1, const std::string& detail = {}, int64_t step = -1);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* cat_;
  int64_t bytes_;
  std::string detail_;
  int64_t step_;
  int64_t begin_us_ = -1;  // -1: tracing was off at construction
};

// Union length of the intervals of `events` that pass `keep`, microseconds
// (nested or overlapping spans count once).
template <typename Pred>
int64_t covered_us(const std::vector<Event>& events, Pred keep);

}  // namespace fsdp::trace

#include "fsdp/common/trace_inl.h"

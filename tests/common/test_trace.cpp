#include <gtest/gtest.h>

#include <thread>

#include "fsdp/common/trace.h"

namespace fsdp::trace {
namespace {

Event span(int64_t begin, int64_t dur, const char* cat = "comm") {
  Event e;
  e.name = "x";
  e.cat = cat;
  e.begin_us = begin;
  e.dur_us = dur;
  return e;
}

TEST(Trace, CoveredCountsNestedAndOverlappingSpansOnce) {
  const std::vector<Event> events = {span(0, 10), span(2, 3), span(8, 6), span(20, 5), span(30, 4, "compute")};
  // [0,10) + [8,14) -> [0,14): 14; [20,25): 5; the compute span is filtered out.
  EXPECT_EQ(covered_us(events, [](const Event& e) { return e.cat == "comm"; }), 19);
  EXPECT_EQ(covered_us(events, [](const Event&) { return false; }), 0);
}

TEST(Trace, RecordsOnlyWhileOnAndFromEveryThread) {
  { Span before("before", "step"); }
  start();
  set_thread_name("main");
  { Span s("step", "step", -1, "detail", 7); }
  std::thread other([] {
    set_thread_name("comm: test lane");
    Span s("all_gather", "comm", 4096);
  });
  other.join();
  const std::vector<Event> events = stop();
  { Span after("after", "step"); }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].name, "step");
  EXPECT_EQ(events[0].step, 7);
  EXPECT_EQ(events[0].detail, "detail");
  EXPECT_EQ(events[1].name, "all_gather");
  EXPECT_EQ(events[1].bytes, 4096);
  EXPECT_NE(events[0].thread, events[1].thread);
  const std::vector<std::string> names = thread_names();
  EXPECT_EQ(names.at(static_cast<size_t>(events[0].thread)), "main");
  EXPECT_EQ(names.at(static_cast<size_t>(events[1].thread)), "comm: test lane");
  EXPECT_TRUE(stop().empty());
}

}  // namespace
}  // namespace fsdp::trace

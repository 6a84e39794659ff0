// The example at the top of include/fsdp/fsdp.h, compiled and run as it is
// written there: the build copies it out of the header's comment
// (tests/fsdp/CMakeLists.txt), so an example that stops compiling fails the
// build, and one that stops training fails this test.
#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/unit.h"
#include "fsdp/optim/adamw.h"

namespace {

TEST(HeaderExample, CompilesAndTrains) {
#include "header_example.inc"
  // What the example promises: a root and two units, 20 optimizer steps, a
  // loss that went down from the first step's (about 1.0: targets are zeros,
  // inputs standard normal).
  EXPECT_EQ(sharded->units().size(), 3u);
  EXPECT_EQ(opt.step_count(), 20);
  const double last = loss.item<double>();
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, 0.9) << "the example's model did not train";
}

}  // namespace

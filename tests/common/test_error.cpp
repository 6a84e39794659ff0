#include <gtest/gtest.h>

#include "fsdp/common/error.h"

TEST(Error, CheckThrowsUsageErrorWithValuesAndRankTag) {
  try {
    const int n = 1000, w = 3;
    FSDP_CHECK(n % w == 0, "Number of elements ", n, " must be a multiple of ", w);
    FAIL() << "no throw";
  } catch (const fsdp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("Number of elements 1000 must be a multiple of 3"), std::string::npos);
  }
  fsdp::set_rank_tag(1, 4);
  EXPECT_EQ(fsdp::rank_tag(), "[rank 1/4] ");
  try {
    FSDP_ASSERT(1 == 2);
    FAIL() << "no throw";
  } catch (const fsdp::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 1/4] internal error"), std::string::npos);
  }
}

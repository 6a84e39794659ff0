// run_main: every exception becomes one line and the documented exit code,
// never a C++ backtrace (issue 16, finding 3).
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <ATen/ATen.h>

#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "support/errors.h"

namespace {

struct Outcome {
  int code = -1;
  std::string err;
};

Outcome run_body(const std::function<int()>& body) {
  ::testing::internal::CaptureStderr();
  Outcome r;
  r.code = fsdp::run_main("prog", body);
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

void expect_no_backtrace(const std::string& s) {
  EXPECT_EQ(s.find("frame #"), std::string::npos) << s;
  EXPECT_EQ(s.find("Exception raised from"), std::string::npos) << s;
}

}  // namespace

// LibTorch's errors carry their backtrace in what(); the user sees the message only.
TEST(RunMain, LibTorchErrorIsOneLineWithoutBacktrace) {
  const Outcome r = run_body([]() -> int { TORCH_CHECK(false, "shapes [2, 3] and [4] do not match"); });
  EXPECT_EQ(r.code, fsdp::kExitFailure);
  EXPECT_CONTAINS(r.err, "prog: failed: shapes [2, 3] and [4] do not match");
  expect_no_backtrace(r.err);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
}

// A message of ours that wraps a LibTorch error's full text loses the backtrace too.
TEST(RunMain, WrappedLibTorchTextLosesItsBacktrace) {
  std::string wrapped;
  try {
    TORCH_CHECK(false, "bad tensor");
  } catch (const c10::Error& e) {
    wrapped = e.what();
  }
  const Outcome r = run_body([&]() -> int { FSDP_FAIL("cannot read shard 3: ", wrapped); });
  EXPECT_EQ(r.code, fsdp::kExitFailure);
  EXPECT_CONTAINS(r.err, "prog: failed: cannot read shard 3: bad tensor");
  expect_no_backtrace(r.err);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
}

TEST(RunMain, UsageErrorIsExitTwoOnOneLine) {
  const Outcome r = run_body([]() -> int { FSDP_CHECK(false, "--seq-len 0 must be >= 1\nsecond line"); });
  EXPECT_EQ(r.code, fsdp::kExitUsage);
  EXPECT_EQ(r.err, "prog: error: --seq-len 0 must be >= 1; second line\n");
}

// Memory running out says so and what to reduce, whichever allocator noticed.
TEST(RunMain, OutOfMemorySaysWhatToReduce) {
  for (const auto& body : std::vector<std::function<int()>>{
           []() -> int { throw std::bad_alloc(); },
           []() -> int {
             // 2^55 bytes: more than any machine; LibTorch's CPU allocator refuses it.
             at::empty({int64_t{1} << 55}, at::kByte);
             return 0;
           },
           []() -> int {
             std::vector<char> v;
             v.reserve(static_cast<size_t>(-1));  // std::length_error: vector::reserve
             return 0;
           }}) {
    const Outcome r = run_body(body);
    EXPECT_EQ(r.code, fsdp::kExitFailure);
    EXPECT_CONTAINS(r.err, "prog: failed: out of memory (");
    EXPECT_CONTAINS(r.err, "--batch-size");
    expect_no_backtrace(r.err);
    EXPECT_EQ(lines(r.err), 1u) << r.err;
  }
}

TEST(RunMain, DebugShowsTheFullText) {
  ::setenv("FSDP_DEBUG", "1", 1);
  const Outcome r = run_body([]() -> int { TORCH_CHECK(false, "debug me"); });
  ::unsetenv("FSDP_DEBUG");
  EXPECT_EQ(r.code, fsdp::kExitFailure);
  EXPECT_CONTAINS(r.err, "debug me");
  EXPECT_CONTAINS(r.err, "Exception raised from");
}

// An exception escaping another thread would call std::terminate ("terminate
// called after throwing ...", abort, the backtrace): it is reported as one line, exit 1.
TEST(RunMainDeathTest, ExceptionOnAnotherThreadIsOneLineAndExitOne) {
  EXPECT_EXIT(fsdp::run_main("prog",
                             [] {
                               std::thread t([] { TORCH_CHECK(false, "loader broke"); });
                               t.join();
                               return 0;
                             }),
              ::testing::ExitedWithCode(1), "^prog: failed: loader broke \\(on a background thread\\)\n$");
}

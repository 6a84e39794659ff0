// Expecting errors in tests: the message of the exception a call throws, and
// a substring check that prints both strings when it fails.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <utility>

#include "fsdp/common/error.h"

namespace fsdp::testing {

// Runs f, expects it to throw E and returns the message. Records a test
// failure and returns "" when f throws another exception or nothing.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing was thrown";
  return "";
}

// error_of<fsdp::UsageError>: the bad-input errors users see.
template <class F>
std::string usage_error_of(F&& f) {
  return error_of<fsdp::UsageError>(std::forward<F>(f));
}

}  // namespace fsdp::testing

// gtest matcher-free substring check with a readable failure.
#define EXPECT_CONTAINS(haystack, needle)                                                     \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                            \
      << "expected to find \"" << (needle) << "\" in:\n  " << (haystack)

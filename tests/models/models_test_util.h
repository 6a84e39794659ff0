// Small helpers shared by the models tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "fsdp/common/error.h"

namespace fsdp::models::testing {

// Runs f, expects a UsageError and returns its message ("" and a test failure otherwise).
template <class F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const fsdp::UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected fsdp::UsageError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected fsdp::UsageError, nothing was thrown";
  return "";
}

}  // namespace fsdp::models::testing

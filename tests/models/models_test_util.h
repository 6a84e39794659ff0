// Small helpers shared by the models tests.
#pragma once

#include "support/errors.h"

namespace fsdp::models::testing {

using fsdp::testing::usage_error_of;

}  // namespace fsdp::models::testing

#include "fsdp/optim/lr_schedule.h"

#include <cmath>

#include "fsdp/common/error.h"

namespace fsdp::optim {

void LrSchedule::validate() const {
  FSDP_CHECK(lr > 0, "LrSchedule::lr must be > 0, got ", lr);
  FSDP_CHECK(min_lr >= 0 && min_lr <= lr, "LrSchedule::min_lr must be in [0, LrSchedule::lr=", lr, "], got ", min_lr);
  FSDP_CHECK(warmup_steps >= 0, "LrSchedule::warmup_steps must be >= 0, got ", warmup_steps);
  FSDP_CHECK(max_steps >= 1, "LrSchedule::max_steps must be >= 1, got ", max_steps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= max_steps) return min_lr;
  const double span = static_cast<double>(std::max<int64_t>(1, max_steps - warmup_steps));
  const double progress = static_cast<double>(step - warmup_steps) / span;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace fsdp::optim

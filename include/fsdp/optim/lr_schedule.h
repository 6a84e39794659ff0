// Learning-rate schedule: linear warmup to `lr`, then cosine decay to `min_lr`
// at `max_steps` (and min_lr afterwards). Steps are 0-based: step 0 uses
// lr/warmup_steps when warming up.
#pragma once

#include <cstdint>

namespace fsdp::optim {

struct LrSchedule {
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1000;

  // Throws UsageError naming the field (LrSchedule::min_lr, ...) for impossible settings.
  void validate() const;
  double at(int64_t step) const;
};

}  // namespace fsdp::optim

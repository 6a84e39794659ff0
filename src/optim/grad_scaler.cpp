#include "fsdp/optim/grad_scaler.h"

#include <cmath>

#include "fsdp/common/error.h"

namespace fsdp::optim {

ShardedGradScaler::ShardedGradScaler(GradScalerOptions options, comm::ProcessGroupPtr group)
    : options_(options), group_(std::move(group)), scale_(options.init_scale) {
  // inf would skip every step (inf * 0.5 is inf), nan compares false everywhere.
  FSDP_CHECK(std::isfinite(options_.init_scale) && options_.init_scale > 0,
             "grad scaler: init_scale must be a finite number > 0, got ", options_.init_scale);
  FSDP_CHECK(options_.growth_factor > 1, "grad scaler: growth_factor must be > 1, got ", options_.growth_factor);
  FSDP_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
             "grad scaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  FSDP_CHECK(options_.growth_interval >= 1, "grad scaler: growth_interval must be >= 1, got ",
             options_.growth_interval);
  FSDP_CHECK(group_ != nullptr, "grad scaler: the process group is null");
}

bool ShardedGradScaler::unscale(const std::vector<ShardRef>& shards) {
  at::NoGradGuard no_grad;
  bool local_inf = false;
  const double inv = 1.0 / scale_;
  for (const auto& s : shards) {
    if (!s.trainable) continue;
    s.grad.mul_(inv);
    if (!local_inf && !at::isfinite(s.grad).all().item<bool>()) local_inf = true;
  }
  at::Tensor flag = at::full({1}, local_inf ? 1.0f : 0.0f);
  if (group_->size() > 1) group_->all_reduce(flag, comm::ReduceOp::kMax)->wait();
  return flag.item<float>() > 0;
}

void ShardedGradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void ShardedGradScaler::set_state(double scale, int64_t growth_tracker) {
  FSDP_CHECK(scale > 0, "grad scaler: saved scale must be > 0, got ", scale);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace fsdp::optim

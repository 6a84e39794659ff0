// Dynamic loss scaling for fp16 training over sharded gradients.
//
//   loss = scaler.scale(loss); loss.backward();
//   if (scaler.unscale(sharded->shards())) { /* skip: inf/nan somewhere */ }
//   else { clip; opt.step(); }
//   scaler.update(found_inf);
//
// unscale() divides every local gradient shard by the scale and agrees with
// every rank (an all-reduce MAX of the local inf/nan flag over `group`, the
// world group) so that all ranks skip the same steps. update() halves the
// scale after a skipped step and doubles it after growth_interval clean steps,
// like torch.cuda.amp.GradScaler. Its state (scale, clean-step count) is saved
// with the optimizer in checkpoints.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/fsdp.h"

namespace fsdp::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class ShardedGradScaler {
 public:
  ShardedGradScaler(GradScalerOptions options, comm::ProcessGroupPtr group);

  at::Tensor scale(const at::Tensor& loss) const { return loss * scale_; }
  // Collective over the group. Returns true when any rank found inf/nan.
  bool unscale(const std::vector<ShardRef>& shards);
  void update(bool found_inf);

  double scale_value() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  void set_state(double scale, int64_t growth_tracker);
  int64_t skipped_steps() const { return skipped_; }

 private:
  GradScalerOptions options_;
  comm::ProcessGroupPtr group_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace fsdp::optim

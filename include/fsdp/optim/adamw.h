// AdamW over flat shards (or any tensors), with the update of
// torch.optim.AdamW (decoupled weight decay):
//   p *= 1 - lr*wd
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// State (exp_avg, exp_avg_sq) has the shape of each parameter — sharded
// exactly like the shards it updates — and one step count per optimizer.
//
// AnyPrecision mode (state_dtype, kahan_summation): for pure-bf16 training,
// where an update smaller than half a bf16 ulp of the weight is rounded away
// and weights stagnate (arXiv 2010.06192). The moments may be kept in bf16,
// and a compensation buffer in the parameter's dtype carries what each
// rounding lost into the next step (Kahan summation):
//   c += -lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps);  old = p;  p += c;  c += old - p
//
// Fused step (AdamWOptions::fused, the default): LibTorch's fused AdamW kernel
// (at::_fused_adamw_, CPU and CUDA) updates every slot whose parameter,
// gradient and moments share one dtype and device, in one call per parameter
// setting (Segment) and device; the loop below (adamw_update) runs where it
// does not apply: Kahan-compensated bf16, moments in another dtype than the
// parameter. The kernel computes the same update in another order of
// operations (moments as m*b1 + g*(1-b1); p += (-step_size * m) / denom;
// half-precision parameters in fp32 registers), so it differs from the loop by
// rounding: about 1 ulp of the update on ~1.5% of fp32 elements
// (tests/optim/test_optim.cpp prints and bounds it). It gives every element
// the same bits wherever it lies in a shard (Note [Fused AdamW tails] in
// adamw.cpp), so sharded training equals its unsharded reference to the bit.
//
// Rule for missing gradients: a tensor whose gradient is undefined in a step
// is updated with a zero gradient (moments decay, weight decay applies). A
// flat shard cannot skip part of itself, so the unsharded reference follows
// the same rule; LibTorch's own AdamW would skip the parameter instead.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"

namespace torch::nn {
class Module;
}

namespace fsdp::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  at::ScalarType state_dtype = at::kFloat;  // exp_avg and exp_avg_sq
  bool kahan_summation = false;             // compensated update (AnyPrecision AdamW)
  bool fused = true;                        // at::_fused_adamw_ where it applies (see above)
};

// Parameter groups: how one parameter is optimized, relative to the
// optimizer's options. The optimizer works on flat shards, so a group is a
// set of element ranges of each shard (AdamW::Segment), found from the
// parameters' placements (UnitInfo); the unsharded reference gives each
// parameter its own setting, and both apply the same arithmetic per element.
struct ParamSetting {
  bool decay = true;      // false: weight_decay 0 for this parameter
  double lr_scale = 1.0;  // its learning rate is lr * lr_scale
  bool operator==(const ParamSetting& o) const { return decay == o.decay && lr_scale == o.lr_scale; }
};
// The setting of a parameter from its qualified name and shape.
using ParamRule = std::function<ParamSetting(const std::string& name, const std::vector<int64_t>& shape)>;

struct ParamGroupOptions {
  // The published recipes' grouping: no weight decay on norm weights and
  // biases (parameters with fewer than 2 dimensions) nor on embeddings (names
  // containing "embed"); true: decay every parameter (for comparison).
  bool decay_all = false;
  // Learning-rate scales: the first pattern (std::regex, searched in the
  // parameter's name) that matches sets lr_scale; none: 1.
  std::vector<std::pair<std::string, double>> lr_scales;
};
// UsageError for a pattern that is not a valid regex or a scale <= 0.
ParamRule param_rule(const ParamGroupOptions& options);
// Every parameter decayed, lr scale 1: AdamW's behaviour without groups.
ParamRule decay_everything();

class AdamW {
 public:
  explicit AdamW(AdamWOptions options);

  // Element ranges of a slot's tensor with their own setting.
  struct Segment {
    int64_t begin = 0;
    int64_t count = 0;
    ParamSetting setting;
  };

  // `grad` returns the gradient at step time (may be undefined: zeros).
  // `segments`: ranges covering the tensor's elements in order; empty: one
  // range, the default setting.
  void add(std::string name, at::Tensor param, std::function<at::Tensor()> grad,
           std::vector<Segment> segments = {});
  // Every trainable local shard of a sharded model (frozen entries hold no
  // optimizer state), every parameter decayed.
  void add_shards(const std::vector<ShardRef>& shards);
  // The same, with each parameter's setting from `rule`; `units` is
  // ShardedModel::units() (the placements of the shards' parameters).
  void add_shards(const std::vector<ShardRef>& shards, const std::vector<UnitInfo>& units, const ParamRule& rule);
  // Every parameter of an unsharded module that requires grad (reads .grad()).
  void add_module_parameters(torch::nn::Module& module, const ParamRule& rule = decay_everything());

  // One update of every tensor with the current learning rate.
  void step();
  void set_lr(double lr) { options_.lr = lr; }
  double lr() const { return options_.lr; }
  int64_t step_count() const { return step_; }
  const AdamWOptions& options() const { return options_; }

  struct Slot {
    std::string name;
    at::Tensor param;
    std::function<at::Tensor()> grad;
    at::Tensor exp_avg;       // same shape as param, state dtype
    at::Tensor exp_avg_sq;    // same shape as param, state dtype
    at::Tensor compensation;  // same shape and dtype as param; only with kahan_summation
    std::vector<Segment> segments;  // element ranges of param in order (never empty)
  };
  // Whether step() updates `slot` with the fused kernel.
  bool fuses(const Slot& slot) const;
  // For checkpoints: state tensors may be read and overwritten in place.
  std::vector<Slot>& slots() { return slots_; }
  void set_step_count(int64_t s) { step_ = s; }

 private:
  void step_fused(const std::vector<Slot*>& slots);

  AdamWOptions options_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

// The single update both the sharded and the reference paths use, so they
// agree bit for bit. `step` is the 1-based step count after increment.
void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  int64_t step, const AdamWOptions& o);
// The compensated (Kahan) variant; `compensation` has the param's dtype.
void adamw_update_kahan(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        at::Tensor& compensation, int64_t step, const AdamWOptions& o);

// Global L2 norm of `grads` (undefined entries count as zeros), computed in
// float64; scales them in place so the norm is at most max_norm with the
// formula of torch.nn.utils.clip_grad_norm_. Returns the norm before clipping.
// For unsharded training; sharded models use ShardedModel::clip_grad_norm.
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm);
double grad_norm(const std::vector<at::Tensor>& grads);

}  // namespace fsdp::optim

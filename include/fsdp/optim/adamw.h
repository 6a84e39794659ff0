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

#include "fsdp/common/state.h"
#include "fsdp/fsdp.h"

namespace torch::nn {
class Module;
}

namespace fsdp::optim {

// torch.optim.AdamW's hyperparameters, and the AnyPrecision extras.
struct AdamWOptions {
  double lr = 1e-3;            // learning rate (AdamW::set_lr changes it between steps)
  double beta1 = 0.9;          // decay of the first moment
  double beta2 = 0.999;        // decay of the second moment
  double eps = 1e-8;           // added to sqrt(v) (after bias correction)
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * weight_decay
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
  // Both fields equal.
  bool operator==(const ParamSetting& o) const { return decay == o.decay && lr_scale == o.lr_scale; }
};
// The setting of a parameter from its qualified name and shape.
using ParamRule = std::function<ParamSetting(const std::string& name, const std::vector<int64_t>& shape)>;

// How param_rule groups parameters (fsdp-train's --no-decay-all and --lr-scale).
struct ParamGroupOptions {
  // The published recipes' grouping: no weight decay on norm weights and
  // biases (parameters with fewer than 2 dimensions) nor on embeddings (names
  // containing "embed"); true: decay every parameter (for comparison).
  bool decay_all = false;
  // Learning-rate scales: the first pattern (NamePattern: RE2, searched in the
  // parameter's name) that matches sets lr_scale; none: 1.
  std::vector<std::pair<std::string, double>> lr_scales;
};
// One lr_scales entry in words, "REGEX=FACTOR" (the last '=' splits, so a
// pattern may hold one): UsageError naming ParamGroupOptions::lr_scales when
// there is no '=', an empty pattern, or a factor that is not a number > 0.
std::pair<std::string, double> parse_lr_scale(const std::string& s);
// parse_lr_scale's words back: "REGEX=FACTOR", the factor as the stream writes it.
std::string lr_scale_text(const std::pair<std::string, double>& scale);
// The largest --lr-scale factor: a factor must itself be a 32-bit float
// (the optimizer computes in float32; 1e39 is not one).
inline constexpr double kMaxLrScale = 3.4028234663852886e38;  // FLT_MAX
// UsageError naming ParamGroupOptions::lr_scales for a pattern that is not a valid pattern
// (NamePattern: RE2 syntax, bounded) or a factor outside (0, kMaxLrScale].
ParamRule param_rule(const ParamGroupOptions& options);
// UsageError naming ParamGroupOptions::lr_scales and the pattern when one matches no trainable
// parameter of `model` (none at all, only frozen ones, or only ones an earlier
// pattern takes: the first match wins), as freeze_matching refuses a pattern that
// freezes nothing. Call after freezing and adding adapters.
void check_lr_scales_match(const ParamGroupOptions& options, torch::nn::Module& model);
// UsageError naming the fields (LrSchedule::lr, AdamWOptions::beta1, ...) when
// the scalars of an AdamW step leave the range of a 32-bit float, which the
// update computes in: for the peak (LrSchedule::lr) and the final learning
// rate (LrSchedule::min_lr), times each lr_scales factor, the first step's size
// lr x scale / (1 - beta1) and its decay lr x scale x weight_decay must be
// at most FLT_MAX. (A finite float that is still far too large trains to
// inf or NaN; the trainer stops such a run at the first non-finite loss.)
void check_lr_range(double peak_lr, double min_lr, const AdamWOptions& adamw, const ParamGroupOptions& groups);
// Failure (exit 1) unless `value`, the loss or the global gradient norm of
// training step `step` (0-based) at learning rate `lr`, is finite. A
// non-finite value means the run diverged or its inputs hold NaN/inf: the
// message says which is likely (at step 0, before any update: the weights or
// the data; later: a learning rate too large, naming LrSchedule::lr and the lr_scales
// factors) and how to fix it. Call before the optimizer step, so that no
// NaN reaches the parameters (nor a checkpoint or an export).
void check_finite_training(const char* what, double value, int64_t step, double lr, const ParamGroupOptions& groups);
// Every parameter decayed, lr scale 1: AdamW's behaviour without groups.
ParamRule decay_everything();

// The optimizer: a list of slots (a tensor, its gradient, its moments), all
// updated by step(). Sharded training adds the model's local shards
// (add_shards): each rank updates only its shards, with no communication.
//
// Checkpointed state (Note [State seam], common/state.h): key "optimizer";
// slots exp_avg, exp_avg_sq (and compensation, not required) per tensor;
// metadata {"type": "AdamW", "step": t, "options": {lr, beta1, beta2, eps,
// weight_decay}, "torch": torch.optim.AdamW's param group}. Loading restores
// the step count and refuses another type.
class AdamW : public StateOwner {
 public:
  // No slots yet: add them with add, add_shards or add_module_parameters.
  explicit AdamW(AdamWOptions options);

  // Element ranges of a slot's tensor with their own setting.
  struct Segment {
    int64_t begin = 0;      // first element
    int64_t count = 0;      // elements
    ParamSetting setting;   // how they are updated
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
  // The same with every gradient divided by `grad_scale` (a one-element fp32
  // tensor, on the slots' device or the host; undefined: 1) inside the update
  // — gradient clipping without a pass of its own over the gradients (Note
  // [Clipping inside the fused step] in adamw.cpp; clip_grad_scale below
  // makes the scale). The gradients may be left divided.
  void step(const at::Tensor& grad_scale);
  void set_lr(double lr) { options_.lr = lr; }   // the learning rate of the next steps
  double lr() const { return options_.lr; }       // the current learning rate
  int64_t step_count() const { return step_; }    // steps taken (restored by checkpoints)
  const AdamWOptions& options() const { return options_; }  // as given, with the current lr

  // One optimized tensor and its state.
  struct Slot {
    std::string name;                  // as given to add (a shard: its unit's name)
    at::Tensor param;                  // updated in place
    std::function<at::Tensor()> grad;  // its gradient at step time (undefined: zeros)
    at::Tensor exp_avg;       // same shape as param, state dtype
    at::Tensor exp_avg_sq;    // same shape as param, state dtype
    at::Tensor compensation;  // same shape and dtype as param; only with kahan_summation
    std::vector<Segment> segments;  // element ranges of param in order (never empty)
  };
  // Whether step() updates `slot` with the fused kernel.
  bool fuses(const Slot& slot) const;
  // For checkpoints: state tensors may be read and overwritten in place.
  std::vector<Slot>& slots() { return slots_; }
  void set_step_count(int64_t s) { step_ = s; }  // for checkpoints: the restored step count

  // StateOwner (above): key "optimizer".
  std::string state_key() const override { return "optimizer"; }
  // exp_avg, exp_avg_sq (and compensation, not required) of every slot.
  std::vector<StateSlot> state_slots() override;
  // {"type": "AdamW", "step", "options", "torch"} (above).
  nlohmann::json state_metadata() const override;
  // Restores the step count; UsageError for another optimizer's metadata or none.
  void load_state_metadata(const nlohmann::json& saved) override;

 private:
  void step_fused(const std::vector<Slot*>& slots, const at::Tensor& grad_scale);

  AdamWOptions options_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

// What step(grad_scale) divides by to clip gradients of global norm `norm` to
// `max_norm` (> 0): max(1, (norm + 1e-6) / max_norm) as fp32, on norm's
// device — the inverse of clip_grad_norm's coefficient.
at::Tensor clip_grad_scale(const at::Tensor& norm, double max_norm);

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
// The same norm, without clipping.
double grad_norm(const std::vector<at::Tensor>& grads);

}  // namespace fsdp::optim

#include "fsdp/optim/adamw.h"

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "fsdp/common/error.h"
#include "fsdp/common/name_pattern.h"

namespace fsdp::optim {

AdamW::AdamW(AdamWOptions options) : options_(options) {
  FSDP_CHECK(options_.lr >= 0, "AdamW: lr must be >= 0, got ", options_.lr);
  FSDP_CHECK(options_.beta1 >= 0 && options_.beta1 < 1, "AdamW: beta1 must be in [0, 1), got ", options_.beta1);
  FSDP_CHECK(options_.beta2 >= 0 && options_.beta2 < 1, "AdamW: beta2 must be in [0, 1), got ", options_.beta2);
  FSDP_CHECK(options_.eps > 0, "AdamW: eps must be > 0, got ", options_.eps);
  FSDP_CHECK(options_.weight_decay >= 0, "AdamW: weight_decay must be >= 0, got ", options_.weight_decay);
  FSDP_CHECK(options_.state_dtype == at::kFloat || options_.state_dtype == at::kBFloat16,
             "AdamW: state dtype must be float32 or bfloat16, got ", options_.state_dtype);
}

ParamRule decay_everything() {
  return [](const std::string&, const std::vector<int64_t>&) { return ParamSetting{}; };
}

namespace {

// An lr_scales entry as REGEX=FACTOR, for messages.

std::vector<std::pair<NamePattern, double>> compile_lr_scales(const ParamGroupOptions& options) {
  std::vector<std::pair<NamePattern, double>> scales;
  for (const auto& scale : options.lr_scales) {
    const auto& [pattern, factor] = scale;
    FSDP_CHECK(factor > 0 && factor <= kMaxLrScale, "ParamGroupOptions::lr_scales '", lr_scale_text(scale),
               "': the factor ", factor, " must be > 0 and at most ", kMaxLrScale,
               " (the learning rate times it must stay a finite 32-bit float, which the optimizer computes in)");
    scales.emplace_back(NamePattern(pattern, "ParamGroupOptions::lr_scales"), factor);  // Note [User patterns]
  }
  return scales;
}

}  // namespace

std::string lr_scale_text(const std::pair<std::string, double>& scale) {
  std::ostringstream os;
  os << scale.first << "=" << scale.second;
  return os.str();
}

std::pair<std::string, double> parse_lr_scale(const std::string& s) {
  const size_t eq = s.rfind('=');
  FSDP_CHECK(eq != std::string::npos && eq > 0, "ParamGroupOptions::lr_scales '", s, "' must be REGEX=FACTOR, e.g. "
             "'lora_B=4' or 'embed_tokens=0.1' (parameters whose name the regex finds train at FACTOR x the learning "
             "rate)");
  const std::string factor = s.substr(eq + 1);
  size_t used = 0;
  double f = 0;
  try {
    f = std::stod(factor, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FSDP_CHECK(used == factor.size() && !factor.empty() && f > 0 && std::isfinite(f), "ParamGroupOptions::lr_scales '",
             s, "': the factor '", factor, "' must be a number > 0, e.g. 0.1 or 4");
  return {s.substr(0, eq), f};
}

void check_lr_range(double peak_lr, double min_lr, const AdamWOptions& adamw, const ParamGroupOptions& groups) {
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  std::vector<std::pair<std::string, double>> scales = {{"", 1.0}};
  for (const auto& scale : groups.lr_scales) {
    scales.emplace_back(" x ParamGroupOptions::lr_scales '" + lr_scale_text(scale) + "'", scale.second);
  }
  // The first step divides by 1 - beta1 (bias correction); later steps by more.
  const double first_step = adamw.beta1 >= 0 && adamw.beta1 < 1 ? 1.0 - adamw.beta1 : 1.0;
  for (const auto& [flag, lr] :
       {std::pair<const char*, double>{"LrSchedule::lr", peak_lr}, {"LrSchedule::min_lr", min_lr}}) {
    for (const auto& [scaled_by, factor] : scales) {
      const double step = lr * factor / first_step;
      FSDP_CHECK(std::isfinite(step) && step <= kFloatMax, flag, " ", lr, scaled_by, " gives a first AdamW step of ",
                 lr * factor, " / (1 - AdamWOptions::beta1 ", adamw.beta1, ") = ", step,
                 ", beyond a 32-bit float (3.4e38), which the optimizer computes in; use a smaller ", flag,
                 scaled_by.empty() ? "" : " or factor",
                 " (learning rates are typically 1e-5 to 1e-2)");
      const double decay = lr * factor * adamw.weight_decay;
      FSDP_CHECK(std::isfinite(decay) && decay <= kFloatMax, flag, " ", lr, scaled_by, " x AdamWOptions::weight_decay ",
                 adamw.weight_decay, " = ", decay, " is beyond a 32-bit float (3.4e38), which the optimizer "
                 "computes in; use smaller values");
    }
  }
}

void check_finite_training(const char* what, double value, int64_t step, double lr, const ParamGroupOptions& groups) {
  if (std::isfinite(value)) return;
  const char* shown = std::isnan(value) ? "NaN" : value > 0 ? "inf" : "-inf";
  if (step == 0) {
    FSDP_FAIL("the ", what, " is ", shown, " at step 0, before any update: the initial weights (as imported or "
              "resumed: import_hf: dir, import_peft_adapter: dir, load_latest_checkpoint: dir) or the data produce "
              "NaN/inf; check them (a model trained in float16 may overflow: try FsdpOptions::mixed_precision bf16 "
              "or fp32). The run stopped; nothing was saved or exported");
  }
  double largest = 1.0;
  std::string factors;
  for (const auto& scale : groups.lr_scales) {
    largest = std::max(largest, scale.second);
    factors += (factors.empty() ? "; ParamGroupOptions::lr_scales '" : "', '") + lr_scale_text(scale);
  }
  if (!factors.empty()) factors += "'";
  FSDP_FAIL("the ", what, " became ", shown, " at step ", step, " (lr ", lr, factors, ", largest effective lr ",
            lr * largest, "): training diverged, most likely from a learning rate too large for this model; lower "
            "LrSchedule::lr", factors.empty() ? "" : " or the ParamGroupOptions::lr_scales factors",
            ", raise LrSchedule::warmup_steps or clip with clip_grad_norm: max_norm 1.0. The run stopped at this step; "
            "checkpoints saved before it are intact");
}

ParamRule param_rule(const ParamGroupOptions& options) {
  std::vector<std::pair<NamePattern, double>> scales = compile_lr_scales(options);
  const bool decay_all = options.decay_all;
  return [scales = std::move(scales), decay_all](const std::string& name, const std::vector<int64_t>& shape) {
    ParamSetting s;
    s.decay = decay_all || (shape.size() >= 2 && name.find("embed") == std::string::npos);
    for (const auto& [pattern, scale] : scales) {
      if (pattern.found_in(name)) {
        s.lr_scale = scale;
        break;
      }
    }
    return s;
  };
}

void check_lr_scales_match(const ParamGroupOptions& options, torch::nn::Module& model) {
  const std::vector<std::pair<NamePattern, double>> scales = compile_lr_scales(options);
  std::vector<bool> found(scales.size(), false), found_frozen(scales.size(), false);
  std::string example;  // a decoder layer's trainable parameter where there is one
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    const bool trainable = p.value().requires_grad();
    if (trainable && (example.empty() || p.key().find("layers.0.") != std::string::npos)) example = p.key();
    for (size_t i = 0; i < scales.size(); ++i) {
      if (!scales[i].first.found_in(p.key())) continue;
      (trainable ? found : found_frozen)[i] = true;
      if (trainable) break;  // the first match wins: later patterns do not see this parameter
    }
  }
  for (size_t i = 0; i < scales.size(); ++i) {
    FSDP_CHECK(found[i], "ParamGroupOptions::lr_scales '", lr_scale_text(options.lr_scales[i]),
               "' matches no trainable parameter",
               found_frozen[i] ? " (only frozen ones, which do not train)"
               : i > 0         ? " (none, or only ones an earlier ParamGroupOptions::lr_scales pattern already took)"
                               : "",
               "; parameter names look like '", example, "' — fix the pattern or leave it out");
  }
}

void AdamW::add(std::string name, at::Tensor param, std::function<at::Tensor()> grad, std::vector<Segment> segments) {
  Slot s;
  s.name = std::move(name);
  if (segments.empty()) segments.push_back({0, param.numel(), ParamSetting{}});
  int64_t covered = 0;
  for (const auto& seg : segments) {
    FSDP_ASSERT(seg.begin == covered && seg.count >= 0, "AdamW segments of '", s.name, "' are not consecutive");
    covered += seg.count;
  }
  FSDP_ASSERT(covered == param.numel(), "AdamW segments of '", s.name, "' cover ", covered, " of ", param.numel(),
              " elements");
  s.segments = std::move(segments);
  // Beside the parameter (host memory for CPU-offloaded shards), same layout.
  s.exp_avg = at::zeros_like(param, at::TensorOptions().dtype(options_.state_dtype));
  s.exp_avg_sq = at::zeros_like(param, at::TensorOptions().dtype(options_.state_dtype));
  if (options_.kahan_summation) s.compensation = at::zeros_like(param);
  s.param = std::move(param);
  s.grad = std::move(grad);
  slots_.push_back(std::move(s));
}

void AdamW::add_shards(const std::vector<ShardRef>& shards) {
  for (const auto& r : shards) {
    if (!r.trainable) continue;
    at::Tensor g = r.grad;
    add(r.unit_name.empty() ? "<root>" : r.unit_name, r.param, [g] { return g; });
  }
}

namespace {
// The settings of a shard's elements: its parameters' ranges, merged where
// consecutive ranges agree. Padding takes its neighbour's setting (its
// values and gradients are zero, which every setting leaves at zero).
std::vector<AdamW::Segment> shard_segments(const UnitInfo& unit, const ParamRule& rule) {
  std::vector<AdamW::Segment> out;
  const auto append = [&](int64_t count, const ParamSetting& setting) {
    if (count == 0) return;
    if (!out.empty() && out.back().setting == setting) {
      out.back().count += count;
    } else {
      const int64_t begin = out.empty() ? 0 : out.back().begin + out.back().count;
      out.push_back({begin, count, setting});
    }
  };
  const int64_t lo = unit.shard_offset, hi = unit.shard_offset + unit.shard_numel;
  int64_t at = lo;
  for (const auto& p : unit.params) {
    const int64_t b = std::max(lo, p.flat_offset), e = std::min(hi, p.flat_offset + p.numel);
    if (b >= e) continue;
    const ParamSetting setting = rule(p.name, p.shape);
    if (b > at) append(b - at, out.empty() ? setting : out.back().setting);
    append(e - b, setting);
    at = e;
  }
  if (at < hi) append(hi - at, out.empty() ? ParamSetting{} : out.back().setting);
  return out;
}
}  // namespace

void AdamW::add_shards(const std::vector<ShardRef>& shards, const std::vector<UnitInfo>& units,
                       const ParamRule& rule) {
  FSDP_CHECK(shards.size() == units.size(), "AdamW::add_shards: ", shards.size(), " shards but ", units.size(),
             " unit entries; pass model.shards() and model.units() of the same model");
  for (size_t u = 0; u < shards.size(); ++u) {
    const ShardRef& r = shards[u];
    if (!r.trainable) continue;
    FSDP_CHECK(r.param.numel() == units[u].shard_numel, "AdamW::add_shards: shard ", u, " has ", r.param.numel(),
               " elements but unit entry '", units[u].name, "' ", units[u].shard_numel,
               "; pass model.shards() and model.units() of the same model");
    at::Tensor g = r.grad;
    add(r.unit_name.empty() ? "<root>" : r.unit_name, r.param, [g] { return g; }, shard_segments(units[u], rule));
  }
}

void AdamW::add_module_parameters(torch::nn::Module& module, const ParamRule& rule) {
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    at::Tensor t = p.value();
    if (!t.requires_grad()) continue;  // frozen, as torch.optim given only trainable parameters
    add(p.key(), t, [t] { return t.grad(); }, {{0, t.numel(), rule(p.key(), t.sizes().vec())}});
  }
}

namespace {
// Decoupled weight decay, moment updates, and the denominator
// sqrt(v)/sqrt(1-b2^t) + eps shared by both update rules. Returns the step
// size lr/(1-b1^t).
double decay_and_moments(at::Tensor& param, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                         int64_t step, const AdamWOptions& o, at::Tensor* denom) {
  param.mul_(1.0 - o.lr * o.weight_decay);
  exp_avg.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const double bias1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  *denom = (exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(o.eps);
  return o.lr / bias1;
}
}  // namespace

void adamw_update(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                  int64_t step, const AdamWOptions& o) {
  at::NoGradGuard no_grad;
  const at::Tensor g = grad.defined() ? grad : at::zeros_like(param);
  at::Tensor denom;
  const double step_size = decay_and_moments(param, g, exp_avg, exp_avg_sq, step, o, &denom);
  param.addcdiv_(exp_avg, denom, -step_size);
}

void adamw_update_kahan(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                        at::Tensor& compensation, int64_t step, const AdamWOptions& o) {
  at::NoGradGuard no_grad;
  const at::Tensor g = grad.defined() ? grad : at::zeros_like(param);
  at::Tensor denom;
  const double step_size = decay_and_moments(param, g, exp_avg, exp_avg_sq, step, o, &denom);
  compensation.addcdiv_(exp_avg, denom, -step_size);
  const at::Tensor before = param.clone();
  param.add_(compensation);
  compensation.add_(before.sub_(param));  // what rounding kept out of param
}

bool AdamW::fuses(const Slot& s) const {
  if (!options_.fused || options_.kahan_summation) return false;
  const at::Tensor& p = s.param;
  return (p.is_cpu() || p.is_cuda()) && p.is_contiguous() && at::isFloatingType(p.scalar_type()) &&
         s.exp_avg.scalar_type() == p.scalar_type() && s.exp_avg_sq.scalar_type() == p.scalar_type();
}

// Note [Fused AdamW tails]
// at::_fused_adamw_ runs most elements through its vector loop and the last
// few of each tensor (fewer than a vector) through a scalar loop, which the
// compiler may contract into fused multiply-adds: the same element can round
// differently depending on where it lies in the tensor it is passed in (seen:
// exp_avg_sq of the last element). A flat shard and the parameters of an
// unsharded reference cut the same elements differently, so every call here
// gets whole multiples of kFusedAlign elements: each segment's aligned prefix
// in place, and the remainders of all segments of one setting copied into one
// zero-padded scratch, kFusedAlign elements per remainder, and copied back.
// Zero padding is harmless (p = m = v = g = 0 stays 0). Every element then
// takes the vector loop, whose result depends only on its own values.
namespace {
constexpr int64_t kFusedAlign = 64;  // a multiple of every vector width in elements (AVX-512: 16 fp32, 32 bf16)

struct FusedCall {
  double lr = 0, weight_decay = 0;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  // Remainders: where they come from, in order.
  std::vector<at::Tensor> tail_params, tail_grads, tail_exp_avgs, tail_exp_avg_sqs;
};
}  // namespace

// Note [Clipping inside the fused step]
// Clipping by norm multiplies every gradient by min(1, max_norm / (norm +
// 1e-6)) before the update: one more read and write of every gradient, which
// on a GPU is bandwidth the step pays for nothing. at::_fused_adamw_ takes a
// grad_scale that it divides each gradient by as it loads it (the kernel's
// unscaling of AMP's loss scale), so step(grad_scale) passes
// max(1, (norm + 1e-6) / max_norm) there and the pass disappears. x / s rounds
// otherwise than x * (1 / s): within one ulp of each clipped gradient, and
// exactly the same when nothing is clipped (s = 1).
void AdamW::step_fused(const std::vector<Slot*>& slots, const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;
  std::vector<FusedCall> calls;
  const auto call_for = [&](double lr, double wd, const at::Tensor& p) -> FusedCall& {
    for (auto& c : calls) {
      if (c.lr == lr && c.weight_decay == wd && c.device == p.device() && c.dtype == p.scalar_type()) return c;
    }
    FusedCall c;
    c.lr = lr;
    c.weight_decay = wd;
    c.device = p.device();
    c.dtype = p.scalar_type();
    calls.push_back(std::move(c));
    return calls.back();
  };
  for (Slot* s : slots) {
    at::Tensor g = s->grad();
    if (!g.defined()) g = at::zeros_like(s->param);  // the missing-gradient rule: zeros
    FSDP_ASSERT(g.sizes() == s->param.sizes(), "gradient of '", s->name, "' has shape ", g.sizes(), ", parameter ",
                s->param.sizes());
    if (g.scalar_type() != s->param.scalar_type() || g.device() != s->param.device() || !g.is_contiguous()) {
      g = g.to(s->param.options()).contiguous();
    }
    const at::Tensor p = s->param.view({-1}), m = s->exp_avg.view({-1}), v = s->exp_avg_sq.view({-1}),
                     gf = g.view({-1});
    for (const Segment& seg : s->segments) {
      if (seg.count == 0) continue;
      FusedCall& c = call_for(options_.lr * seg.setting.lr_scale, seg.setting.decay ? options_.weight_decay : 0.0, p);
      const int64_t aligned = seg.count / kFusedAlign * kFusedAlign;
      const auto push = [&](std::vector<at::Tensor>& to, const at::Tensor& t, int64_t off, int64_t n) {
        to.push_back(t.narrow(0, seg.begin + off, n));
      };
      if (aligned > 0) {
        push(c.params, p, 0, aligned);
        push(c.grads, gf, 0, aligned);
        push(c.exp_avgs, m, 0, aligned);
        push(c.exp_avg_sqs, v, 0, aligned);
      }
      if (aligned < seg.count) {
        push(c.tail_params, p, aligned, seg.count - aligned);
        push(c.tail_grads, gf, aligned, seg.count - aligned);
        push(c.tail_exp_avgs, m, aligned, seg.count - aligned);
        push(c.tail_exp_avg_sqs, v, aligned, seg.count - aligned);
      }
    }
  }
  for (FusedCall& c : calls) {
    const at::TensorOptions opts = at::TensorOptions().dtype(c.dtype).device(c.device);
    // Scratch for the remainders: 4 tensors of kFusedAlign elements per remainder.
    const int64_t tails = static_cast<int64_t>(c.tail_params.size());
    at::Tensor scratch;
    if (tails > 0) {
      scratch = at::zeros({4, tails * kFusedAlign}, opts);
      const std::vector<at::Tensor>* from[4] = {&c.tail_params, &c.tail_grads, &c.tail_exp_avgs,
                                                &c.tail_exp_avg_sqs};
      for (int k = 0; k < 4; ++k) {
        for (int64_t i = 0; i < tails; ++i) {
          const at::Tensor& src = (*from[k])[static_cast<size_t>(i)];
          scratch[k].narrow(0, i * kFusedAlign, src.numel()).copy_(src);
        }
      }
      c.params.push_back(scratch[0]);
      c.grads.push_back(scratch[1]);
      c.exp_avgs.push_back(scratch[2]);
      c.exp_avg_sqs.push_back(scratch[3]);
    }
    // The kernel reads the (already incremented) step count from a float tensor per parameter.
    const at::Tensor step = at::full({}, static_cast<double>(step_), at::TensorOptions().dtype(at::kFloat).device(c.device));
    const std::vector<at::Tensor> steps(c.params.size(), step);
    const std::optional<at::Tensor> scale =
        grad_scale.defined() ? std::optional<at::Tensor>(grad_scale.to(c.device, at::kFloat)) : std::nullopt;
    at::_fused_adamw_(c.params, c.grads, c.exp_avgs, c.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, c.lr,
                      options_.beta1, options_.beta2, c.weight_decay, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, scale);
    if (tails > 0) {
      // Parameters and moments back from the scratch.
      const std::vector<at::Tensor>* to[3] = {&c.tail_params, &c.tail_exp_avgs, &c.tail_exp_avg_sqs};
      const int rows[3] = {0, 2, 3};
      for (int k = 0; k < 3; ++k) {
        for (int64_t i = 0; i < tails; ++i) {
          at::Tensor dst = (*to[k])[static_cast<size_t>(i)];
          dst.copy_(scratch[rows[k]].narrow(0, i * kFusedAlign, dst.numel()));
        }
      }
    }
  }
}

at::Tensor clip_grad_scale(const at::Tensor& norm, double max_norm) {
  FSDP_CHECK(max_norm > 0, "clip_grad_scale: max_norm must be > 0, got ", max_norm);
  return ((norm.to(at::kFloat) + 1e-6) / max_norm).clamp_min(1.0);
}

void AdamW::step() { step(at::Tensor()); }

void AdamW::step(const at::Tensor& grad_scale) {
  FSDP_CHECK(!grad_scale.defined() || grad_scale.numel() == 1, "AdamW::step: grad_scale must hold one value, got ",
             grad_scale.numel());
  ++step_;
  std::vector<Slot*> fused;
  for (auto& s : slots_) {
    if (fuses(s)) {
      fused.push_back(&s);
      continue;
    }
    at::Tensor g = s.grad();
    if (g.defined()) {
      FSDP_ASSERT(g.sizes() == s.param.sizes(), "gradient of '", s.name, "' has shape ", g.sizes(),
                  ", parameter ", s.param.sizes());
      if (grad_scale.defined()) g.div_(grad_scale.to(g.device(), at::kFloat));
    }
    for (const Segment& seg : s.segments) {
      AdamWOptions o = options_;
      if (!seg.setting.decay) o.weight_decay = 0.0;
      o.lr = options_.lr * seg.setting.lr_scale;
      const bool whole = seg.begin == 0 && seg.count == s.param.numel();
      const auto part = [&](const at::Tensor& t) {
        return whole || !t.defined() ? t : t.view({-1}).narrow(0, seg.begin, seg.count);
      };
      at::Tensor param = part(s.param), exp_avg = part(s.exp_avg), exp_avg_sq = part(s.exp_avg_sq);
      if (options_.kahan_summation) {
        at::Tensor compensation = part(s.compensation);
        adamw_update_kahan(param, part(g), exp_avg, exp_avg_sq, compensation, step_, o);
      } else {
        adamw_update(param, part(g), exp_avg, exp_avg_sq, step_, o);
      }
    }
  }
  if (!fused.empty()) step_fused(fused, grad_scale);
}

std::vector<StateSlot> AdamW::state_slots() {
  std::vector<StateSlot> out;
  for (auto& s : slots_) {
    out.push_back({"exp_avg", s.param, s.exp_avg, true});
    out.push_back({"exp_avg_sq", s.param, s.exp_avg_sq, true});
    if (s.compensation.defined()) out.push_back({"compensation", s.param, s.compensation, false});
  }
  return out;
}

nlohmann::json AdamW::state_metadata() const {
  const AdamWOptions& o = options_;
  // "torch": torch.optim.AdamW's parameter group as PyTorch 2.11 writes it (every key of its
  // state_dict()["param_groups"][0] but "params"), for checkpoints PyTorch loads (checkpoint/dcp.h).
  return {{"type", "AdamW"},
          {"step", step_},
          {"options",
           {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}}},
          {"torch",
           {{"lr", o.lr}, {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weight_decay},
            {"amsgrad", false}, {"maximize", false}, {"foreach", nullptr}, {"capturable", false},
            {"differentiable", false}, {"fused", nullptr}, {"decoupled_weight_decay", true}}}};
}

void AdamW::load_state_metadata(const nlohmann::json& saved) { step_ = saved_optimizer_step(saved, "AdamW"); }

double grad_norm(const std::vector<at::Tensor>& grads) {
  double sq = 0.0;
  for (const auto& g : grads) {
    if (g.defined()) sq += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm) {
  FSDP_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  const double norm = grad_norm(grads);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (const auto& g : grads) {
      if (g.defined()) g.mul_(coef);
    }
  }
  return norm;
}

}  // namespace fsdp::optim

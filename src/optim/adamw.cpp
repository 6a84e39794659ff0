#include "fsdp/optim/adamw.h"

#include <torch/nn/module.h>

#include <cmath>

#include "fsdp/common/error.h"

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

void AdamW::add(std::string name, at::Tensor param, std::function<at::Tensor()> grad) {
  Slot s;
  s.name = std::move(name);
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
    at::Tensor g = r.grad;
    add(r.unit_name.empty() ? "<root>" : r.unit_name, r.param, [g] { return g; });
  }
}

void AdamW::add_module_parameters(torch::nn::Module& module) {
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    at::Tensor t = p.value();
    add(p.key(), t, [t] { return t.grad(); });
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

void AdamW::step() {
  ++step_;
  for (auto& s : slots_) {
    at::Tensor g = s.grad();
    if (g.defined()) {
      FSDP_ASSERT(g.sizes() == s.param.sizes(), "gradient of '", s.name, "' has shape ", g.sizes(),
                  ", parameter ", s.param.sizes());
    }
    if (options_.kahan_summation) {
      adamw_update_kahan(s.param, g, s.exp_avg, s.exp_avg_sq, s.compensation, step_, options_);
    } else {
      adamw_update(s.param, g, s.exp_avg, s.exp_avg_sq, step_, options_);
    }
  }
}

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

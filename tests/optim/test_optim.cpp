#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "fsdp/common/error.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"

namespace fsdp {
namespace {

// Loss 0.5 * |p - target|^2 / N and its gradient.
at::Tensor quadratic_grad(const at::Tensor& p, const at::Tensor& target) {
  return (p.to(at::kFloat) - target) / static_cast<double>(p.numel());
}

double quadratic_loss(const at::Tensor& p, const at::Tensor& target) {
  return 0.5 * (p.to(at::kFloat) - target).pow(2).sum().item<double>() / static_cast<double>(p.numel());
}

}  // namespace

// The update is torch.optim.AdamW's: compare with LibTorch's implementation.
TEST(AdamW, MatchesLibTorchsAdamW) {
  torch::manual_seed(0);
  at::Tensor ours = at::randn({257});
  at::Tensor theirs = ours.clone().set_requires_grad(true);
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  at::Tensor grad;
  optim::AdamW opt(o);
  opt.add("p", ours, [&] { return grad; });
  torch::optim::AdamW ref({theirs}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < 20; ++step) {
    grad = at::sin(at::arange(257, at::kFloat) * (step + 1));
    theirs.mutable_grad() = grad.clone();
    ref.step();
    opt.step();
    EXPECT_LE((ours - theirs.detach()).abs().max().item<double>(), 1e-6) << "step " << step;
  }
}

// Weight stagnation in pure bf16 (arXiv 2010.06192): with weights near 1 a
// bf16 ulp is 2^-7, so AdamW updates of ~lr = 1e-3 round away entirely and
// the weights never move; with Kahan compensation they track fp32.
TEST(AdamW, PlainBf16StagnatesWhereKahanCompensatedTracksFp32) {
  const int64_t n = 4096;
  const at::Tensor start = 1.0 + 0.25 * at::rand({n});                 // weights in [1, 1.25)
  const at::Tensor target = start + 0.05 * (at::rand({n}) - 0.5) * 2;  // within +-0.05
  optim::AdamWOptions fp32;
  fp32.lr = 1e-3;
  fp32.weight_decay = 0.0;
  optim::AdamWOptions plain = fp32;
  plain.state_dtype = at::kBFloat16;
  optim::AdamWOptions kahan = plain;
  kahan.kahan_summation = true;

  struct Run {
    at::Tensor p;
    at::Tensor g;
    std::unique_ptr<optim::AdamW> opt;
  };
  auto make = [&](at::ScalarType dt, const optim::AdamWOptions& o) {
    Run r;
    r.p = start.to(dt);
    r.opt = std::make_unique<optim::AdamW>(o);
    at::Tensor* g = &r.g;
    r.opt->add("p", r.p, [g] { return *g; });
    return r;
  };
  Run a = make(at::kFloat, fp32), b = make(at::kBFloat16, plain), c = make(at::kBFloat16, kahan);
  const double initial = quadratic_loss(b.p, target);
  for (int step = 0; step < 200; ++step) {
    for (Run* r : {&a, &b, &c}) {
      r->g = quadratic_grad(r->p, target).to(r->p.scalar_type());
      r->opt->step();
    }
  }
  const double la = quadratic_loss(a.p, target), lb = quadratic_loss(b.p, target), lc = quadratic_loss(c.p, target);
  std::cout << "[stagnation] loss after 200 steps: initial " << initial << ", fp32 " << la << ", bf16 plain " << lb
            << ", bf16 Kahan " << lc << "\n";
  EXPECT_LT(la, 0.01 * initial);           // fp32 converges
  EXPECT_GT(lb, 0.9 * initial);            // plain bf16 stagnates
  EXPECT_LT(lc, 0.02 * initial);           // compensated bf16 converges too
  // and stays within one bf16 ulp (2^-7 for [1, 2)) of the fp32 weights
  EXPECT_LE((c.p.to(at::kFloat) - a.p).abs().max().item<double>(), std::ldexp(1.0, -7));
}

TEST(AdamW, UndefinedGradientIsAZeroGradient) {
  optim::AdamWOptions o;
  o.weight_decay = 0.5;
  o.lr = 0.1;
  at::Tensor p = at::ones({3});
  optim::AdamW opt(o);
  opt.add("p", p, [] { return at::Tensor(); });
  opt.step();
  EXPECT_TRUE(p.allclose(at::full({3}, 0.95)));  // only the decay moved it
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  optim::LrSchedule s;
  s.lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 4;
  s.max_steps = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_NEAR(s.at(9), 0.55, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.at(13), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.9)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  s.min_lr = 2.0;
  EXPECT_THROW(s.validate(), UsageError);
}

}  // namespace fsdp

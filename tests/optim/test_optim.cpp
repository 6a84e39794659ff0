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

// Parameter groups on a flat shard: the segments found from the placements
// give each parameter its own weight decay and learning rate, exactly as a
// separate optimizer slot per parameter would (the unsharded reference).
TEST(AdamW, ParamGroupsSplitAFlatShardByParameter) {
  // A unit of three parameters: a norm weight (1-D), a matrix, an embedding;
  // this rank's shard covers elements [3, 3 + 12) of the padded flat (16).
  UnitInfo unit;
  unit.name = "u";
  unit.params = {{"u.norm.weight", {4}, 0, 4}, {"u.proj.weight", {2, 3}, 4, 6}, {"u.embed_tokens.weight", {5}, 10, 5}};
  unit.numel = 15;
  unit.padded_numel = 16;
  unit.shard_numel = 13;
  unit.shard_offset = 3;
  optim::ParamGroupOptions g;
  g.lr_scales = {{"proj", 0.5}};
  const optim::ParamRule rule = optim::param_rule(g);
  EXPECT_FALSE(rule("u.norm.weight", {4}).decay);
  EXPECT_TRUE(rule("u.proj.weight", {2, 3}).decay);
  EXPECT_EQ(rule("u.proj.weight", {2, 3}).lr_scale, 0.5);
  EXPECT_FALSE(rule("u.embed_tokens.weight", {5}).decay);
  g.decay_all = true;
  EXPECT_TRUE(optim::param_rule(g)("u.embed_tokens.weight", {5}).decay);

  optim::AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  torch::manual_seed(0);
  const at::Tensor flat = at::randn({16});
  at::Tensor shard = flat.narrow(0, 3, 13).clone();
  at::Tensor grad = at::randn({13});
  optim::AdamW opt(o);
  opt.add_shards({ShardRef{"u", shard, grad}}, {unit}, rule);
  ASSERT_EQ(opt.slots()[0].segments.size(), 3u);  // norm (+ nothing before), proj, embed + padding
  EXPECT_EQ(opt.slots()[0].segments[0].count, 1);  // the norm's last element
  EXPECT_EQ(opt.slots()[0].segments[1].count, 6);
  EXPECT_EQ(opt.slots()[0].segments[2].count, 6);  // 5 of the embedding and 1 of padding

  // The reference: one slot per parameter part with its own options.
  std::vector<at::Tensor> parts = {flat.narrow(0, 3, 1).clone(), flat.narrow(0, 4, 6).clone(),
                                   flat.narrow(0, 10, 6).clone()};
  const std::vector<optim::ParamSetting> settings = {{false, 1.0}, {true, 0.5}, {false, 1.0}};
  std::vector<at::Tensor> m, v;
  for (const auto& p : parts) {
    m.push_back(at::zeros_like(p));
    v.push_back(at::zeros_like(p));
  }
  for (int step = 1; step <= 3; ++step) {
    opt.step();
    int64_t first = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      optim::AdamWOptions ok = o;
      ok.lr = o.lr * settings[k].lr_scale;
      ok.weight_decay = settings[k].decay ? o.weight_decay : 0.0;
      optim::adamw_update(parts[k], grad.narrow(0, first, parts[k].numel()), m[k], v[k], step, ok);
      EXPECT_TRUE(shard.narrow(0, first, parts[k].numel()).equal(parts[k])) << "part " << k << " step " << step;
      first += parts[k].numel();
    }
  }
  // And the groups change the result: without them every part moves differently.
  at::Tensor plain_shard = flat.narrow(0, 3, 13).clone();
  optim::AdamW plain(o);
  plain.add_shards({ShardRef{"u", plain_shard, grad}});
  for (int step = 1; step <= 3; ++step) plain.step();
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 1}, {1, 6}, {7, 5}}) {
    EXPECT_FALSE(plain_shard.narrow(0, first, count).equal(shard.narrow(0, first, count))) << first;
  }
}

// Frozen shards hold no optimizer state.
TEST(AdamW, FrozenShardsAreSkipped) {
  optim::AdamW opt(optim::AdamWOptions{});
  at::Tensor frozen = at::ones({4});
  opt.add_shards({ShardRef{"a", at::ones({3}), at::zeros({3})}, ShardRef{"a", frozen, at::Tensor(), false}});
  ASSERT_EQ(opt.slots().size(), 1u);
  opt.step();
  EXPECT_TRUE(frozen.equal(at::ones({4})));
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

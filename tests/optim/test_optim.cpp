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
  o.fused = false;  // compared with adamw_update, the loop's arithmetic (the fused kernel: below)
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

// The fused kernel (at::_fused_adamw_) against the loop: the same update in
// another order of operations, so equal to rounding (printed: the largest
// difference and the share of elements that differ), on shards whose segments
// have different settings and lengths that are not multiples of the vector width.
TEST(AdamW, FusedStepEqualsTheLoopToRounding) {
  const int64_t n = 100003;
  torch::manual_seed(1);
  const at::Tensor start = at::randn({n});
  // Three segments: decayed, not decayed, decayed at half the learning rate.
  const std::vector<optim::AdamW::Segment> segments = {
      {0, 40001, {true, 1.0}}, {40001, 777, {false, 1.0}}, {40778, n - 40778, {true, 0.5}}};
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    optim::AdamWOptions o;
    o.lr = 1e-3;
    o.weight_decay = 0.1;
    o.state_dtype = dt;
    optim::AdamWOptions loop_o = o;
    loop_o.fused = false;
    at::Tensor pf = start.to(dt).clone(), pl = start.to(dt).clone(), g;
    optim::AdamW fused(o), loop(loop_o);
    fused.add("p", pf, [&] { return g; }, segments);
    loop.add("p", pl, [&] { return g; }, segments);
    ASSERT_TRUE(fused.fuses(fused.slots()[0]));
    ASSERT_FALSE(loop.fuses(loop.slots()[0]));
    for (int step = 0; step < 20; ++step) {
      g = at::randn({n}).to(dt);
      fused.step();
      loop.step();
    }
    const at::Tensor d = (pf.to(at::kFloat) - pl.to(at::kFloat)).abs();
    const double moved = (pl.to(at::kFloat) - start.to(dt).to(at::kFloat)).abs().max().item<double>();
    const double worst = d.max().item<double>();
    const double share = d.gt(0).to(at::kDouble).mean().item<double>();
    std::cout << "[fused AdamW] " << c10::toString(dt) << ", 20 steps: largest difference from the loop " << worst
              << " (the loop moved the weights up to " << moved << "), " << 100 * share << "% of elements differ\n";
    EXPECT_GT(worst, 0.0) << "the fused kernel did not run: the loop's result, bit for bit";
    if (dt == at::kFloat) {
      // Rounding of the update, not another update: at most one ulp of the largest weight.
      const double wmax = pl.abs().max().item<double>();
      EXPECT_LE(worst, std::ldexp(1.0, std::ilogb(wmax) - 23)) << "largest weight " << wmax;
      EXPECT_LT(share, 0.1);
    } else {
      // bf16: the kernel keeps the arithmetic in fp32 and rounds once; the loop
      // rounds each operation to bf16. One bf16 ulp of the weights (|w| < 8).
      EXPECT_LE(worst, std::ldexp(1.0, -5));
    }
  }
}

// Note [Clipping inside the fused step]: step(grad_scale) against clipping by
// multiplication then step(), fused and loop, with an odd length (a tail in
// the fused scratch) and two settings. Nothing clipped (scale 1): the same
// bits. Clipped: within an fp32 ulp of the largest weight (x / s against
// x * (1 / s)) for the fused kernel; the loop divides first, then runs its own
// update, so it equals dividing by hand bit for bit.
TEST(AdamW, ClippingInsideTheStepMatchesClippingBeforeIt) {
  const int64_t n = 4099;
  torch::manual_seed(3);
  const at::Tensor start = at::randn({n});
  const std::vector<optim::AdamW::Segment> segments = {{0, 2001, {true, 1.0}}, {2001, n - 2001, {false, 1.0}}};
  for (const bool fused : {true, false}) {
    for (const double max_norm : {1e9, 5.0}) {  // never clipped; clipped every step (|g| ~ 64)
      SCOPED_TRACE(::testing::Message() << (fused ? "fused" : "loop") << ", max_norm " << max_norm);
      optim::AdamWOptions o;
      o.lr = 1e-2;
      o.weight_decay = 0.1;
      o.fused = fused;
      at::Tensor before = start.clone(), inside = start.clone(), g_before, g_inside;
      optim::AdamW a(o), b(o);
      a.add("p", before, [&] { return g_before; }, segments);
      b.add("p", inside, [&] { return g_inside; }, segments);
      ASSERT_EQ(a.fuses(a.slots()[0]), fused);
      for (int step = 0; step < 10; ++step) {
        const at::Tensor g = at::randn({n});
        const at::Tensor norm = g.norm();
        const at::Tensor scale = optim::clip_grad_scale(norm, max_norm);
        EXPECT_EQ(scale.item<double>() > 1.0, max_norm < 1e9);
        g_before = g.clone();
        const double coef = max_norm / (norm.item<double>() + 1e-6);
        if (coef < 1.0) g_before.mul_(coef);
        g_before = fused ? g_before : g.clone().div_(scale);  // the loop divides: the same division by hand
        g_inside = g.clone();
        a.step();
        b.step(scale);
      }
      const double worst = (before - inside).abs().max().item<double>();
      if (max_norm >= 1e9 || !fused) {
        EXPECT_EQ(worst, 0.0);
      } else {
        EXPECT_LE(worst, std::ldexp(1.0, std::ilogb(before.abs().max().item<double>()) - 23));
        EXPECT_GT((before - start).abs().max().item<double>(), 1e-3) << "the weights did not move";
      }
    }
  }
  EXPECT_THROW(optim::clip_grad_scale(at::ones({}), 0.0), UsageError);
  optim::AdamW a{optim::AdamWOptions{}};
  EXPECT_THROW(a.step(at::ones({2})), UsageError);
}

// Every element gets the same bits wherever it lies in the tensors passed to
// the kernel (Note [Fused AdamW tails]): a flat parameter cut into two shards
// at an odd offset (two slots, one segment each: a setting shared by
// neighbouring parameters merges into one segment) equals one slot per
// parameter, bit for bit — what makes sharded training equal its unsharded
// reference.
TEST(AdamW, FusedStepIsTheSameWhereverAnElementLies) {
  torch::manual_seed(2);
  const std::vector<int64_t> sizes = {1, 17, 63, 64, 65, 1000, 4099};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  const at::Tensor start = at::randn({total});
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  const int64_t cut = total / 2 + 3;
  at::Tensor flat = start.clone(), flat_grad;
  optim::AdamW sharded(o);
  sharded.add("shard0", flat.narrow(0, 0, cut), [&] { return flat_grad.narrow(0, 0, cut); });
  sharded.add("shard1", flat.narrow(0, cut, total - cut), [&] { return flat_grad.narrow(0, cut, total - cut); });
  std::vector<at::Tensor> parts, part_grads(sizes.size());
  optim::AdamW reference(o);
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    parts.push_back(start.narrow(0, at, sizes[i]).clone());
    at::Tensor* g = &part_grads[i];
    reference.add("p" + std::to_string(i), parts.back(), [g] { return *g; });
    at += sizes[i];
  }
  for (int step = 0; step < 30; ++step) {
    flat_grad = at::randn({total});
    at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      part_grads[i] = flat_grad.narrow(0, at, sizes[i]).clone();
      at += sizes[i];
    }
    sharded.step();
    reference.step();
  }
  const at::Tensor v = at::cat({sharded.slots()[0].exp_avg_sq, sharded.slots()[1].exp_avg_sq});
  at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(flat.narrow(0, at, sizes[i]).equal(parts[i])) << "parameter " << i << " of " << sizes[i];
    EXPECT_TRUE(v.narrow(0, at, sizes[i]).equal(reference.slots()[i].exp_avg_sq)) << "exp_avg_sq of parameter " << i;
    at += sizes[i];
  }
}

// Kahan-compensated bf16 and moments in another dtype than the parameter
// keep the loop.
TEST(AdamW, FusedKernelOnlyWhereItApplies) {
  optim::AdamWOptions kahan;
  kahan.state_dtype = at::kBFloat16;
  kahan.kahan_summation = true;
  optim::AdamW a(kahan);
  a.add("p", at::ones({8}, at::kBFloat16), [] { return at::Tensor(); });
  EXPECT_FALSE(a.fuses(a.slots()[0]));
  optim::AdamWOptions mixed;
  mixed.state_dtype = at::kBFloat16;
  optim::AdamW b(mixed);
  b.add("p", at::ones({8}), [] { return at::Tensor(); });
  EXPECT_FALSE(b.fuses(b.slots()[0]));
  optim::AdamW c(optim::AdamWOptions{});
  c.add("p", at::ones({8}), [] { return at::Tensor(); });
  EXPECT_TRUE(c.fuses(c.slots()[0]));
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

#include "parity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "fsdp/optim/adamw.h"
#include "toy_models.h"

namespace fsdp::testing {
namespace {

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::abs(b)); }

// The reference's flat view of one unit, padded like the shard layout.
at::Tensor reference_flat(torch::nn::Module& ref, const UnitInfo& u) {
  std::map<std::string, at::Tensor> by_name;
  for (auto& p : ref.named_parameters(true)) by_name[p.key()] = p.value();
  std::vector<at::Tensor> parts;
  for (const auto& p : u.params) parts.push_back(by_name.at(p.name).detach().reshape({-1}));
  at::Tensor flat = at::zeros({u.padded_numel});
  if (!parts.empty()) flat.narrow(0, 0, u.numel).copy_(at::cat(parts));
  return flat;
}

}  // namespace

ParityReport run_parity(const comm::ProcessGroupPtr& world, const ParityModel& model, const ParityConfig& c) {
  const int W = world->size();
  const int r = world->rank();
  EXPECT_EQ(c.global_batch % (W * c.grad_accum), 0) << "global batch must split evenly";
  const int64_t B = c.global_batch / (W * c.grad_accum);

  optim::AdamWOptions ao;
  ao.lr = c.lr;
  ao.weight_decay = c.weight_decay;

  // --- sharded
  std::shared_ptr<nn::UnitBase> root = model.build(c.build_on_meta, c.seed);
  FsdpOptions fo = c.fsdp;
  fo.init_rule = model.init_rule;
  fo.seed = c.seed;
  auto sharded = fully_shard(root, world, fo);
  optim::AdamW opt(ao);
  opt.add_shards(sharded->shards());

  // --- reference
  std::shared_ptr<nn::UnitBase> ref = model.build(false, c.seed);
  optim::AdamW ref_opt(ao);
  ref_opt.add_module_parameters(*ref);
  std::vector<at::Tensor> ref_params;
  for (auto& p : ref->named_parameters(true)) ref_params.push_back(p.value());

  ParityReport rep;
  for (int64_t s = 0; s < c.steps; ++s) {
    // sharded step
    sharded->zero_grad();
    double local = 0;
    for (int64_t a = 0; a < c.grad_accum; ++a) {
      sharded->set_requires_gradient_sync(a == c.grad_accum - 1);
      at::Tensor loss = model.loss(*root, s, (a * W + r) * B, B) / static_cast<double>(c.grad_accum);
      loss.backward();
      local += loss.item<double>();
    }
    at::Tensor lt = at::full({1}, local, at::TensorOptions().dtype(at::kDouble));
    world->all_reduce(lt, comm::ReduceOp::kAvg)->wait();
    const double loss_sharded = lt.item<double>();
    if (c.clip > 0) sharded->clip_grad_norm(c.clip);
    opt.step();

    // reference step, same arithmetic order
    std::vector<at::Tensor> sum(ref_params.size());
    double ref_loss = 0;
    for (int rr = 0; rr < W; ++rr) {
      for (auto& p : ref_params) p.mutable_grad().reset();
      double l_rr = 0;
      for (int64_t a = 0; a < c.grad_accum; ++a) {
        at::Tensor loss = model.loss(*ref, s, (a * W + rr) * B, B) / static_cast<double>(c.grad_accum);
        loss.backward();
        l_rr += loss.item<double>();
      }
      ref_loss += l_rr;
      for (size_t i = 0; i < ref_params.size(); ++i) {
        at::Tensor g = ref_params[i].grad().defined() ? ref_params[i].grad() : at::zeros_like(ref_params[i]);
        sum[i] = rr == 0 ? g.clone() : sum[i] + g;
      }
    }
    ref_loss /= W;
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < ref_params.size(); ++i) {
      ref_params[i].mutable_grad() = sum[i] / static_cast<double>(W);
      grads.push_back(ref_params[i].grad());
    }
    if (c.clip > 0) optim::clip_grad_norm(grads, c.clip);
    ref_opt.step();

    rep.losses.push_back(loss_sharded);
    rep.ref_losses.push_back(ref_loss);
    const double d = rel(loss_sharded, ref_loss);
    rep.worst_loss_rel = std::max(rep.worst_loss_rel, d);
    if (c.expect_bitwise) {
      EXPECT_EQ(loss_sharded, ref_loss) << "step " << s;
    } else {
      EXPECT_LE(d, c.loss_rtol) << "step " << s << ": sharded loss " << loss_sharded << " vs reference " << ref_loss;
    }
  }

  // Every local shard against the matching slice of the reference.
  const auto& units = sharded->units();
  const auto shards = sharded->shards();
  for (size_t u = 0; u < units.size(); ++u) {
    at::Tensor want = reference_flat(*ref, units[u]).narrow(0, units[u].shard_offset, units[u].shard_numel);
    at::Tensor got = shards[u].param;
    const double diff = (got - want).abs().max().item<double>();
    rep.worst_param_abs = std::max(rep.worst_param_abs, diff);
    if (c.expect_bitwise) {
      EXPECT_TRUE(got.equal(want)) << "unit '" << units[u].name << "' differs by " << diff;
    } else {
      EXPECT_LE(diff, c.param_atol) << "unit '" << units[u].name << "' shard differs from the reference slice by "
                                    << diff;
    }
  }
  std::cout << "[parity] " << model.name << " " << to_string(fo.strategy) << " W=" << W << " rank " << r
            << ": worst loss rel diff " << rep.worst_loss_rel << ", worst param abs diff " << rep.worst_param_abs
            << ", loss " << rep.losses.front() << " -> " << rep.losses.back() << "\n";
  return rep;
}

ParityModel toy_parity_model(bool with_unused, int64_t d, int64_t f) {
  ToyConfig cfg;
  cfg.d = d;
  cfg.f = f;
  cfg.with_unused = with_unused;
  ParityModel m;
  m.name = with_unused ? "toy+unused" : "toy";
  m.build = [cfg](bool meta, uint64_t seed) -> std::shared_ptr<nn::UnitBase> {
    return make_toy(cfg, meta, seed).ptr();
  };
  m.init_rule = toy_init_rule;
  m.loss = [cfg](nn::UnitBase& root, int64_t step, int64_t first, int64_t count) {
    auto& net = dynamic_cast<nn::UnitImpl<ToyNetImpl>&>(root);
    // Sample k of step s: a pure function of (s, k), so any split of the
    // global batch sees the same samples.
    at::Tensor x = at::empty({count, cfg.d_in});
    at::Tensor y = at::empty({count, cfg.d_out});
    for (int64_t k = 0; k < count; ++k) {
      const std::string key = "sample/" + std::to_string(step) + "/" + std::to_string(first + k);
      nn::init_slice(x[k], nn::InitRule::normal(1.0), 99, key + "/x", 0);
      nn::init_slice(y[k], nn::InitRule::normal(1.0), 99, key + "/y", 0);
    }
    return net.forward(x, y);
  };
  return m;
}

}  // namespace fsdp::testing

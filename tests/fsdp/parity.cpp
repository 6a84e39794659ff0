#include "parity.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <iostream>
#include <map>
#include <regex>

#include "fsdp/optim/adamw.h"
#include "fsdp/optim/grad_scaler.h"
#include "toy_models.h"

namespace fsdp::testing {
namespace {

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::abs(b)); }

// The reference's flat view of one unit (its master values), padded like the shard layout.
at::Tensor reference_flat(const std::map<std::string, at::Tensor>& masters, const UnitInfo& u) {
  std::vector<at::Tensor> parts;
  for (const auto& p : u.params) parts.push_back(masters.at(p.name).detach().reshape({-1}).to(at::kFloat));
  at::Tensor flat = at::zeros({u.padded_numel});
  if (!parts.empty()) flat.narrow(0, 0, u.numel).copy_(at::cat(parts));
  return flat;
}

// Casts the root's floating inputs to the param dtype, as a sharded unit does.
struct CastInputs : nn::UnitHooks {
  explicit CastInputs(at::ScalarType dt) : dt_(dt) {}
  std::vector<at::Tensor> run(const nn::TensorFn& fn, const std::vector<at::Tensor>& inputs) override {
    std::vector<at::Tensor> in;
    for (const auto& x : inputs) in.push_back(x.defined() && x.is_floating_point() ? x.to(dt_) : x);
    return fn(in);
  }
  at::ScalarType dt_;
};

bool all_finite(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (t.defined() && !at::isfinite(t).all().item<bool>()) return false;
  }
  return true;
}

}  // namespace

ParityReport run_parity(const comm::ProcessGroupPtr& world, const ParityModel& model, const ParityConfig& c) {
  const int W = world->size();
  const int r = world->rank();
  EXPECT_EQ(c.global_batch % (W * c.grad_accum), 0) << "global batch must split evenly";
  const int64_t B = c.global_batch / (W * c.grad_accum);
  const MixedPrecision& mp = c.fsdp.mixed_precision;

  optim::AdamWOptions ao = c.adamw_extra;
  ao.lr = c.lr;
  ao.weight_decay = c.weight_decay;

  const optim::ParamRule rule = c.param_rule ? c.param_rule : optim::decay_everything();
  const auto freeze = [&](nn::UnitBase& m) {
    if (c.freeze.empty()) return;
    const std::regex re(c.freeze);
    for (auto& p : m.named_parameters(true)) {
      if (std::regex_search(p.key(), re)) p.value().set_requires_grad(false);
    }
  };

  // --- sharded
  std::shared_ptr<nn::UnitBase> root = model.build(c.build_on_meta, c.seed);
  freeze(*root);
  FsdpOptions fo = c.fsdp;
  fo.init_rule = model.init_rule;
  fo.seed = c.seed;
  auto sharded = fully_shard(root, world, fo);
  optim::AdamW opt(ao);
  opt.add_shards(sharded->shards(), sharded->units(), rule);
  optim::GradScalerOptions gso;
  gso.init_scale = c.init_scale;
  gso.backoff_factor = c.backoff;
  gso.growth_interval = 4;
  optim::ShardedGradScaler scaler(gso, world);

  // --- reference: fp32-initialized masters, a compute copy in the param dtype
  std::shared_ptr<nn::UnitBase> ref = model.build(false, c.seed);
  // On the sharded run's device: the same kernels on both sides, so what is
  // compared is the sharding alone. (A CPU reference for a CUDA run drifted
  // apart from step 6 in fp32 and from step 2 in bf16 on an H200: AdamW's first
  // steps move every element by about lr whatever the size of its gradient, so
  // another device's rounding of a near-zero gradient flips the update.)
  if (c.fsdp.device != ref->parameters().front().device()) ref->to(c.fsdp.device);
  freeze(*ref);
  std::vector<std::string> names;
  std::vector<at::Tensor> compute;
  std::map<std::string, at::Tensor> masters;
  std::vector<at::Tensor> master_list;
  const bool cast_compute = mp.param_dtype != at::kFloat;
  for (auto& p : ref->named_parameters(true)) {
    names.push_back(p.key());
    compute.push_back(p.value());
    // fp32 throughout: the master is the parameter itself.
    at::Tensor m = cast_compute || mp.master_dtype != at::kFloat ? p.value().detach().to(mp.master_dtype).clone()
                                                                   : p.value().detach();
    masters[p.key()] = m;
    master_list.push_back(m);
  }
  if (cast_compute) {
    at::NoGradGuard ng;
    for (auto& t : compute) t.set_data(t.to(mp.param_dtype));
    ref->set_hooks(std::make_shared<CastInputs>(mp.param_dtype));
  }
  optim::AdamW ref_opt(ao);
  std::vector<at::Tensor> master_grads(master_list.size());
  for (size_t i = 0; i < master_list.size(); ++i) {
    if (!compute[i].requires_grad()) continue;  // frozen: no optimizer state
    ref_opt.add(names[i], master_list[i], [&master_grads, i] { return master_grads[i]; },
                {{0, master_list[i].numel(), rule(names[i], master_list[i].sizes().vec())}});
  }
  double ref_scale = c.init_scale;
  int64_t ref_tracker = 0;

  ParityReport rep;
  for (int64_t s = 0; s < c.steps; ++s) {
    // ---- sharded step
    sharded->zero_grad();
    double local = 0;
    for (int64_t a = 0; a < c.grad_accum; ++a) {
      sharded->set_requires_gradient_sync(a == c.grad_accum - 1);
      at::Tensor loss = model.loss(*root, s, (a * W + r) * B, B).to(at::kFloat) / static_cast<double>(c.grad_accum);
      (c.loss_scaling ? scaler.scale(loss) : loss).backward();
      local += loss.item<double>();
    }
    // On the group's device: an NCCL group reduces device tensors only.
    at::Tensor lt = at::full({1}, local, at::TensorOptions().dtype(at::kDouble).device(world->device()));
    world->all_reduce(lt, comm::ReduceOp::kAvg)->wait();
    const double loss_sharded = lt.item<double>();
    bool found_inf = false;
    if (c.loss_scaling) found_inf = scaler.unscale(sharded->shards());
    if (!found_inf) {
      if (c.clip > 0) sharded->clip_grad_norm(c.clip);
      opt.step();
    }
    if (c.loss_scaling) scaler.update(found_inf);

    // ---- reference step, same arithmetic order and precision policy
    {
      at::NoGradGuard ng;
      for (size_t i = 0; i < compute.size(); ++i) {
        if (cast_compute) compute[i].copy_(master_list[i]);
      }
    }
    std::vector<at::Tensor> sum(compute.size());
    double ref_loss = 0;
    // Micro-batches accumulate in the reduction dtype when it is wider than the
    // compute dtype (the engine's Note [Accumulating without synchronization]),
    // else in the parameters' .grad as autograd adds them.
    const bool accumulate_wider = c10::elementSize(mp.reduce_dtype) > c10::elementSize(mp.param_dtype);
    for (int rr = 0; rr < W; ++rr) {
      for (auto& p : compute) p.mutable_grad().reset();
      std::vector<at::Tensor> acc(compute.size());
      double l_rr = 0;
      for (int64_t a = 0; a < c.grad_accum; ++a) {
        at::Tensor loss = model.loss(*ref, s, (a * W + rr) * B, B).to(at::kFloat) / static_cast<double>(c.grad_accum);
        (c.loss_scaling ? loss * ref_scale : loss).backward();
        l_rr += loss.item<double>();
        if (!accumulate_wider) continue;
        for (size_t i = 0; i < compute.size(); ++i) {
          at::Tensor g = compute[i].grad().defined() ? compute[i].grad() : at::zeros_like(compute[i]);
          acc[i] = a == 0 ? g.to(mp.reduce_dtype) : acc[i] + g;
          compute[i].mutable_grad().reset();
        }
      }
      ref_loss += l_rr;
      for (size_t i = 0; i < compute.size(); ++i) {
        at::Tensor g = accumulate_wider ? acc[i]
                       : compute[i].grad().defined() ? compute[i].grad() : at::zeros_like(compute[i]);
        // Rank-order sum in fp32 (the process groups accumulate half types in fp32).
        at::Tensor gr = g.to(mp.reduce_dtype).to(at::kFloat);
        sum[i] = rr == 0 ? gr.clone() : sum[i] + gr;
      }
    }
    ref_loss /= W;
    for (size_t i = 0; i < compute.size(); ++i) {
      master_grads[i] = (sum[i] / static_cast<double>(W)).to(mp.reduce_dtype).to(mp.master_dtype);
    }
    bool ref_inf = false;
    if (c.loss_scaling) {
      for (auto& g : master_grads) g.mul_(1.0 / ref_scale);
      ref_inf = !all_finite(master_grads);
      EXPECT_EQ(ref_inf, found_inf) << "step " << s << ": the sharded run and the reference disagree on inf/nan";
    }
    if (!ref_inf) {
      if (c.clip > 0) optim::clip_grad_norm(master_grads, c.clip);
      ref_opt.step();
    }
    if (c.loss_scaling) {
      if (ref_inf) {
        ref_scale *= c.backoff;
        ref_tracker = 0;
        ++rep.skipped_steps;
      } else if (++ref_tracker >= 4) {
        ref_scale *= 2.0;
        ref_tracker = 0;
      }
    }

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

  if (c.expect_skipped_steps) EXPECT_GT(rep.skipped_steps, 0) << "no step was skipped";

  // Every local shard against the matching slice of the reference masters.
  const auto& units = sharded->units();
  const auto shards = sharded->shards();
  for (size_t u = 0; u < units.size(); ++u) {
    at::Tensor want = reference_flat(masters, units[u]).narrow(0, units[u].shard_offset, units[u].shard_numel);
    at::Tensor got = shards[u].param.to(at::kFloat).cpu();
    // A frozen shard holds the reference's masters rounded once to the param
    // dtype (Note [Frozen shards in the param dtype]).
    if (!units[u].trainable) want = want.to(shards[u].param.scalar_type()).to(at::kFloat);
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
            << " param=" << mp.param_dtype << " reduce=" << mp.reduce_dtype << " master=" << mp.master_dtype
            << (fo.checkpoint_all_units || !fo.checkpoint_types.empty() ? " +AC" : "")
            << (fo.cpu_offload ? " +offload" : "") << " prefetch=" << to_string(fo.backward_prefetch)
            << (fo.forward_prefetch ? "+fwd" : "") << " limit=" << fo.limit_all_gathers
            << ": worst loss rel diff " << rep.worst_loss_rel << ", worst param abs diff " << rep.worst_param_abs
            << ", loss " << rep.losses.front() << " -> " << rep.losses.back() << ", skipped " << rep.skipped_steps
            << "\n";
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
    // On the device and in the dtype the model computes in (a sharded root's
    // parameters keep both while resharded; its units cast floating inputs
    // to the same dtype): the same samples for a CUDA run, and for a plain
    // model in a low precision.
    const at::Tensor p = net.parameters().front();
    return net.forward(x.to(p.device(), p.scalar_type()), y.to(p.device(), p.scalar_type()));
  };
  return m;
}

at::Tensor counting_sequences(int64_t vocab, int64_t length, int64_t step, int64_t first, int64_t count) {
  at::Tensor seq = at::empty({count, length}, at::kLong);
  const at::Tensor offsets = at::arange(length, at::TensorOptions().dtype(at::kLong));
  for (int64_t k = 0; k < count; ++k) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * step + first + k));
    const at::Tensor start = at::randint(vocab, {1}, gen, at::TensorOptions().dtype(at::kLong));
    seq[k].copy_(at::remainder(start + offsets, vocab));
  }
  return seq;
}

void expect_learned(const ParityModel& model, const ParityConfig& config, const ParityReport& report) {
  EXPECT_EQ(static_cast<int64_t>(report.losses.size()), config.steps);
  if (report.losses.empty()) return;
  const double untrained = [&] {
    at::NoGradGuard no_grad;
    auto fresh = model.build(/*meta=*/false, config.seed);
    if (config.fsdp.mixed_precision.param_dtype != at::kFloat) fresh->to(config.fsdp.mixed_precision.param_dtype);
    return model.loss(*fresh, config.steps - 1, 0, config.global_batch).to(at::kFloat).item<double>();
  }();
  EXPECT_LT(report.losses.back(), 0.99 * untrained)
      << model.name << ": the last step's loss " << report.losses.back() << " is not 1% below the untrained model's "
      << untrained << " on the same batch";
  std::cout << "[" << model.name << "] untrained loss on the last batch " << untrained << ", trained "
            << report.losses.back() << "\n";
}

}  // namespace fsdp::testing

// The step schedule is defined once (src/fsdp/schedule.h): the engine executes
// it, the memory plan and the time model interpret step_events(). Here the
// real engine runs with tracing on, and every event it executed (gathers,
// prefetches, waits, reshards, reductions, finishes) and every compute marker
// (forward calls, recomputations, pre- and post-backward) must come in exactly
// the order step_events() predicts from the model's call order and options —
// for every strategy x prefetch x precision x checkpointing combination, on a
// plain model and on a decoder's layout with a tied input/output unit, in
// synchronized, accumulating (no_sync) and evaluation steps, at 4 ranks
// (HYBRID 2 x 2). The memory contract (test_memory_contract.cpp) holds the
// bytes of the same schedule to the engine's ledger.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "fsdp/common/trace.h"
#include "fsdp/fsdp.h"
#include "fsdp/state.h"
#include "option_matrix.h"
#include "parity.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using testing::borrow;
namespace {

// A named configuration: options, the model's shape, and setters applied
// after sharding (FSDP2's runtime settings).
struct Case {
  std::string name;
  FsdpOptions options;
  std::function<std::shared_ptr<nn::UnitBase>()> model;
  testing::ToyConfig shape;
  std::function<void(ShardedModel&)> setters;
};

std::vector<Case> cases() {
  testing::ToyConfig plain;  // root with blocks (no CallOrder)
  plain.d_in = 6;
  plain.d = 8;
  plain.f = 12;
  plain.d_out = 5;
  plain.blocks = 3;
  testing::ToyConfig tied = plain;  // input unit called again as the head, root scale between
  tied.d_out = tied.d_in;
  tied.io_units = true;
  tied.tied = true;
  const std::pair<const char*, testing::ToyConfig> shapes[] = {{"plain", plain}, {"tied io", tied}};
  testing::OptionAxes axes;  // fp32 and bf16, every strategy, checkpointing off and on
  axes.forward_prefetch_limit = 1;  // forward prefetch waits for the previous gather
  std::vector<Case> out;
  for (const auto& [shape_name, shape] : shapes) {
    for (const auto& [combination, options] : testing::option_matrix(axes)) {
      FsdpOptions o = options;
      o.init_rule = testing::toy_init_rule;
      o.seed = 5;
      const testing::ToyConfig c = shape;
      std::function<std::shared_ptr<nn::UnitBase>()> make =
          c.io_units ? std::function<std::shared_ptr<nn::UnitBase>()>([c] { return testing::make_toy_io(c, true, 5).ptr(); })
                     : [c] { return testing::make_toy(c, true, 5).ptr(); };
      out.push_back({std::string(shape_name) + ", " + combination, o, make, c, nullptr});
    }
  }
  return out;
}

// FSDP2's per-unit options and runtime settings (Note [Per-unit options]),
// each with every prefetch setting, on both shapes.
std::vector<Case> option_cases() {
  std::vector<Case> out;
  for (const Case& base : cases()) {
    if (base.options.strategy != ShardingStrategy::kFullShard && base.options.strategy != ShardingStrategy::kHybridShard) {
      continue;
    }
    if (base.options.checkpoint_all_units || base.options.mixed_precision.param_dtype != at::kFloat) continue;
    const bool untied_io = base.shape.io_units && !base.shape.tied;
    const std::string b1 = "blocks.1", b0 = "blocks.0", b2 = "blocks.2";
    if (base.options.strategy == ShardingStrategy::kHybridShard) {
      Case c = base;  // FSDP1's _HYBRID_SHARD_ZERO2
      c.name += ", reshard_after_forward false (HYBRID ZeRO-2)";
      c.options.reshard_after_forward = ReshardAfterForward(false);
      out.push_back(c);
      continue;
    }
    Case hpz = base;  // every unit keeps a shard over pairs of ranks (hpZ)
    hpz.name += ", reshard_after_forward 2";
    hpz.options.reshard_after_forward = ReshardAfterForward::to_group(2);
    out.push_back(hpz);
    Case mixed = base;  // per unit: kept, hpZ, bf16 and offloaded, the root resharded
    mixed.name += ", per-unit reshard (keep, 2), bf16 and offload, root resharded";
    UnitOverride keep{{b0}, {}, {}};
    keep.options.reshard_after_forward = ReshardAfterForward(false);
    UnitOverride pairs{{b1}, {}, {}};
    pairs.options.reshard_after_forward = ReshardAfterForward::to_group(2);
    pairs.options.mixed_precision = MixedPrecision::preset("bf16");
    pairs.options.mixed_precision->buffer_dtype = at::kFloat;
    UnitOverride root{{""}, {}, {}};
    root.options.reshard_after_forward = ReshardAfterForward(true);
    UnitOverride offload{{b2}, {}, {}};
    offload.options.cpu_offload = true;
    mixed.options.unit_overrides = {keep, pairs, root, offload};
    out.push_back(mixed);
    Case lists = base;  // explicit prefetch lists (FSDP2's set_modules_to_*_prefetch)
    lists.name += ", explicit prefetch lists";
    UnitOverride fwd{{b0}, {}, {}};
    fwd.options.forward_prefetch = std::vector<std::string>{b1, b2};
    UnitOverride bwd{{b2}, {}, {}};
    bwd.options.backward_prefetch = std::vector<std::string>{b1, b0};
    lists.options.unit_overrides = {fwd, bwd};
    out.push_back(lists);
    Case runtime = base;  // the setters, after sharding
    runtime.name += ", runtime setters";
    runtime.setters = [untied_io, b0, b1, b2](ShardedModel& m) {
      m.set_reshard_after_forward(false, b1, /*recurse=*/false);
      m.set_reshard_after_backward(false, b2, /*recurse=*/false);  // kept into the next forward
      m.set_modules_to_backward_prefetch(b1, {b0});
      m.set_modules_to_forward_prefetch("", {b0, b1});
      if (untied_io) m.set_unshard_in_backward(false, "in");  // x @ W^T, x without grad: W is not needed
    };
    out.push_back(runtime);
    if (base.shape.io_units) {  // the same on the untied decoder layout, with set_unshard_in_backward
      Case untied = runtime;
      untied.shape.tied = false;
      untied.name = "untied io" + untied.name.substr(std::string("tied io").size());
      const testing::ToyConfig c = untied.shape;
      untied.model = [c] { return testing::make_toy_io(c, true, 5).ptr(); };
      untied.setters = [runtime, b0](ShardedModel& m) {
        runtime.setters(m);
        m.set_unshard_in_backward(false, "in");
      };
      out.push_back(untied);
    }
  }
  return out;
}

// The events the schedule predicts for `root` as `sharded` holds it now (its
// units, their current policies, its options), as text.
std::vector<std::string> predicted(ShardedModel& sharded, const std::shared_ptr<nn::UnitBase>& root,
                                   detail::StepPhase phase, std::optional<detail::StepPhase> after = std::nullopt) {
  detail::ShardedModelImpl& impl = detail::impl_of(sharded);
  const detail::StepScheduler& s = impl.scheduler();
  std::vector<detail::ScheduleUnit> units;
  std::vector<detail::UnitPolicy> policies;
  for (int u = 0; u < s.size(); ++u) {
    units.push_back(s.unit(u));
    policies.push_back(s.policy(u));
  }
  const std::vector<detail::PlannedUnit> planned =
      detail::plan_units(root, sharded.options(), sharded.shard_group()->size());
  const std::vector<detail::Event> events =
      detail::step_events(units, policies, detail::call_sequence(root, planned), s.options(), phase, nullptr, after);
  std::vector<std::string> out;
  for (const detail::Event& e : events) out.push_back(detail::to_string(e, impl.unit_names()));
  return out;
}

std::vector<std::string> traced(const std::vector<trace::Event>& events) {
  std::vector<std::string> out;
  for (const trace::Event& e : events) {
    if (e.cat == "schedule") out.push_back(e.detail);
  }
  return out;
}

// The first difference of two event lists, with context, or "".
std::string difference(const std::vector<std::string>& want, const std::vector<std::string>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  if (i == want.size() && i == got.size()) return "";
  std::ostringstream os;
  os << "first difference at event " << i << " of " << want.size() << " predicted / " << got.size() << " run:\n";
  for (size_t k = i >= 3 ? i - 3 : 0; k < std::max(want.size(), got.size()) && k < i + 4; ++k) {
    os << "  " << k << ": predicted '" << (k < want.size() ? want[k] : "-") << "', run '"
       << (k < got.size() ? got[k] : "-") << "'\n";
  }
  return os.str();
}

// Steps of `model` sharded with `c.options`: the traced events of a
// synchronized step, an accumulating one, a synchronized one after it, and an
// evaluation forward, each against the prediction. Returns the failures.
template <class Model>
std::string check_case(comm::ProcessGroup& pg, Model model, const Case& c) {
  auto sharded = fully_shard(model.ptr(), borrow(pg), c.options);
  if (c.setters) c.setters(*sharded);
  const std::vector<std::string> sync = predicted(*sharded, model.ptr(), detail::StepPhase::kSynchronized);
  // As the steps below come: accumulating after synchronized, synchronized
  // after accumulating, evaluation after synchronized.
  const std::vector<std::string> accum =
      predicted(*sharded, model.ptr(), detail::StepPhase::kAccumulating, detail::StepPhase::kSynchronized);
  const std::vector<std::string> sync_after_accum =
      predicted(*sharded, model.ptr(), detail::StepPhase::kSynchronized, detail::StepPhase::kAccumulating);
  const std::vector<std::string> eval =
      predicted(*sharded, model.ptr(), detail::StepPhase::kEvaluation, detail::StepPhase::kSynchronized);
  std::ostringstream failures;
  const auto step = [&](bool sync_grads) {
    sharded->set_requires_gradient_sync(sync_grads);
    at::Tensor x = at::randn({3, c.shape.d_in});
    at::Tensor y = at::randn({3, c.shape.d_out});
    model->forward(x, y).backward();
  };
  const auto traced_step = [&](const char* what, bool sync_grads, const std::vector<std::string>& want) {
    trace::start();
    step(sync_grads);
    const std::string d = difference(want, traced(trace::stop()));
    if (!d.empty()) failures << c.name << ", " << what << ": " << d;
  };
  step(true);  // the first step: no forward order known yet to forward prefetch
  traced_step("synchronized step", true, sync);
  traced_step("accumulating step", false, accum);
  traced_step("synchronized step after accumulation", true, sync_after_accum);
  sharded->zero_grad();
  {
    at::NoGradGuard no_grad;
    trace::start();
    model->forward(at::randn({3, c.shape.d_in}), at::randn({3, c.shape.d_out}));
    const std::string d = difference(eval, traced(trace::stop()));
    if (!d.empty()) failures << c.name << ", evaluation forward: " << d;
  }
  return failures.str();
}

TEST(Schedule, TheEngineRunsTheStepSchedulePredictsForEveryCombination) {
  const std::string dir = testing::temp_dir("schedule");
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    std::string failures;
    int checked = 0;
    for (const Case& c : cases()) {
      failures += c.shape.io_units ? check_case(pg, testing::make_toy_io(c.shape, true, 5), c)
                                   : check_case(pg, testing::make_toy(c.shape, true, 5), c);
      ++checked;
    }
    EXPECT_EQ(checked, 2 * 4 * 2 * 4 * 2);
    EXPECT_TRUE(failures.empty()) << "rank " << pg.rank() << ":\n" << failures.substr(0, 6000);
  });
}

// The same for FSDP2's per-unit options and runtime settings: integer
// reshard_after_forward (hpZ), HYBRID with reshard_after_forward false
// (FSDP1's _HYBRID_SHARD_ZERO2), per-unit reshard / precision / offload and a
// resharded root, explicit prefetch lists, and the setters
// (set_reshard_after_forward / _backward, set_unshard_in_backward,
// set_modules_to_*_prefetch) — the prediction read from the engine's live
// policies.
TEST(Schedule, PerUnitOptionsAndRuntimeSettingsRunAsPredicted) {
  testing::run_distributed(4, [&](comm::ProcessGroup& pg) {
    std::string failures;
    int checked = 0;
    for (const Case& c : option_cases()) {
      failures += c.shape.io_units ? check_case(pg, testing::make_toy_io(c.shape, true, 5), c)
                                   : check_case(pg, testing::make_toy(c.shape, true, 5), c);
      ++checked;
    }
    EXPECT_EQ(checked, 8 * 4 + 4 + 8);  // FULL_SHARD bases x 4 (+ untied io), HYBRID bases
    EXPECT_TRUE(failures.empty()) << "rank " << pg.rank() << ":\n" << failures.substr(0, 6000);
  });
}

// The schedule itself, without the engine: what FULL_SHARD with BACKWARD_PRE
// does, written out for a root and two blocks, so a reader sees the contract.
TEST(Schedule, FullShardWithBackwardPrefetchWrittenOut) {
  std::vector<detail::ScheduleUnit> units(3);
  units[0].is_root = true;
  for (auto& u : units) u.trains = true;
  std::vector<detail::UnitPolicy> policy(3);
  policy[0].reshard_after_forward = false;  // the root
  detail::ScheduleOptions o;
  const std::vector<detail::Event> events =
      detail::step_events(units, policy, {0, 1, 2}, o, detail::StepPhase::kSynchronized);
  std::vector<std::string> got;
  for (const auto& e : events) got.push_back(detail::to_string(e, {"", "a", "b"}));
  const std::vector<std::string> want = {
      "unshard <root>", "wait <root>", "forward <root>",
      "unshard a", "wait a", "forward a", "post_forward a", "reshard a",
      "unshard b", "wait b", "forward b", "post_forward b", "reshard b",
      "post_forward <root>",
      "pre_backward <root>",
      "unshard b", "prefetch a", "wait b", "pre_backward b", "post_backward b", "reshard b", "reduce b",
      "wait a", "pre_backward a", "post_backward a", "reshard a", "reduce a",
      "post_backward <root>", "reshard <root>", "reduce <root>", "finish_reduce b",  // three in flight
      "finish_reduce a", "finish_reduce <root>"};  // the end of backward
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace fsdp

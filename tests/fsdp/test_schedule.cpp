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
#include "parity.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using testing::borrow;
namespace {

struct Prefetch {
  const char* name;
  BackwardPrefetch backward;
  bool forward;
  int limit;
};

const Prefetch kPrefetches[] = {{"none", BackwardPrefetch::kNone, false, 2},
                                {"pre", BackwardPrefetch::kPre, false, 2},
                                {"post", BackwardPrefetch::kPost, false, 2},
                                {"pre+forward, limit 1", BackwardPrefetch::kPre, true, 1}};

// A named configuration: options and how to build the model (on meta).
struct Case {
  std::string name;
  FsdpOptions options;
  std::function<std::shared_ptr<nn::UnitBase>()> model;
  testing::ToyConfig shape;
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
  std::vector<Case> out;
  for (const auto& [shape_name, shape] : shapes) {
    for (ShardingStrategy s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                               ShardingStrategy::kHybridShard}) {
      for (const char* precision : {"fp32", "bf16"}) {
        for (const Prefetch& pf : kPrefetches) {
          for (bool ckpt : {false, true}) {
            FsdpOptions o;
            o.strategy = s;
            o.hybrid_shard_size = 2;
            o.mixed_precision = MixedPrecision::preset(precision);
            o.backward_prefetch = pf.backward;
            o.forward_prefetch = pf.forward;
            o.limit_all_gathers = pf.limit;
            o.checkpoint_all_units = ckpt;
            o.init_rule = testing::toy_init_rule;
            o.seed = 5;
            const testing::ToyConfig c = shape;
            std::function<std::shared_ptr<nn::UnitBase>()> make =
                c.io_units ? std::function<std::shared_ptr<nn::UnitBase>()>([c] { return testing::make_toy_io(c, true, 5).ptr(); })
                           : [c] { return testing::make_toy(c, true, 5).ptr(); };
            out.push_back({std::string(shape_name) + ", " + to_string(s) + ", " + precision + ", prefetch " + pf.name +
                               (ckpt ? ", checkpointing" : ""),
                           o, make, c});
          }
        }
      }
    }
  }
  return out;
}

// The events the schedule predicts for `root` sharded with `o` at this rank, as text.
std::vector<std::string> predicted(const std::shared_ptr<nn::UnitBase>& root, const FsdpOptions& o, int world,
                                   detail::StepPhase phase) {
  const int shard_size = detail::shard_group_size(o, world);
  const std::vector<detail::PlannedUnit> planned = detail::plan_units(root, o, shard_size);
  std::vector<std::string> names;
  for (const auto& pu : planned) names.push_back(pu.name);
  const std::vector<detail::Event> events = detail::step_events(
      detail::schedule_units(planned, o, shard_size, world / shard_size), detail::schedule_policies(planned),
      detail::call_sequence(root, planned), detail::schedule_options(o), phase);
  std::vector<std::string> out;
  for (const detail::Event& e : events) out.push_back(detail::to_string(e, names));
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
  const std::vector<std::string> sync = predicted(model.ptr(), c.options, pg.size(), detail::StepPhase::kSynchronized);
  const std::vector<std::string> accum = predicted(model.ptr(), c.options, pg.size(), detail::StepPhase::kAccumulating);
  const std::vector<std::string> eval = predicted(model.ptr(), c.options, pg.size(), detail::StepPhase::kEvaluation);
  auto sharded = fully_shard(model.ptr(), borrow(pg), c.options);
  std::ostringstream failures;
  const auto step = [&](bool sync_grads) {
    sharded->set_requires_gradient_sync(sync_grads);
    at::Tensor x = at::randn({3, c.shape.d_in});
    at::Tensor y = at::randn({3, c.shape.io_units ? c.shape.d_in : c.shape.d_out});
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
  traced_step("synchronized step after accumulation", true, sync);
  sharded->zero_grad();
  {
    at::NoGradGuard no_grad;
    trace::start();
    model->forward(at::randn({3, c.shape.d_in}), at::randn({3, c.shape.io_units ? c.shape.d_in : c.shape.d_out}));
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

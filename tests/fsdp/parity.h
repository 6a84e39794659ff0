// Parity harness: trains a model with fully_shard on the current process
// group and, in the same process, an unsharded reference built from the same
// seed on the same global batch; compares losses every step and every local
// shard with the matching slice of the reference parameters.
//
// The reference reproduces the sharded run's arithmetic order: it computes
// each rank's micro-batches separately (accumulating over micro-steps), then
// sums the ranks' gradients in rank order and divides by the world size —
// what the reduce-scatter does. With fp32 this gives bit-identical results
// for FULL_SHARD at world size <= 2 (sums of two commute exactly).
//
// Under a mixed-precision policy the reference follows the same policy: master
// weights in the master dtype, a compute copy in the param dtype refreshed
// from them every step, root inputs cast to the param dtype, gradients
// accumulated in the param dtype, summed over ranks in the reduce dtype (fp32
// accumulation, as the process groups do), divided by the world size, and the
// optimizer on the masters. With a loss scale, both sides scale, unscale, and
// skip steps with inf/nan gradients.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/unit.h"
#include "fsdp/optim/adamw.h"

namespace fsdp::testing {

// run_distributed's process group as the ProcessGroupPtr fully_shard and
// run_parity take, without ownership (the group outlives the call).
inline comm::ProcessGroupPtr borrow(comm::ProcessGroup& pg) {
  return comm::ProcessGroupPtr(&pg, [](comm::ProcessGroup*) {});
}

struct ParityModel {
  std::string name;
  // A fresh model: on the meta device, or materialized with init_rule/seed.
  std::function<std::shared_ptr<nn::UnitBase>(bool meta, uint64_t seed)> build;
  nn::InitRuleFn init_rule;
  // Mean loss of `root` on samples [first, first + count) of step's global batch.
  std::function<at::Tensor(nn::UnitBase& root, int64_t step, int64_t first, int64_t count)> loss;
};

struct ParityConfig {
  int64_t steps = 20;
  int64_t global_batch = 8;  // samples per step, whatever the world size
  int64_t grad_accum = 1;
  double lr = 1e-2;
  double weight_decay = 0.01;
  double clip = 0.0;         // 0: no clipping
  bool build_on_meta = true; // sharded side materializes shards from meta
  uint64_t seed = 1234;
  FsdpOptions fsdp;
  optim::AdamWOptions adamw_extra;  // state dtype / Kahan for pure-bf16 runs (lr, weight decay come from above)
  bool loss_scaling = false;        // fp16: dynamic loss scale on both sides
  double init_scale = 1024.0;
  double backoff = 0.5;
  bool expect_skipped_steps = false;  // the run must skip at least one step
  // Parameters whose name this regex finds are frozen (requires_grad false)
  // on both sides before sharding; "": none.
  std::string freeze;
  // Parameter groups on both sides; empty: every parameter decayed.
  optim::ParamRule param_rule;
  double loss_rtol = 1e-5;
  double param_atol = 1e-5;
  bool expect_bitwise = false;  // losses and shards identical to the bit
};

struct ParityReport {
  std::vector<double> losses;      // sharded run, mean over the global batch
  std::vector<double> ref_losses;  // reference
  double worst_loss_rel = 0;
  double worst_param_abs = 0;
  int64_t skipped_steps = 0;  // loss scaling: steps skipped for inf/nan (both sides alike)
};

// Collective over `world`; records gtest failures with the worst differences.
ParityReport run_parity(const comm::ProcessGroupPtr& world, const ParityModel& model, const ParityConfig& config);

// The toy model of toy_models.h as a ParityModel.
ParityModel toy_parity_model(bool with_unused, int64_t d = 7, int64_t f = 13);

// Samples [first, first + count) of step's global batch for a language model:
// (count, length) token ids counting up from a random start, t -> t + 1 mod
// vocab. Each sample is a pure function of (step, sample index), so any split
// of the batch over ranks sees the same samples; the rule is learnable in a
// few steps, where random tokens leave only noise to fit.
at::Tensor counting_sequences(int64_t vocab, int64_t length, int64_t step, int64_t first, int64_t count);

// Fails the test unless the trained run's last loss is at least 1% below what
// the untrained model (a fresh eager build from config.seed, in the param
// dtype) scores on the same last-step batch: each step draws a new batch, so a
// loss that merely changed proves nothing. Prints both losses.
void expect_learned(const ParityModel& model, const ParityConfig& config, const ParityReport& report);

}  // namespace fsdp::testing

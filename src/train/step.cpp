// One training step and its record, and evaluation (Trainer::Impl, trainer_impl.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "fsdp/common/device.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/trace.h"
#include "fsdp/data/sampler.h"
#include "fsdp/models/lora.h"
#include "train/trainer_impl.h"

namespace fsdp::train {
namespace {

// Evaluation mode (no LoRA dropout) for the scope of one evaluation.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Module& module) : m_(module) { m_.eval(); }
  ~EvalMode() { m_.train(); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Module& m_;
};

}  // namespace

// --- evaluation: exact mean over every target of the windows (sampler.h, EvalWindows)
EvalRecord Trainer::Impl::evaluate(int64_t max_windows) {
  require_legal(phase_, TrainerPhase::kEvaluating, "evaluate");
  FSDP_CHECK(data_->has_validation(), "Trainer::evaluate needs eval.val_data (EvalOptions::val_data PATH)");
  PhaseScope scope(phase_, TrainerPhase::kEvaluating, "evaluate");
  const int64_t completed = step_;
  trace::Span span("eval", "eval", -1, {}, completed);
  const auto t0 = Clock::now();
  const std::unique_ptr<data::EvalBatches> windows = data_->eval_batches(max_windows);
  at::NoGradGuard no_grad;
  EvalMode eval_mode(*model_.model);
  double sum = 0.0;
  const int64_t batches = windows->num_batches(o_.step.batch_size);
  for (int64_t b = 0; b < batches; ++b) {
    const data::Batch batch = windows->batch(b, o_.step.batch_size);
    sum += model_.loss(batch.inputs.to(device_), batch.targets.to(device_), models::LossReduction::kSum)
               .item<double>();
  }
  at::Tensor t = at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
  scalars_->all_reduce(t, comm::ReduceOp::kSum)->wait();
  EvalRecord rec;
  rec.step = completed;
  rec.targets = windows->total_targets();
  rec.loss = t.item<double>() / static_cast<double>(rec.targets);
  if (!std::isfinite(rec.loss)) {  // the same value on every rank: all fail together
    const char* value = std::isnan(rec.loss) ? "NaN" : rec.loss > 0 ? "inf" : "-inf";
    FSDP_FAIL("the evaluation loss is ", value, " at step ", completed,
              ": the weights or the EvalOptions::val_data produce NaN/inf",
              eval_only_ ? "; check the weights being evaluated"
                         : "; lower LrSchedule::lr or raise LrSchedule::warmup_steps, or clip harder with "
                           "StepOptions::clip_grad");
  }
  rec.seconds = seconds_since(t0);
  say_(fmt::format("Eval Loss: {:.5f} (step {}, {} tokens, {:.2f} s)", rec.loss, completed, rec.targets,
                   rec.seconds));
  reporter_.publish(MetricScope::kEval, nullptr, &rec);
  summary_.evals.push_back(rec);
  sharded_->take_step_counters();  // evaluation's all-gathers are not a step's
  return rec;
}


// Restored -> Training: the data loader and the step counters start here,
// not in restore(): an --eval-only run reads no training batches, and a
// resume's loading and the first evaluation are not a step.
void Trainer::Impl::begin_training() {
  transition_to(phase_, TrainerPhase::kTraining, "train_step");
  data_->start(step_);
  sharded_->take_step_counters();
  sharded_->reset_unsharded_peak();
  // The device's peak from the first step on, as the benchmark's peers count
  // it (the CPU's figure, the resident set, stays the process's peak).
  if (device_.is_cuda()) reset_peak_memory(device_);
  interval_start_ = Clock::now();
  interval_steps_ = 0;
}

// Note [Loss over rows]
// A step's loss is the mean over every target of its global batch, whatever
// the world size W and gradient accumulation A, so that runs at different
// world sizes train alike (the engine averages the ranks' gradients). Where
// every row has the same number of targets (windows of a token stream) each
// micro-batch's own mean, divided by A, is that mean's share: the loss the
// trainer has always computed, bit for bit. Where rows differ (an
// encoder-decoder's pairs, padded to the decoder's width) a micro-batch's
// mean would weigh a short target more than a long one, so each micro-batch
// contributes its sum times W / N, N the step's targets over all ranks and
// micro-steps (BatchSampler::step_targets: every rank counts them from the
// global batch rule, no communication).

// Forward and backward of every micro-batch (gradient synchronization on the
// last only); returns this rank's share of the step's loss (Note [Loss over
// rows]) summed over them: a (1) float64 tensor on the device, not read
// here (no host synchronization inside the step; summed in float64 as the
// host sum it replaces, the same bits).
at::Tensor Trainer::Impl::forward_backward() {
  at::Tensor local;
  const bool uniform = data_->sampler().rows().uniform_targets();
  double per_target = 0.0;  // W / N (rows that differ)
  if (!uniform) {
    const int64_t n = data_->sampler().step_targets(step_);
    FSDP_CHECK(n > 0, "step ", step_, " holds no target to learn (every target ignored)");
    per_target = static_cast<double>(W_) / static_cast<double>(n);
  }
  for (int64_t a = 0; a < o_.step.grad_accum; ++a) {
    data::Batch batch;
    {
      trace::Span span("data", "data");
      batch = data_->next();
    }
    sharded_->set_requires_gradient_sync(a == o_.step.grad_accum - 1);
    if (o_.lora.dropout > 0) {
      // Masks keyed by (seed, step, micro-batch, rank): a recompute draws the same, a resumed run too.
      const auto micro = static_cast<uint64_t>((step_ * o_.step.grad_accum + a) * W_ + rank_);
      models::set_lora_dropout_key(*model_.model, splitmix64(o_.step.seed ^ splitmix64(micro)));
    }
    const auto to_device = [&](const at::Tensor& t) { return to_device_without_waiting(t, device_); };
    at::Tensor loss =
        uniform ? model_.loss(to_device(batch.inputs), to_device(batch.targets), models::LossReduction::kMean) /
                      static_cast<double>(o_.step.grad_accum)
                : model_.loss(to_device(batch.inputs), to_device(batch.targets), models::LossReduction::kSum) *
                      per_target;
    (scaler_ ? scaler_->scale(loss) : loss).backward();
    const at::Tensor l = loss.detach().to(at::kDouble).reshape({1});
    local = local.defined() ? local + l : l;
  }
  return local;
}

StepRecord Trainer::Impl::train_step() {
  require_legal(phase_, TrainerPhase::kTraining, "train_step");
  FSDP_CHECK(!eval_only_, "Trainer::train_step: Mode::kEvaluate evaluates and trains nothing");
  FSDP_CHECK(step_ < o_.step.max_steps, "Trainer::train_step: ", step_, " steps are done, step.max_steps is ",
             o_.step.max_steps, "; the schedule ends there");
  FailsTrainer fails(phase_);
  if (phase_ == TrainerPhase::kRestored) begin_training();
  const int64_t step = step_;
  const auto t0 = Clock::now();
  const int64_t step_begin_us = trace::enabled() ? trace::now_us() : -1;
  const double lr = sched_.at(step);
  opt_->set_lr(lr);
  sharded_->zero_grad();
  const at::Tensor local_t = forward_backward();
  const double loss_scale = scaler_ ? scaler_->scale_value() : 0.0;
  at::Tensor norm_t;
  bool skipped = false;
  {
    trace::Span span("optimizer", "optim");
    skipped = scaler_ && scaler_->unscale(sharded_->shards());
    if (!skipped && o_.step.clip_grad > 0 && o_.step.kernels == models::LayerKernels::kFused) {
      // Clipped inside the optimizer's kernel (Note [Clipping inside the fused step]).
      norm_t = sharded_->grad_norm_tensor();
      opt_->step(optim::clip_grad_scale(norm_t, o_.step.clip_grad));
    } else if (!skipped) {
      norm_t = o_.step.clip_grad > 0 ? sharded_->clip_grad_norm_tensor(o_.step.clip_grad)
                                     : sharded_->grad_norm_tensor();
      opt_->step();
    }
  }
  // The step's wait for the device: its loss and gradient norm, read once the
  // optimizer's kernels are queued (nothing inside the step waited). A NaN or
  // inf norm stops the run here, before anything is saved: the update it fed
  // lives only in this process's memory.
  const double local = local_t.item<double>();
  const double norm = norm_t.defined() ? norm_t.item<double>() : 0.0;
  if (!skipped) optim::check_finite_training("gradient norm", norm, step, lr, o_.param_groups);  // global: every rank stops
  if (skipped) {
    warn_(fmt::format("step {}: inf/nan gradients at loss scale {}: step skipped on every rank", step, loss_scale));
  }
  if (scaler_) scaler_->update(skipped);

  // One all-reduce for the loss (sum, then / W: the same bits as an average)
  // and the stop flag (any rank's request stops every rank after this step).
  stop_local_ = o_.stop_requested ? o_.stop_requested() : 0;
  at::Tensor lt = at::tensor({local, static_cast<double>(stop_local_)}, at::TensorOptions().dtype(at::kDouble));
  {
    trace::Span span("loss all_reduce wait", "comm");
    scalars_->all_reduce(lt, comm::ReduceOp::kSum)->wait();
  }
  const double loss_sum = lt[0].item<double>();
  const bool stop = lt[1].item<double>() > 0;
  StepRecord rec;
  rec.step = step;
  rec.loss = W_ > 1 ? loss_sum / static_cast<double>(W_) : loss_sum;
  rec.lr = lr;
  rec.grad_norm = norm;
  rec.loss_scale = loss_scale;
  rec.skipped = skipped;
  rec.skipped_steps = scaler_ ? scaler_->skipped_steps() : 0;
  synchronize(device_);  // the optimizer's kernels belong to this step's time
  rec.step_time_s = seconds_since(t0);
  trace::record("step", "step", step_begin_us, trace::now_us(), -1, {}, step);
  rec.comm = sharded_->take_step_counters();
  rec.peak_mem_bytes = peak_memory_bytes(device_);
  const UnshardedMemory unsharded = sharded_->unsharded_memory();
  rec.unsharded_peak_bytes = unsharded.peak;
  rec.unsharded_bound_bytes = unsharded_bound_;
  check_unsharded_contract(step, unsharded);
  optim::check_finite_training("loss", rec.loss, step, lr, o_.param_groups);
  ++interval_steps_;
  if ((step % o_.log.log_every == 0) || step == o_.step.max_steps - 1 || stop) log_step(rec);
  summary_.steps.push_back(rec);
  step_ = step + 1;
  summary_.end_step = step_;
  if (stop) transition_to(phase_, TrainerPhase::kStopping, "train_step");  // some rank asked to stop
  return rec;
}

// The plan's bound is a contract (tests/fsdp/test_memory_contract.cpp): say so when it fails.
void Trainer::Impl::check_unsharded_contract(int64_t step, const UnshardedMemory& unsharded) {
  if (unsharded.peak <= unsharded_bound_ || contract_broken_) return;
  contract_broken_ = true;
  warn_(fmt::format("step {}: the engine held {} of unsharded buffers at once ({} parameters, {} gradients, {} in "
                    "reductions, {} accumulated), more than the plan's bound {}; the run goes on, but memory "
                    "planning is wrong for this configuration — please report it with the run's effective "
                    "configuration (LogOptions::config_text)",
                    step, format_bytes(unsharded.peak), format_bytes(unsharded.at_peak.params),
                    format_bytes(unsharded.at_peak.grads), format_bytes(unsharded.at_peak.reductions),
                    format_bytes(unsharded.at_peak.accumulated), format_bytes(unsharded_bound_)));
}

// The step line and the metrics record of a logged step; fills in rec's rates
// over the steps since the previous logged one.
void Trainer::Impl::log_step(StepRecord& rec) {
  const int64_t step = rec.step;
  const double dt = seconds_since(interval_start_);
  seconds_per_step_ = dt / static_cast<double>(interval_steps_);
  rec.samples_per_s = static_cast<double>(data_->global_batch() * interval_steps_) / dt;
  rec.tokens_per_s = rec.samples_per_s * static_cast<double>(o_.data.seq_len);
  rec.mfu = device_peak_flops_ > 0
                ? rec.tokens_per_s / static_cast<double>(W_) * flops_per_token_ / device_peak_flops_
                : -1;
  checkpointer_->take_stalls(rec);  // the saves since the previous logged step
  // The familiar prefix first (scripts grep it), then what people watch.
  say_(fmt::format("Batch {} Loss: {:.5f}, Speed: {:.2f} samples/sec, lr: {:.6f} | step {}/{}, {:.0f} tokens/s{}, "
                   "grad norm {:.4g}{}, peak mem {}, unsharded {} (plan {}), ETA {}",
                   step, rec.loss, rec.samples_per_s, rec.lr, step + 1, o_.step.max_steps, rec.tokens_per_s,
                   rec.mfu >= 0 ? fmt::format(", MFU {:.1f}%", 100 * rec.mfu) : std::string(), rec.grad_norm,
                   scaler_ ? fmt::format(", loss scale {:g}{}", rec.loss_scale, rec.skipped ? " (skipped)" : "") : "",
                   rec.peak_mem_bytes >= 0 ? format_bytes(rec.peak_mem_bytes) : std::string("?"),
                   format_bytes(rec.unsharded_peak_bytes), format_bytes(unsharded_bound_),
                   duration_text(seconds_per_step_ * static_cast<double>(o_.step.max_steps - step - 1))));
  reporter_.publish(MetricScope::kStep, &rec, nullptr);
  interval_start_ = Clock::now();
  interval_steps_ = 0;
  sharded_->reset_unsharded_peak();  // the next logged figure covers the steps after this one
}

void Trainer::Impl::finish_trace() {
  const std::string file = reporter_.tracer().finish(*scalars_, cfg_->name(), std::max(o_.log.profile_begin, start_step_),
                                          std::min(o_.log.profile_end, summary_.end_step) - 1, say_);
  if (lead_) summary_.trace_file = file;
}

// The reason every rank reports: the largest request (e.g. the signal number).
int Trainer::Impl::agree_stop_reason() {
  at::Tensor why = at::full({1}, static_cast<double>(stop_local_), at::TensorOptions().dtype(at::kDouble));
  scalars_->all_reduce(why, comm::ReduceOp::kMax)->wait();
  return std::max(1, static_cast<int>(why.item<double>()));
}

}  // namespace fsdp::train

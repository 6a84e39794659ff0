// The Trainer: a thin loop over the run's components (train/*.h): the model
// (model_build.h), the checks (checks.h), the reporter (reporter.h: console,
// metric outputs, traced steps), the data pipeline (data_pipeline.h), the
// checkpointer (checkpointer.h: saves, resume, the run's state) and the
// export (export.h), in the phases of trainer_phase.h.
#include "fsdp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <limits>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/trace.h"
#include "train/checks.h"
#include "train/export.h"
#include "train/trainer_impl.h"

namespace fsdp::train {
namespace {

// A Trainer trains or evaluates; converting is convert_checkpoint's.
TrainOptions not_a_conversion(TrainOptions o) {
  FSDP_CHECK(o.mode != Mode::kConvert, "a Trainer trains or evaluates; Mode::kConvert is convert_checkpoint()'s "
             "(train() runs either)");
  return o;
}

}  // namespace

Trainer::Impl::Impl(TrainOptions options, comm::Runtime runtime)
    : o_(at_world_size(not_a_conversion(std::move(options)), runtime.world_group->size())),
      rt_(std::move(runtime)),
      world_(rt_.world_group),
      rank_(world_->rank()),
      W_(world_->size()),
      lead_(rank_ == 0),
      eval_only_(o_.mode == Mode::kEvaluate),
      reporter_(o_.log, rank_, W_, eval_only_),
      say_(reporter_.say()),
      warn_(reporter_.warn()),
      cfg_(validate_options(o_, W_, nullptr)) {
  trace::set_thread_name("main");
  // --metrics-port: before anything is built (a port in use fails the run first).
  summary_.metrics_url = reporter_.start_endpoint(rt_);
  build();
}

void Trainer::Impl::build() {
  device_ = worker_device(o_.device, rt_.world.local_rank);
  FSDP_CHECK(world_->device().type() == device_.type(), "TrainOptions::device ", o_.device.str(),
             " but the world process group (", world_->backend(), ") runs on ", world_->device().str(),
             "; start the workers with the backend for ", o_.device.str(), " (tcp for cpu, nccl for cuda)");
  set_current_device(device_);
  nn::set_attention_backend(o_.step.attention_backend);
  // This rank's share, before anything is allocated.
  unsharded_bound_ = check_memory(o_, W_, rt_.world.local_world_size, device_, cfg_);
  // --checkpoint-dir is this run's alone until it ends (Note [Ownership of
  // what we delete]): rank 0 locks it and removes what interrupted saves left.
  checkpointer_.emplace(o_.checkpoint, o_.data, o_.step, o_.hf.init_from, cfg_,
                        rt_.cpu_group ? *rt_.cpu_group : *world_, reporter_);
  data_.emplace(o_.data, o_.step, o_.eval, o_.hf.init_from, eval_only_, *cfg_, W_, rank_, warn_);

  // The model, built on the meta device; each rank materializes its shards.
  // --sync-module-states: rank 0 alone builds the whole model on the CPU
  // (initialized, or loaded from --init-from) and fully_shard broadcasts its
  // values, unit by unit, to every rank's shards.
  const bool rank0_materializes = o_.fsdp.sync_module_states && rank_ == 0;
  BuildOptions b;
  b.device = rank0_materializes ? at::kCPU : at::kMeta;
  b.seed = o_.step.seed;
  if (rank0_materializes) {
    b.before_root = [&](torch::nn::Module& model) {
      if (!o_.hf.init_from.empty() && !checkpoint::is_dcp_dir(o_.hf.init_from)) {
        rank0_import_ = checkpoint::import_hf_module(o_.hf.init_from, model, hf_model_info(*cfg_),
                                                     reporter_.progress_bars());
      }
      if (!o_.lora.init_adapter.empty()) checkpoint::import_peft_adapter_module(o_.lora.init_adapter, model);
    };
  }
  model_ = build_model(o_.step, o_.lora, o_.freeze, o_.param_groups, cfg_, b);
  engine_ = engine_options(o_, cfg_.get(), W_);
  engine_.device = device_;
  if (engine_.hybrid_shard_size == 0) engine_.hybrid_shard_size = rt_.world.local_world_size;
  engine_.init_rule = model_.init_rule;
  engine_.seed = o_.step.seed;
  sharded_ = fully_shard(model_.root, world_, engine_);
  // MFU: this rank's share of the model FLOPs per second over the device's data-sheet
  // peak for the compute dtype; left out where the peak is not known (the CPU).
  device_peak_flops_ = peak_flops(device_model(device_), engine_.mixed_precision.param_dtype);
  flops_per_token_ = cfg_->training_flops_per_token(o_.data.seq_len);
  if (o_.fsdp.sync_module_states) {
    say_(fmt::format("FsdpOptions::sync_module_states: rank 0's {} broadcast to {} rank{} before sharding",
                     o_.hf.init_from.empty() ? "initial parameters" : "weights from " + o_.hf.init_from, W_,
                     W_ == 1 ? "" : "s"));
  }
  build_optimizer();
  summary_.parameters = cfg_->num_parameters();
  summary_.plan = sharded_->describe();
  log_plan_and_memory();
  const RunData& d = data_->data();
  checkpointer_->set_export_extras(export_extras(o_.hf, o_.data, *cfg_, *d.tokenizer, d.bos, d.eos));
}

// AdamW over the shards, the schedule, the scalars' group and the loss scaler.
void Trainer::Impl::build_optimizer() {
  optim::AdamWOptions aopt = o_.adamw;
  if (engine_.mixed_precision.master_dtype == at::kBFloat16) {
    // Pure bf16: AnyPrecision AdamW (bf16 moments, Kahan-compensated updates).
    aopt.state_dtype = at::kBFloat16;
    aopt.kahan_summation = true;
  }
  opt_ = std::make_unique<optim::AdamW>(aopt);
  opt_->add_shards(sharded_->shards(), sharded_->units(), optim::param_rule(o_.param_groups));
  sched_ = o_.schedule;
  sched_.max_steps = o_.step.max_steps;

  // Host-side tensors: with NCCL the runtime's TCP cpu_group carries them.
  scalars_ = rt_.cpu_group ? rt_.cpu_group : W_ > 1 ? world_->new_group([&] {
    std::vector<int> all(static_cast<size_t>(W_));
    for (int i = 0; i < W_; ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }(), "trainer") : world_;

  // fp16: dynamic loss scaling over the sharded gradients; every rank skips
  // the same steps (grad_scaler.h).
  const LossScaling ls = o_.step.loss_scaling;
  if (ls == LossScaling::kOn || (ls == LossScaling::kAuto && engine_.mixed_precision.param_dtype == at::kHalf)) {
    optim::GradScalerOptions gso;
    gso.init_scale = o_.step.initial_loss_scale;
    scaler_ = std::make_unique<optim::ShardedGradScaler>(gso, scalars_);
  }
}

void Trainer::Impl::log_plan_and_memory() {
  int64_t total = 0, trainable = 0;
  for (const UnitInfo& e : sharded_->units()) {
    total += e.numel;
    trainable += e.trainable ? e.numel : 0;
  }
  const std::string frozen = trainable == total ? std::string()
                             : fmt::format("; {} of {} trainable, {} frozen", trainable, total, total - trainable);
  say_(fmt::format("model {} ({} parameters{}), {} ranks ({}), {} units, global batch {} x {} tokens", cfg_->name(),
                   cfg_->num_parameters(), frozen, W_, rt_.world.launcher, count_units(sharded_->units()),
                   data_->global_batch(), o_.data.seq_len));
  if (W_ > 1) say_(fmt::format("process group: {}", rt_.world_group->transport()));
  if (W_ > 1 && engine_.compression.any()) {
    say_(fmt::format("wire: all-gather {}, reduce-scatter {} (int8 blocks of {}; docs/compression.md)",
                     to_string(engine_.compression.all_gather), to_string(engine_.compression.reduce_scatter),
                     engine_.compression.block_size));
  }
  say_(fmt::format("data {}, {} {} of {} tokens per epoch", data_->sampler().rows().describe(),
                   data_->sampler().samples_per_epoch(),
                   cfg_->data_kind() == DataKind::kPairs ? "examples" : "windows", o_.data.seq_len));
  if (reporter_.console().on()) std::cout << summary_.plan << std::flush;
  // Where this rank's bytes live (CPU offload moves shards and optimizer state to host memory).
  std::string where;
  for (const auto& m : sharded_->memory_placement()) {
    if (m.bytes == 0) continue;
    where += fmt::format("{}{} {} on {}{}", where.empty() ? "" : ", ", m.what, format_bytes(m.bytes), m.device,
                         m.pinned ? " (pinned)" : "");
  }
  int64_t state = 0;
  for (const auto& slot : opt_->slots()) state += slot.exp_avg.nbytes() + slot.exp_avg_sq.nbytes();
  const std::string state_device = opt_->slots().empty() ? "-" : opt_->slots().front().exp_avg.device().str();
  say_(fmt::format("memory per rank: {}, optimizer state {} on {}; unsharded buffers during a step at most {}",
                   where, format_bytes(state), state_device, format_bytes(unsharded_bound_)));
}

SaveTarget Trainer::Impl::save_target() {
  return SaveTarget{*sharded_, *opt_, *scalars_, scaler_.get(), sched_, summary_};
}

// --- where the weights come from: a checkpoint, a Hugging Face directory, or the seed
void Trainer::Impl::restore(const char* method) {
  transition_to(phase_, TrainerPhase::kRestored, method);
  FailsTrainer fails(phase_);
  const std::optional<int64_t> resumed = checkpointer_->resume(save_target(), data_->global_batch());
  start_step_ = resumed.value_or(0);
  restore_weights(resumed.has_value());
  FSDP_CHECK(!eval_only_ || resumed || !o_.hf.init_from.empty(), "Mode::kEvaluate CheckpointOptions::resume: there "
             "is no checkpoint in ", o_.checkpoint.dir, " to evaluate; give HfOptions::init_from DIR or a "
             "CheckpointOptions::dir that holds one");
  reporter_.open_records(start_step_, o_.checkpoint.resume);
  step_ = start_step_;
  checkpointer_->set_saved_at(resumed ? start_step_ : -1);
  summary_.start_step = start_step_;
  summary_.end_step = start_step_;
}

// Not resumed: hf.init_from's weights (a Hugging Face directory or a PyTorch
// distributed checkpoint) and lora.init_adapter's adapters, when given.
void Trainer::Impl::restore_weights(bool resumed) {
  if (resumed) return;
  if (!o_.hf.init_from.empty() && checkpoint::is_dcp_dir(o_.hf.init_from)) {
    // A PyTorch distributed checkpoint's weights; the optimizer starts afresh.
    checkpoint::DcpLoadOptions dl;
    dl.names = checkpointer_->dcp_names(checkpoint::detect_dcp_layout(o_.hf.init_from));
    dl.load_optimizer = false;
    const checkpoint::DcpLoadResult r = checkpoint::load_dcp(o_.hf.init_from, *sharded_, {}, *scalars_, dl);
    say_(fmt::format("Initialized from the distributed checkpoint {} ({}): {} in {:.2f} s, {:.2f} GB/s",
                     o_.hf.init_from, r.format == checkpoint::DcpFormat::kTorchSave ? "torch_save" : "safetensors",
                     megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  } else if (!o_.hf.init_from.empty()) {
    // With --sync-module-states rank 0 read the files before sharding.
    const checkpoint::HfImportResult r =
        o_.fsdp.sync_module_states
            ? rank0_import_.value_or(checkpoint::HfImportResult{})
            : checkpoint::import_hf(o_.hf.init_from, *sharded_, hf_model_info(*cfg_), *scalars_,
                                    reporter_.progress_bars());
    say_(fmt::format("Initialized from {} ({} file{}): {} in {:.2f} s, {:.2f} GB/s{}", o_.hf.init_from,
                     r.files.size(), r.files.size() == 1 ? "" : "s", megabytes(r.io.bytes), r.io.seconds,
                     r.io.gb_per_s(),
                     r.ignored.empty() ? "" : fmt::format(" (ignored: {})", fmt::join(r.ignored, ", "))));
  }
  if (!o_.lora.init_adapter.empty()) {
    // With --sync-module-states rank 0 read it before sharding.
    if (!o_.fsdp.sync_module_states) checkpoint::import_peft_adapter(o_.lora.init_adapter, *sharded_);
    say_(fmt::format("LoRA adapters from {} (lora_alpha {}: scale alpha / r = {})", o_.lora.init_adapter,
                     o_.lora.effective_alpha(), o_.lora.effective_alpha() / static_cast<double>(o_.lora.rank)));
  }
}

// run()'s save: with checkpoint.async it returns once staged.
std::string Trainer::Impl::start_save() {
  PhaseScope scope(phase_, TrainerPhase::kSaving, "save");
  return checkpointer_->start_save(save_target(), step_, data_->global_batch(), data_->sampler().epochs_after(step_));
}

std::string Trainer::Impl::save() {
  require_legal(phase_, TrainerPhase::kSaving, "save");
  FSDP_CHECK(checkpointer_->enabled(), "Trainer::save needs checkpoint.dir (CheckpointOptions::dir DIR)");
  const std::string path = start_save();
  FailsTrainer fails(phase_);
  checkpointer_->finish(save_target());
  return path;
}

void Trainer::Impl::export_hf() {
  require_legal(phase_, TrainerPhase::kExporting, "export_hf");
  FSDP_CHECK(!o_.hf.export_dir.empty(), "Trainer::export_hf needs hf.export_dir (HfOptions::export_dir DIR)");
  PhaseScope scope(phase_, TrainerPhase::kExporting, "export_hf");
  // Special token ids (Hugging Face): with --init-from, its config.json's
  // (cfg_ carries them, see resolve_model_config); otherwise the tokenizer the
  // model was trained with, null where it has none. Files: Note [Export extras].
  export_and_report(o_.hf, o_.lora, o_.model, *sharded_, *cfg_, *scalars_, checkpointer_->export_extras(),
                    reporter_.progress_bars(), say_, warn_);
}

// One step of run() and what follows it: evaluation, a checkpoint, the end
// of the traced steps, the progress line. Returns false when the ranks
// agreed to stop.
bool Trainer::Impl::run_step() {
  reporter_.tracer().start_if_due(step_);
  train_step();
  if (!attention_named_ && !nn::first_attention_kernel().empty()) {
    attention_named_ = true;  // Note [Attention backend]: a row says which kernel it ran
    say_(fmt::format("attention: SDPA runs {} (StepOptions::attention_backend {})", nn::first_attention_kernel(),
                     nn::to_string(o_.step.attention_backend)));
  }
  const int64_t completed = step_;
  const bool last = completed == o_.step.max_steps;
  const bool stop = stop_requested();
  // Evaluation and checkpoint time is left out of the next Speed figure.
  const auto extra_start = Clock::now();
  checkpointer_->poll(save_target());  // a background save's writer error surfaces here, on every rank
  if (data_->has_validation() && o_.eval.every > 0 && (completed % o_.eval.every == 0 || last)) {
    evaluate(o_.eval.max_windows);
  }
  if (checkpointer_->enabled() && ((o_.checkpoint.every > 0 && completed % o_.checkpoint.every == 0) || last || stop)) {
    start_save();
  }
  interval_start_ += Clock::now() - extra_start;
  StepTracer& tracer = reporter_.tracer();
  if (tracer.tracing() && (tracer.due_to_finish(completed) || completed == run_end() || stop)) finish_trace();
  const double eta = seconds_per_step_ > 0 ? seconds_per_step_ * static_cast<double>(o_.step.max_steps - completed)
                                           : std::numeric_limits<double>::quiet_NaN();
  reporter_.console().progress(completed, o_.step.max_steps, eta);
  if (stop) summary_.stop_reason = agree_stop_reason();
  return !stop;
}

int64_t Trainer::Impl::run_end() const {
  return o_.step.stop_at_step > 0 ? std::min(o_.step.stop_at_step, o_.step.max_steps) : o_.step.max_steps;
}

TrainSummary Trainer::Impl::run() {
  restore("run");  // refused unless the Trainer is as constructed
  FailsTrainer fails(phase_);
  if (eval_only_) {
    evaluate(/*max_windows=*/0);
    if (!o_.hf.export_dir.empty()) export_hf();
    transition_to(phase_, TrainerPhase::kFinished, "run");
    return summary_;
  }
  const int64_t end = run_end();
  const bool pauses = end < o_.step.max_steps;  // --stop-at-step before the schedule's end
  if (step_ >= end) {
    say_(fmt::format("the checkpoint is at step {}, {} is {}: nothing to train", step_,
                     pauses ? "StepOptions::stop_at_step" : "StepOptions::max_steps", end));
  }
  begin_training();
  const auto run_start = Clock::now();
  while (step_ < end && run_step()) {
  }
  checkpointer_->finish(save_target());  // the end of training and SIGTERM wait for the save in flight
  data_->stop();
  if (summary_.stop_reason != 0) {
    say_(fmt::format("stopped by {} after {} steps: {}", signal_name(summary_.stop_reason), summary_.end_step,
                     o_.checkpoint.dir.empty()
                         ? "no CheckpointOptions::dir, so the training state was NOT saved"
                         : fmt::format("checkpoint {} saved; continue with CheckpointOptions::resume "
                                       "CheckpointOptions::dir {}",
                                       checkpoint::checkpoint_name(summary_.end_step), o_.checkpoint.dir)));
  } else if (pauses && step_ < o_.step.max_steps) {
    if (checkpointer_->saved_at() != step_) save();  // --stop-at-step: saved, not exported
    say_(fmt::format("stopped after step {} (StepOptions::stop_at_step {}, StepOptions::max_steps {}): checkpoint {} "
                     "saved; continue with CheckpointOptions::resume CheckpointOptions::dir {}", step_,
                     o_.step.stop_at_step, o_.step.max_steps, checkpoint::checkpoint_name(step_), o_.checkpoint.dir));
  } else {
    if (checkpointer_->enabled() && checkpointer_->saved_at() != summary_.end_step) save();  // resumed at the end
    if (!o_.hf.export_dir.empty()) export_hf();
  }
  say_(run_summary(o_, summary_, data_->global_batch(), seconds_since(run_start)));
  transition_to(phase_, TrainerPhase::kFinished, "run");
  return summary_;
}

Trainer::Trainer(TrainOptions options, comm::Runtime runtime)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(runtime))) {}
Trainer::~Trainer() = default;
void Trainer::restore() { impl_->restore(); }
StepRecord Trainer::train_step() { return impl_->train_step(); }
EvalRecord Trainer::evaluate(int64_t max_windows) { return impl_->evaluate(max_windows); }
std::string Trainer::save() { return impl_->save(); }
void Trainer::export_hf() { impl_->export_hf(); }
TrainSummary Trainer::run() { return impl_->run(); }
int64_t Trainer::step() const { return impl_->step(); }
bool Trainer::stop_requested() const { return impl_->stop_requested(); }
const TrainSummary& Trainer::summary() const { return impl_->summary(); }

TrainSummary train(const TrainOptions& options, const comm::Runtime& runtime) {
  if (options.mode == Mode::kConvert) return convert_checkpoint(options, runtime);
  return Trainer(options, runtime).run();
}

}  // namespace fsdp::train

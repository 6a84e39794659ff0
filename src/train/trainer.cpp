// The Trainer: a thin loop over the run's components (train/*.h): the model
// (model_build.h), the data (run_data.h), the checks (checks.h), the run's
// state and resume (run_state.h), the metric outputs (metrics.h,
// prometheus.h), the traced steps (profiling.h) and the export (export.h).
#include "fsdp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <limits>

#include <unistd.h>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/config_file.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/output_file.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/trace.h"
#include "fsdp/train/prometheus.h"
#include "train/checks.h"
#include "train/export.h"
#include "train/run_state.h"
#include "train/trainer_impl.h"

namespace fsdp::train {
namespace {

// metrics.jsonl -> metrics.config.toml, beside it.
std::string config_path_beside(const std::string& metrics_file) {
  std::filesystem::path p(metrics_file);
  return (p.parent_path() / (p.stem().string() + ".config.toml")).string();
}

// A Trainer trains or evaluates; converting is convert_checkpoint's.
TrainOptions not_a_conversion(TrainOptions o) {
  FSDP_CHECK(o.mode != Mode::kConvert, "a Trainer trains or evaluates; Mode::kConvert is convert_checkpoint()'s "
             "(train() runs either)");
  return o;
}

}  // namespace

Trainer::Impl::Impl(TrainOptions options, comm::Runtime runtime)
    : o_(not_a_conversion(std::move(options))),
      rt_(std::move(runtime)),
      world_(rt_.world_group),
      rank_(world_->rank()),
      W_(world_->size()),
      lead_(rank_ == 0),
      eval_only_(o_.mode == Mode::kEvaluate),
      console_(o_, lead_),
      say_(console_.level('I')),
      warn_(console_.level('W')),
      progress_(lead_ && !o_.log.quiet && isatty(STDERR_FILENO) == 1),
      cfg_(validate_options(o_, W_, nullptr)),
      tracer_(o_.log) {
  trace::set_thread_name("main");
  start_metrics_endpoint();
  build();
}

// --metrics-port: before anything is built, so that a port in use fails the
// run before it trains unobserved (Note [Prometheus endpoint]).
void Trainer::Impl::start_metrics_endpoint() {
  if (o_.log.metrics_port < 0 || !(lead_ || o_.log.metrics_every_rank)) return;
  const int port = o_.log.metrics_port == 0 || !o_.log.metrics_every_rank
                       ? o_.log.metrics_port
                       : o_.log.metrics_port + rt_.world.local_rank;
  auto exporter = std::make_unique<PrometheusExporter>(o_.log.metrics_host, port, rank_);
  if (lead_) summary_.metrics_url = exporter->url();
  if (o_.log.metrics_every_rank && o_.log.metrics_port == 0) {
    // Any free port: each rank's is its own, so rank 0 names every one (issue 39).
    comm::ProcessGroup& g = rt_.cpu_group ? *rt_.cpu_group : *world_;
    const at::Tensor mine = at::full({1}, static_cast<int64_t>(exporter->port()), at::kLong);
    const at::Tensor all = at::empty({W_}, at::kLong);
    g.all_gather(all, mine)->wait();
    std::string ports;
    for (int r = 0; r < W_; ++r) ports += fmt::format("{}rank {} port {}", r == 0 ? "" : ", ", r, all[r].item<int64_t>());
    say_(fmt::format("Prometheus metrics on {} (every rank, any free port: {})", exporter->url(), ports));
  } else {
    say_(fmt::format("Prometheus metrics on {}{}", exporter->url(),
                     o_.log.metrics_every_rank ? " (every rank: --metrics-port + its local rank)" : ""));
  }
  sinks_.push_back(std::move(exporter));
}

void Trainer::Impl::build() {
  device_ = worker_device(device_name(o_.device), rt_.world.local_rank);
  FSDP_CHECK(world_->device().type() == device_.type(), "--device ", device_name(o_.device),
             " but the world process group (", world_->backend(), ") runs on ", world_->device().str(),
             "; start the workers with the backend for ", device_name(o_.device), " (tcp for cpu, nccl for cuda)");
  set_current_device(device_);
  // This rank's share, before anything is allocated.
  unsharded_bound_ = check_memory(o_, W_, rt_.world.local_world_size, device_, cfg_);
  // --checkpoint-dir is this run's alone until it ends (Note [Ownership of
  // what we delete]): rank 0 locks it and removes what interrupted saves left.
  if (!o_.checkpoint.dir.empty()) {
    checkpoint_dir_ = checkpoint::open_checkpoint_dir(o_.checkpoint.dir, rt_.cpu_group ? *rt_.cpu_group : *world_);
  }
  data_ = load_run_data(o_, *cfg_, W_, rank_, warn_);

  // The model, built on the meta device; each rank materializes its shards.
  // --sync-module-states: rank 0 alone builds the whole model on the CPU
  // (initialized, or loaded from --init-from) and fully_shard broadcasts its
  // values, unit by unit, to every rank's shards.
  const bool rank0_materializes = o_.sharding.sync_module_states && rank_ == 0;
  BuildOptions b;
  b.device = rank0_materializes ? at::kCPU : at::kMeta;
  b.seed = o_.step.seed;
  if (rank0_materializes) {
    b.before_root = [&](torch::nn::Module& model) {
      if (!o_.hf.init_from.empty() && !checkpoint::is_dcp_dir(o_.hf.init_from)) {
        rank0_import_ = checkpoint::import_hf_module(o_.hf.init_from, model, hf_model_info(*cfg_), progress_);
      }
      if (!o_.lora.init_adapter.empty()) checkpoint::import_peft_adapter_module(o_.lora.init_adapter, model);
    };
  }
  model_ = build_model(o_, cfg_, b);
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
  if (o_.sharding.sync_module_states) {
    say_(fmt::format("--sync-module-states: rank 0's {} broadcast to {} rank{} before sharding",
                     o_.hf.init_from.empty() ? "initial parameters" : "weights from " + o_.hf.init_from, W_,
                     W_ == 1 ? "" : "s"));
  }

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
  const LossScaling ls = o_.sharding.loss_scaling;
  if (ls == LossScaling::kOn || (ls == LossScaling::kAuto && engine_.mixed_precision.param_dtype == at::kHalf)) {
    optim::GradScalerOptions gso;
    gso.init_scale = o_.sharding.initial_loss_scale;
    scaler_ = std::make_unique<optim::ShardedGradScaler>(gso, scalars_);
  }

  summary_.parameters = cfg_->num_parameters();
  if (o_.checkpoint.async && !o_.checkpoint.dir.empty()) {
    async_ = std::make_unique<checkpoint::AsyncCheckpointer>(
        checkpoint::AsyncSaveOptions{o_.checkpoint.staging_limit});
  }

  summary_.plan = sharded_->describe();
  log_plan_and_memory();
  model_state_ = model_state(*cfg_);
  hf_extras_ = export_extras(o_, *cfg_, *data_.tokenizer, data_.bos, data_.eos);
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
                   data_.global_batch, o_.data.seq_len));
  if (W_ > 1) say_(fmt::format("process group: {}", rt_.world_group->transport()));
  if (W_ > 1 && engine_.compression.any()) {
    say_(fmt::format("wire: all-gather {}, reduce-scatter {} (int8 blocks of {}; docs/compression.md)",
                     to_string(engine_.compression.all_gather), to_string(engine_.compression.reduce_scatter),
                     engine_.compression.block_size));
  }
  say_(fmt::format("data {}, {} {} of {} tokens per epoch", data_.sampler->rows().describe(),
                   data_.sampler->samples_per_epoch(),
                   cfg_->data_kind() == DataKind::kPairs ? "examples" : "windows", o_.data.seq_len));
  if (console_.on()) std::cout << summary_.plan << std::flush;
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

void Trainer::Impl::require_restored(const char* method) const {
  FSDP_CHECK(restored_, "Trainer::", method, " needs the weights in place: call restore() first");
}

// --- where the weights come from: a checkpoint, a Hugging Face directory, or the seed
void Trainer::Impl::restore() {
  FSDP_CHECK(!restored_, "Trainer::restore: the weights are restored already; call it once");
  for (const auto& name : checkpoint_dir_.removed) {
    say_(fmt::format("removed {}/{}, left by an interrupted save", o_.checkpoint.dir, name));
  }
  if (o_.checkpoint.resume) {
    checkpoint::LoadOptions lo;
    lo.progress = progress_;
    // The model's and the trainer's metadata are checked by resume_from.
    MetadataState model(checkpoint::kModelKey, model_state_);
    MetadataState trainer(checkpoint::kTrainerKey, nullptr);
    const std::optional<checkpoint::DcpNames> titan = cfg_->torchtitan_names();
    lo.dcp_names = titan ? &*titan : nullptr;
    const checkpoint::LoadResult r =
        checkpoint::load_latest_checkpoint(o_.checkpoint.dir, *sharded_, {&model, &trainer, opt_.get()}, *scalars_, lo);
    for (const auto& why : r.rejected) warn_(why + "; trying the previous checkpoint");
    if (r.loaded) {
      resumed_ = true;
      summary_.resumed_from = r.path;
      start_step_ = resume_from(o_, r, *cfg_, data_.global_batch, scaler_.get(), say_, warn_);
    } else if (checkpoint::is_dcp_dir(o_.checkpoint.dir)) {
      resume_from_dcp();
    } else {
      say_(fmt::format("no checkpoint in {} yet: starting from {}", o_.checkpoint.dir,
                       o_.hf.init_from.empty() ? "scratch" : o_.hf.init_from));
    }
  }
  if (!resumed_ && !o_.hf.init_from.empty() && checkpoint::is_dcp_dir(o_.hf.init_from)) {
    // A PyTorch distributed checkpoint's weights; the optimizer starts afresh.
    checkpoint::DcpLoadOptions dl;
    dl.names = dcp_names(checkpoint::detect_dcp_layout(o_.hf.init_from));
    dl.load_optimizer = false;
    const checkpoint::DcpLoadResult r = checkpoint::load_dcp(o_.hf.init_from, *sharded_, {}, *scalars_, dl);
    say_(fmt::format("Initialized from the distributed checkpoint {} ({}): {} in {:.2f} s, {:.2f} GB/s",
                     o_.hf.init_from, r.format == checkpoint::DcpFormat::kTorchSave ? "torch_save" : "safetensors",
                     megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  } else if (!resumed_ && !o_.hf.init_from.empty()) {
    // With --sync-module-states rank 0 read the files before sharding.
    const checkpoint::HfImportResult r =
        o_.sharding.sync_module_states ? rank0_import_.value_or(checkpoint::HfImportResult{})
                                       : checkpoint::import_hf(o_.hf.init_from, *sharded_, hf_model_info(*cfg_), *scalars_,
                                                                progress_);
    say_(fmt::format("Initialized from {} ({} file{}): {} in {:.2f} s, {:.2f} GB/s{}", o_.hf.init_from,
                     r.files.size(), r.files.size() == 1 ? "" : "s", megabytes(r.io.bytes), r.io.seconds,
                     r.io.gb_per_s(),
                     r.ignored.empty() ? "" : fmt::format(" (ignored: {})", fmt::join(r.ignored, ", "))));
  }
  if (!resumed_ && !o_.lora.init_adapter.empty()) {
    // With --sync-module-states rank 0 read it before sharding.
    if (!o_.sharding.sync_module_states) checkpoint::import_peft_adapter(o_.lora.init_adapter, *sharded_);
    say_(fmt::format("LoRA adapters from {} (lora_alpha {}: scale alpha / r = {})", o_.lora.init_adapter,
                     o_.lora.effective_alpha(), o_.lora.effective_alpha() / static_cast<double>(o_.lora.rank)));
  }
  FSDP_CHECK(!eval_only_ || resumed_ || !o_.hf.init_from.empty(), "--eval-only --resume: there is no checkpoint "
             "in ", o_.checkpoint.dir, " to evaluate; give --init-from DIR or a --checkpoint-dir that holds one");
  open_records();
  step_ = start_step_;
  saved_at_ = resumed_ ? start_step_ : -1;
  summary_.start_step = start_step_;
  summary_.end_step = start_step_;
  restored_ = true;
}

// --- what rank 0 records: metrics, TensorBoard, the effective configuration
void Trainer::Impl::open_records() {
  if (lead_ && !o_.log.metrics_file.empty()) {
    if (o_.checkpoint.resume && !eval_only_) {
      if (const int64_t n = drop_metrics_from(o_.log.metrics_file, start_step_); n > 0) {
        say_(fmt::format("dropped {} record{} of steps >= {} from {}: the resumed run trains those steps again", n,
                         n == 1 ? "" : "s", start_step_, o_.log.metrics_file));
      }
    }
    sinks_.push_back(make_json_lines_sink(o_.log.metrics_file));
    if (!o_.log.config_text.empty() && may_write_beside(o_.log.metrics_file)) {  // never /dev/null.config.toml
      write_config_copy(config_path_beside(o_.log.metrics_file), "--metrics-file");
    }
  }
  if (lead_ && !o_.log.tensorboard_dir.empty()) {
    sinks_.push_back(make_tensorboard_sink(o_.log.tensorboard_dir, o_.checkpoint.resume ? start_step_ : -1));
    if (!o_.log.config_text.empty()) {
      write_config_copy((std::filesystem::path(o_.log.tensorboard_dir) / "config.toml").string(), "--tensorboard");
    }
  }
}

// A derived name (Note [Output targets]): a user's file there, or the
// --config file itself, stays as it is; the run goes on without the copy.
void Trainer::Impl::write_config_copy(const std::string& path, const char* flag) {
  const std::string why = write_derived_output_file(path, o_.log.config_text, flag, kEffectiveConfigMarker,
                                                    o_.log.config_file);
  if (!why.empty()) warn_(fmt::format("the run's configuration was not copied: {}", why));
}

std::string Trainer::Impl::save() {
  const std::string path = start_save();
  finish_saves();
  return path;
}

// Note [Asynchronous save] (checkpoint/async_save.h) with checkpoint.async;
// else the synchronous save. Every save gets a CheckpointRecord; its stall
// goes into the next logged step's metrics.
std::string Trainer::Impl::start_save() {
  require_restored("save");
  FSDP_CHECK(!o_.checkpoint.dir.empty(), "Trainer::save needs checkpoint.dir (--checkpoint-dir DIR)");
  const int64_t completed = step_;
  trace::Span span("checkpoint save", "checkpoint", -1, {}, completed);
  checkpoint::SaveOptions so;
  so.keep_last = o_.checkpoint.keep_last;
  so.progress = progress_;
  RunState state;
  state.completed = completed;
  state.global_batch = data_.global_batch;
  state.epochs = data_.sampler->epochs_after(completed);
  state.world_size = W_;
  state.schedule = &sched_;
  state.hf_extras = &hf_extras_;
  state.scaler = scaler_.get();
  MetadataState model(checkpoint::kModelKey, model_state_);
  MetadataState trainer(checkpoint::kTrainerKey, trainer_state(o_, state));
  checkpoint::DcpSaveOptions dcp;  // --checkpoint-format dcp: step_N is a PyTorch distributed checkpoint
  if (o_.checkpoint.format == "dcp") {
    dcp.layout = checkpoint::parse_dcp_layout(o_.checkpoint.dcp_layout, "--dcp-layout");
    dcp.format = checkpoint::parse_dcp_format(o_.checkpoint.dcp_format, "--dcp-format");
    dcp.names = dcp_names(dcp.layout);
    so.dcp = &dcp;
  }
  const std::vector<StateOwner*> owners = {&model, &trainer, opt_.get()};
  const std::string name = checkpoint::checkpoint_name(completed);
  CheckpointRecord rec;
  rec.step = completed;
  rec.async = async_ != nullptr;
  saved_at_ = completed;
  if (!async_) {
    const checkpoint::SaveResult r = checkpoint::save_checkpoint(o_.checkpoint.dir, completed, *sharded_, owners,
                                                                 *scalars_, so);
    rec.committed = true;
    rec.stall_s = rec.seconds = r.io.seconds;
    rec.bytes = r.io.bytes;
    summary_.checkpoints.push_back(rec);
    checkpoint_stall_ += r.io.seconds;
    report_saved(completed, r, "", 0);
    return r.path;
  }
  const checkpoint::AsyncStart s = async_->start(o_.checkpoint.dir, completed, *sharded_, owners, *scalars_, so);
  // How long this save held training: its own start, and later its commit;
  // waiting for the previous save in flight (its commit included) is wait_s.
  if (s.waited_for) {  // at most one save in flight: this one waited for the previous
    const checkpoint::AsyncCommit& w = *s.waited_for;
    say_(fmt::format("checkpoint {} waited {:.2f} s for the save of {} still in flight (one save at a time)", name,
                     w.commit_s, checkpoint::checkpoint_name(w.step)));
    report_saved(w.step, w.result, "in the background", w.commit_s);
    rec.wait_s = w.commit_s;
    checkpoint_wait_ += w.commit_s;
  }
  rec.staged = s.staged;
  rec.stall_s = s.stall_s - rec.wait_s;
  rec.staging_bytes = s.staging_bytes;
  summary_.checkpoints.push_back(rec);
  checkpoint_stall_ += s.stall_s;
  if (s.staged) {
    say_(fmt::format("checkpoint {}: {} staged in {:.3f} s (host staging buffers {}), writing in the background",
                     name, format_bytes(s.state_bytes), s.stage_s, format_bytes(s.staging_bytes)));
  } else {
    warn_(fmt::format("checkpoint {} was written before training went on: {}", name, s.not_staged));
  }
  return s.path;
}

// After each step of run(): commits a background save whose writers all ended.
void Trainer::Impl::poll_save() {
  if (async_) report_commit(async_->poll(*scalars_));
}

void Trainer::Impl::finish_saves() {
  if (async_) report_commit(async_->finish(*scalars_));
}

// The save in flight is the newest record; its commit held training commit_s.
void Trainer::Impl::report_commit(const std::optional<checkpoint::AsyncCommit>& c) {
  if (!c) return;
  report_saved(c->step, c->result, "in the background", c->commit_s);
  checkpoint_stall_ += c->commit_s;
  summary_.checkpoints.back().stall_s += c->commit_s;
}

// A committed save: its log line (`how` and `held_s`, how long its commit
// held training, for a background save), its record, the pruned checkpoints.
void Trainer::Impl::report_saved(int64_t step, const checkpoint::SaveResult& r, const std::string& how,
                                 double held_s) {
  const std::string extra =
      how.empty() ? std::string()
                  : fmt::format("; {}: its commit held training {:.3f} s, host staging buffers {}", how, held_s,
                                format_bytes(async_ ? async_->staging_bytes() : 0));
  say_(fmt::format("Saved checkpoint {} in {:.2f} s: {}, {:.2f} GB/s ({}){}", checkpoint::checkpoint_name(step),
                   r.io.seconds, megabytes(r.io.bytes), r.io.gb_per_s(), o_.checkpoint.dir, extra));
  for (const auto& p : r.pruned) {
    say_(fmt::format("removed old checkpoint {} (--keep-last {})", p, o_.checkpoint.keep_last));
  }
  summary_.last_checkpoint = r.path;
  for (auto& c : summary_.checkpoints) {
    if (c.step == step && !c.committed) {
      c.committed = true;
      c.seconds = r.io.seconds;
      c.bytes = r.io.bytes;
    }
  }
}

// The names of `layout` for this model (checkpoint/dcp.h): ours, or torchtitan's.
checkpoint::DcpNames Trainer::Impl::dcp_names(checkpoint::DcpLayout layout) const {
  if (layout == checkpoint::DcpLayout::kTorch) return {};
  const std::optional<checkpoint::DcpNames> titan = cfg_->torchtitan_names();
  FSDP_CHECK(titan.has_value(), "model '", cfg_->name(), "' (", cfg_->family().name(), ") has no torchtitan layout; "
             "use --dcp-layout torch");
  return *titan;
}

// --resume from a PyTorch distributed checkpoint at the top of --checkpoint-dir
// (written by PyTorch: no fsdp-cpp metadata, so the step is PyTorch's
// optimizer step and the run's flags are taken as they are).
void Trainer::Impl::resume_from_dcp() {
  checkpoint::DcpLoadOptions dl;
  const checkpoint::DcpLayout layout = checkpoint::detect_dcp_layout(o_.checkpoint.dir);
  dl.names = dcp_names(layout);
  MetadataState model(checkpoint::kModelKey, model_state_);
  MetadataState trainer(checkpoint::kTrainerKey, nullptr);
  const checkpoint::DcpLoadResult r =
      checkpoint::load_dcp(o_.checkpoint.dir, *sharded_, {&model, &trainer, opt_.get()}, *scalars_, dl);
  if (!model.loaded().is_null()) {
    const std::string diff = saved_model_mismatch(model.loaded(), *cfg_, o_.checkpoint.dir);
    FSDP_CHECK(diff.empty(), "checkpoint ", o_.checkpoint.dir, " was saved from another model (", diff, ")");
  }
  int64_t step = r.optimizer_step;
  if (trainer.loaded().is_object() && trainer.loaded().contains("step")) step = trainer.loaded()["step"].get<int64_t>();
  FSDP_CHECK(step >= 0, "the distributed checkpoint ", o_.checkpoint.dir, " holds no step count (no optimizer.state."
             "<name>.step, no train_state.step); it cannot resume training: start from its weights with --init-from");
  opt_->set_step_count(step);
  resumed_ = true;
  start_step_ = step;
  summary_.resumed_from = o_.checkpoint.dir;
  say_(fmt::format("Resumed from the distributed checkpoint {} (step {}, {} layout): {} in {:.2f} s, {:.2f} GB/s",
                   o_.checkpoint.dir, step, layout == checkpoint::DcpLayout::kTorch ? "torch" : "torchtitan",
                   megabytes(r.io.bytes), r.io.seconds,
                   r.io.gb_per_s()));
}

void Trainer::Impl::export_hf() {
  require_restored("export_hf");
  FSDP_CHECK(!o_.hf.export_dir.empty(), "Trainer::export_hf needs hf.export_dir (--export-hf DIR)");
  // Special token ids (Hugging Face): with --init-from, its config.json's
  // (cfg_ carries them, see resolve_model_config); otherwise the tokenizer the
  // model was trained with, null where it has none. Files: Note [Export extras].
  export_and_report(o_, *sharded_, *cfg_, *scalars_, hf_extras_, progress_, say_, warn_);
}

TrainSummary Trainer::Impl::run() {
  FSDP_CHECK(!restored_, "Trainer::run runs the whole training from the start; restore() was called already");
  restore();
  if (eval_only_) {
    evaluate(/*max_windows=*/0);
    if (!o_.hf.export_dir.empty()) export_hf();
    return summary_;
  }
  if (step_ >= o_.step.max_steps) {
    say_(fmt::format("the checkpoint is at step {}, --max-steps is {}: nothing to train", step_, o_.step.max_steps));
  }
  begin_training();
  const auto run_start = Clock::now();
  while (step_ < o_.step.max_steps) {
    tracer_.start_if_due(step_);
    train_step();
    const int64_t completed = step_;
    const bool last = completed == o_.step.max_steps;
    // Evaluation and checkpoint time is left out of the next Speed figure.
    const auto extra_start = Clock::now();
    poll_save();  // a background save's writer error surfaces here, on every rank
    if (data_.has_validation() && o_.eval.every > 0 && (completed % o_.eval.every == 0 || last)) {
      evaluate(o_.eval.max_windows);
    }
    if (!o_.checkpoint.dir.empty() &&
        ((o_.checkpoint.every > 0 && completed % o_.checkpoint.every == 0) || last || stop_)) {
      start_save();
    }
    interval_start_ += Clock::now() - extra_start;
    if (tracer_.tracing() && (tracer_.due_to_finish(completed) || last || stop_)) finish_trace();
    const double eta = seconds_per_step_ > 0 ? seconds_per_step_ * static_cast<double>(o_.step.max_steps - completed)
                                             : std::numeric_limits<double>::quiet_NaN();
    console_.progress(completed, o_.step.max_steps, eta);
    if (stop_) {
      summary_.stop_reason = agree_stop_reason();
      break;
    }
  }
  finish_saves();  // the end of training and SIGTERM wait for the save in flight
  loader_->stop();
  if (summary_.stop_reason != 0) {
    say_(fmt::format("stopped by {} after {} steps: {}", signal_name(summary_.stop_reason), summary_.end_step,
                     o_.checkpoint.dir.empty()
                         ? "no --checkpoint-dir, so the training state was NOT saved"
                         : fmt::format("checkpoint {} saved; continue with --resume --checkpoint-dir {}",
                                       checkpoint::checkpoint_name(summary_.end_step), o_.checkpoint.dir)));
  } else {
    if (!o_.checkpoint.dir.empty() && saved_at_ != summary_.end_step) save();  // resumed at the end
    if (!o_.hf.export_dir.empty()) export_hf();
  }
  say_(run_summary(o_, summary_, data_.global_batch, seconds_since(run_start)));
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

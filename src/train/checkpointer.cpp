// The trainer's checkpointer (checkpointer.h).
#include "train/checkpointer.h"

#include <fmt/format.h>

#include <utility>

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/state.h"
#include "fsdp/common/trace.h"
#include "train/run_state.h"

namespace fsdp::train {

Checkpointer::Checkpointer(const CheckpointOptions& options, const DataOptions& data, const StepOptions& step,
                           const std::string& init_from, ModelConfigPtr cfg, comm::ProcessGroup& dir_group,
                           const Reporter& reporter)
    : o_(options),
      data_(data),
      step_(step),
      init_from_(init_from),
      cfg_(std::move(cfg)),
      say_(reporter.say()),
      warn_(reporter.warn()),
      progress_(reporter.progress_bars()),
      model_state_(model_state(*cfg_)) {
  if (o_.dir.empty()) return;
  dir_ = checkpoint::open_checkpoint_dir(o_.dir, dir_group);
  if (o_.async) {
    async_ = std::make_unique<checkpoint::AsyncCheckpointer>(checkpoint::AsyncSaveOptions{o_.staging_limit});
  }
}

void Checkpointer::set_export_extras(ExportExtras extras) {
  hf_extras_ = std::move(extras);
  hf_record_ = export_record(hf_extras_);
  carried_ = hf_extras_.files;
  if (!enabled()) return;
  for (checkpoint::CarriedFile& f : carried_) {
    f.content = std::make_shared<const std::string>(
        read_input_file(f.path, "the run's " + f.name, kMaxTokenizerBytes,
                        "every checkpoint carries a copy of the tokenizer and generation files an export writes"));
  }
}

// --- resume: the newest valid checkpoint of ours, else a distributed checkpoint at the top
std::optional<int64_t> Checkpointer::resume(const SaveTarget& t, int64_t global_batch) {
  for (const auto& name : dir_.removed) say_(fmt::format("removed {}/{}, left by an interrupted save", o_.dir, name));
  if (!o_.resume) return std::nullopt;
  checkpoint::LoadOptions lo;
  lo.progress = progress_;
  // The model's metadata is checked by resume_from; the trainer's shape on load.
  MetadataState model(checkpoint::kModelKey, model_state_);
  MetadataState trainer(checkpoint::kTrainerKey, nullptr, check_trainer_state);
  const std::optional<checkpoint::DcpNames> titan = cfg_->torchtitan_names();
  lo.dcp_names = titan ? &*titan : nullptr;
  const checkpoint::LoadResult r =
      checkpoint::load_latest_checkpoint(o_.dir, t.model, {&model, &trainer, &t.optimizer}, t.group, lo);
  for (const auto& why : r.rejected) warn_(why + "; trying the previous checkpoint");
  if (r.loaded) {
    t.summary.resumed_from = r.path;
    return resume_from(data_, step_, r, *cfg_, global_batch, t.scaler, say_, warn_);
  }
  if (checkpoint::is_dcp_dir(o_.dir)) {
    int64_t step = 0;
    resume_from_dcp(t, step);
    return step;
  }
  say_(fmt::format("no checkpoint in {} yet: starting from {}", o_.dir,
                   init_from_.empty() ? "scratch" : init_from_));
  return std::nullopt;
}

checkpoint::DcpNames Checkpointer::dcp_names(checkpoint::DcpLayout layout) const {
  if (layout == checkpoint::DcpLayout::kTorch) return {};
  const std::optional<checkpoint::DcpNames> titan = cfg_->torchtitan_names();
  FSDP_CHECK(titan.has_value(), "model '", cfg_->name(), "' (", cfg_->family().name(), ") has no torchtitan layout; "
             "use CheckpointOptions::dcp_layout torch");
  return *titan;
}

// --resume from a PyTorch distributed checkpoint at the top of --checkpoint-dir
// (written by PyTorch: no fsdp-cpp metadata, so the step is PyTorch's
// optimizer step and the run's flags are taken as they are).
void Checkpointer::resume_from_dcp(const SaveTarget& t, int64_t& step) {
  checkpoint::DcpLoadOptions dl;
  const checkpoint::DcpLayout layout = checkpoint::detect_dcp_layout(o_.dir);
  dl.names = dcp_names(layout);
  MetadataState model(checkpoint::kModelKey, model_state_);
  MetadataState trainer(checkpoint::kTrainerKey, nullptr, check_trainer_state);
  const checkpoint::DcpLoadResult r =
      checkpoint::load_dcp(o_.dir, t.model, {&model, &trainer, &t.optimizer}, t.group, dl);
  if (!model.loaded().is_null()) {
    const std::string diff = saved_model_mismatch(model.loaded(), *cfg_, o_.dir);
    FSDP_CHECK(diff.empty(), "checkpoint ", o_.dir, " was saved from another model (", diff, ")");
  }
  step = r.optimizer_step;
  if (trainer.loaded().is_object()) step = trainer.loaded().value("step", step);  // checked on load: a count
  FSDP_CHECK(step >= 0, "the distributed checkpoint ", o_.dir, " holds no step count (no optimizer.state."
             "<name>.step, no train_state.step); it cannot resume training: start from its weights with "
             "HfOptions::init_from");
  t.optimizer.set_step_count(step);
  t.summary.resumed_from = o_.dir;
  say_(fmt::format("Resumed from the distributed checkpoint {} (step {}, {} layout): {} in {:.2f} s, {:.2f} GB/s",
                   o_.dir, step, layout == checkpoint::DcpLayout::kTorch ? "torch" : "torchtitan",
                   megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
}

// --- saves: Note [Asynchronous save] (checkpoint/async_save.h) with
// checkpoint.async, else the synchronous save. Every save gets a
// CheckpointRecord; its stall goes into the next logged step's metrics.
std::string Checkpointer::start_save(const SaveTarget& t, int64_t completed, int64_t global_batch, double epochs) {
  trace::Span span("checkpoint save", "checkpoint", -1, {}, completed);
  checkpoint::SaveOptions so;
  so.keep_last = o_.keep_last;
  so.progress = progress_;
  RunState state;
  state.completed = completed;
  state.global_batch = global_batch;
  state.epochs = epochs;
  state.world_size = t.group.size();  // every rank: the scalars group spans the world
  state.schedule = &t.schedule;
  state.hf_extras = &hf_record_;
  so.carried = carried_;  // Note [Carried files]: the snapshots
  state.scaler = t.scaler;
  MetadataState model(checkpoint::kModelKey, model_state_);
  MetadataState trainer(checkpoint::kTrainerKey, trainer_state(data_, step_, state));
  checkpoint::DcpSaveOptions dcp;  // --checkpoint-format dcp: step_N is a PyTorch distributed checkpoint
  if (o_.format == "dcp") {
    dcp.layout = checkpoint::parse_dcp_layout(o_.dcp_layout, "CheckpointOptions::dcp_layout");
    dcp.format = checkpoint::parse_dcp_format(o_.dcp_format, "CheckpointOptions::dcp_format");
    dcp.names = dcp_names(dcp.layout);
    so.dcp = &dcp;
  }
  const std::vector<StateOwner*> owners = {&model, &trainer, &t.optimizer};
  const std::string name = checkpoint::checkpoint_name(completed);
  CheckpointRecord rec;
  rec.step = completed;
  rec.async = async_ != nullptr;
  saved_at_ = completed;
  if (!async_) {
    const checkpoint::SaveResult r = checkpoint::save_checkpoint(o_.dir, completed, t.model, owners, t.group, so);
    rec.committed = true;
    rec.stall_s = rec.seconds = r.io.seconds;
    rec.bytes = r.io.bytes;
    t.summary.checkpoints.push_back(rec);
    stall_ += r.io.seconds;
    report_saved(t.summary, completed, r, "", 0);
    return r.path;
  }
  const checkpoint::AsyncStart s = async_->start(o_.dir, completed, t.model, owners, t.group, so);
  // How long this save held training: its own start, and later its commit;
  // waiting for the previous save in flight (its commit included) is wait_s.
  if (s.waited_for) {  // at most one save in flight: this one waited for the previous
    const checkpoint::AsyncCommit& w = *s.waited_for;
    say_(fmt::format("checkpoint {} waited {:.2f} s for the save of {} still in flight (one save at a time)", name,
                     w.commit_s, checkpoint::checkpoint_name(w.step)));
    report_saved(t.summary, w.step, w.result, "in the background", w.commit_s);
    rec.wait_s = w.commit_s;
    wait_ += w.commit_s;
  }
  rec.staged = s.staged;
  rec.stall_s = s.stall_s - rec.wait_s;
  rec.staging_bytes = s.staging_bytes;
  t.summary.checkpoints.push_back(rec);
  stall_ += s.stall_s;
  if (s.staged) {
    say_(fmt::format("checkpoint {}: {} staged in {:.3f} s (host staging buffers {}), writing in the background",
                     name, format_bytes(s.state_bytes), s.stage_s, format_bytes(s.staging_bytes)));
  } else {
    warn_(fmt::format("checkpoint {} was written before training went on: {}", name, s.not_staged));
  }
  return s.path;
}

void Checkpointer::poll(const SaveTarget& t) {
  if (async_) report_commit(t.summary, async_->poll(t.group));  // a writer's error surfaces here, on every rank
}

void Checkpointer::finish(const SaveTarget& t) {
  if (async_) report_commit(t.summary, async_->finish(t.group));
}

void Checkpointer::take_stalls(StepRecord& rec) {
  if (!enabled()) return;
  rec.checkpoint_stall_s = std::exchange(stall_, 0.0);
  rec.checkpoint_wait_s = std::exchange(wait_, 0.0);
  rec.checkpoint_staging_bytes = async_ ? async_->staging_bytes() : 0;
}

// The save in flight is the newest record; its commit held training commit_s.
void Checkpointer::report_commit(TrainSummary& summary, const std::optional<checkpoint::AsyncCommit>& c) {
  if (!c) return;
  report_saved(summary, c->step, c->result, "in the background", c->commit_s);
  stall_ += c->commit_s;
  summary.checkpoints.back().stall_s += c->commit_s;
}

// A committed save: its log line (`how` and `held_s`, how long its commit
// held training, for a background save), its record, the pruned checkpoints.
void Checkpointer::report_saved(TrainSummary& summary, int64_t step, const checkpoint::SaveResult& r,
                                const std::string& how, double held_s) {
  const std::string extra =
      how.empty() ? std::string()
                  : fmt::format("; {}: its commit held training {:.3f} s, host staging buffers {}", how, held_s,
                                format_bytes(async_ ? async_->staging_bytes() : 0));
  say_(fmt::format("Saved checkpoint {} in {:.2f} s: {}, {:.2f} GB/s ({}){}", checkpoint::checkpoint_name(step),
                   r.io.seconds, megabytes(r.io.bytes), r.io.gb_per_s(), o_.dir, extra));
  for (const auto& p : r.pruned) {
    say_(fmt::format("removed old checkpoint {} (CheckpointOptions::keep_last {})", p, o_.keep_last));
  }
  summary.last_checkpoint = r.path;
  for (auto& c : summary.checkpoints) {
    if (c.step == step && !c.committed) {
      c.committed = true;
      c.seconds = r.io.seconds;
      c.bytes = r.io.bytes;
    }
  }
}

}  // namespace fsdp::train

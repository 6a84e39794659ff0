// Mode::kConvert: a checkpoint (ours or a PyTorch distributed checkpoint) to
// Hugging Face files, a distributed checkpoint or ours (Note [Checkpoint
// conversion] in validate.cpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/common/output_file.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/device.h"
#include "fsdp/train/trainer.h"  // convert_checkpoint, defined here
#include "fsdp/common/error.h"
#include "fsdp/models/registry.h"
#include "train/checks.h"
#include "train/console.h"
#include "train/export.h"
#include "train/model_build.h"
#include "train/run_state.h"

namespace fsdp::train {

namespace {

// What a conversion read: where from, its step, whether optimizer state came
// with it, and the export extras its run recorded (Note [Export extras]).
struct Source {
  std::string path;
  int64_t step = 0;
  bool with_optimizer = false;
  ExportExtras extras;  // its files: copies inside the checkpoint (Note [Carried files]), or the HF directory's
};

// The model, sharded over the world group as the run would have it.
struct Converting {
  ModelConfigPtr cfg;
  BuiltModel model;
  std::shared_ptr<ShardedModel> sharded;
  comm::ProcessGroupPtr group;  // host-side scalars and the files' bytes
};

Converting shard_for_conversion(const TrainOptions& o, const comm::Runtime& rt, ModelConfigPtr cfg,
                                const at::Device& device) {
  const comm::ProcessGroupPtr& world = rt.world_group;
  Converting c;
  c.cfg = std::move(cfg);
  // A LoRA run's checkpoint: the same --lora-* flags. The parameters are
  // loaded as saved, frozen or not.
  BuildOptions b;
  b.seed = o.step.seed;
  b.freeze = false;
  c.model = build_model(o.step, o.lora, o.freeze, o.param_groups, c.cfg, b);
  FsdpOptions fo = engine_options(o, c.cfg.get(), world->size());
  fo.device = device;
  if (fo.hybrid_shard_size == 0) fo.hybrid_shard_size = rt.world.local_world_size;
  fo.init_rule = c.model.init_rule;
  fo.seed = o.step.seed;
  c.sharded = fully_shard(c.model.root, world, fo);
  c.group = rt.cpu_group ? rt.cpu_group : world;
  return c;
}

// A PyTorch distributed checkpoint at the top of --checkpoint-dir `dir` (Note [DCP keys]).
Source load_dcp_source(const std::string& dir, Converting& c, const std::vector<StateOwner*>& owners,
                       MetadataState& trainer, optim::AdamW& opt, const LogLine& say, const LogLine& warn) {
  checkpoint::DcpLoadOptions dl;
  if (checkpoint::detect_dcp_layout(dir) == checkpoint::DcpLayout::kTorchtitan) {
    const std::optional<checkpoint::DcpNames> titan = c.cfg->torchtitan_names();
    FSDP_CHECK(titan.has_value(), dir, " is in torchtitan's layout, which model '", c.cfg->name(),
               "' does not have");
    dl.names = *titan;
  }
  dl.optimizer_if_present = true;
  const checkpoint::DcpLoadResult r = checkpoint::load_dcp(dir, *c.sharded, owners, *c.group, dl);
  Source s;
  s.with_optimizer = r.optimizer_loaded;
  s.step = std::max<int64_t>(0, r.optimizer_step);
  if (trainer.loaded().is_object()) {  // checked on load (check_trainer_state)
    s.step = trainer.loaded().value("step", s.step);
    s.extras = saved_export_extras(trainer.loaded().value("hf_export", nlohmann::json()), r.carried, dir, warn);
  }
  if (s.with_optimizer && r.state->is_null()) opt.set_step_count(s.step);
  s.path = dir;
  say(fmt::format("Loaded the distributed checkpoint {} (step {}, {}{}): {} in {:.2f} s, {:.2f} GB/s", s.path, s.step,
                  c.cfg->summary(), s.with_optimizer ? ", with optimizer state" : ", weights only",
                  megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  return s;
}

// The newest valid checkpoint of ours in --checkpoint-dir `dir`, with its optimizer state when it has one.
Source load_our_checkpoint(const std::string& dir, Converting& c, std::vector<StateOwner*> owners, optim::AdamW& opt,
                           bool progress, const LogLine& say, const LogLine& warn) {
  checkpoint::LoadOptions lo;
  lo.progress = progress;
  const std::optional<checkpoint::DcpNames> titan = c.cfg->torchtitan_names();
  lo.dcp_names = titan ? &*titan : nullptr;
  const auto ours = checkpoint::list_checkpoints(dir);
  Source s;
  s.with_optimizer = !ours.empty() && checkpoint::read_checkpoint_state(ours.front().path)->contains("optimizer");
  if (s.with_optimizer) owners.push_back(&opt);
  const checkpoint::LoadResult r = checkpoint::load_latest_checkpoint(dir, *c.sharded, owners, *c.group, lo);
  for (const auto& why : r.rejected) warn(why + "; trying the previous checkpoint");
  std::vector<std::string> ignored;
  checkpoint::list_checkpoints(dir, &ignored);
  for (const auto& i : ignored) warn(fmt::format("{}/{} is not a checkpoint: ignored", dir, i));
  FSDP_CHECK(r.loaded, "CheckpointOptions::dir ", dir, " holds no checkpoint to convert");
  const std::string diff = saved_model_mismatch(r.saved(checkpoint::kModelKey), *c.cfg, r.path);
  FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " holds another model than the newest checkpoint's (", diff,
             "); convert it from a directory of its own");
  say(fmt::format("Loaded checkpoint {} (step {}, {}): {} in {:.2f} s, {:.2f} GB/s", r.path, r.step, c.cfg->summary(),
                  megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  s.step = r.step;
  s.path = r.path;
  s.extras = saved_export_extras(r.trainer_state->value("hf_export", nlohmann::json()), r.carried, r.path, warn);
  return s;
}

// A Hugging Face directory `dir` (convert --init-from): its weights; its
// tokenizer and generation files travel to an export as a run's would.
Source load_hf_source(const std::string& dir, Converting& c, bool progress, const LogLine& say) {
  const checkpoint::HfImportResult r =
      checkpoint::import_hf(dir, *c.sharded, hf_model_info(*c.cfg), *c.group, progress);
  say(fmt::format("Loaded {} ({}): {} in {:.2f} s, {:.2f} GB/s", dir, c.cfg->summary(), megabytes(r.io.bytes),
                  r.io.seconds, r.io.gb_per_s()));
  Source s;
  s.path = dir;
  for (const auto& [path, name] : checkpoint::find_hf_side_files(dir)) s.extras.files.push_back({path, name});
  return s;
}

// The targets: --export-hf, --export-dcp, --export-checkpoint.
void write_targets(const TrainOptions& o, Converting& c, const Source& s, std::vector<StateOwner*> owners,
                   bool progress, const LogLine& say, const LogLine& warn) {
  if (!o.hf.export_dir.empty()) {
    export_and_report(o.hf, o.lora, o.model, *c.sharded, *c.cfg, *c.group, s.extras, progress, say, warn);
  }
  if (!o.checkpoint.export_dcp.empty()) {
    checkpoint::DcpSaveOptions so;
    so.layout = checkpoint::parse_dcp_layout(o.checkpoint.dcp_layout, "CheckpointOptions::dcp_layout");
    so.format = checkpoint::parse_dcp_format(o.checkpoint.dcp_format, "CheckpointOptions::dcp_format");
    if (so.layout == checkpoint::DcpLayout::kTorchtitan) {
      const std::optional<checkpoint::DcpNames> titan = c.cfg->torchtitan_names();
      FSDP_CHECK(titan.has_value(), "CheckpointOptions::dcp_layout torchtitan: model '", c.cfg->name(),
                 "' has no torchtitan layout");
      so.names = *titan;
    }
    so.carried = s.extras.files;  // Note [Carried files]: the export of this DCP writes them too
    const checkpoint::IoStats io = checkpoint::save_dcp(o.checkpoint.export_dcp, *c.sharded, owners, *c.group, so);
    if (c.group->rank() == 0) {  // the model beside the weights: --init-from and convert read it
      write_output_file((std::filesystem::path(o.checkpoint.export_dcp) / "config.json").string(),
                        c.cfg->hf_config_json(), "CheckpointOptions::export_dcp");
    }
    say(fmt::format("Wrote the distributed checkpoint {} ({} layout, {}{}): {} in {:.2f} s",
                    o.checkpoint.export_dcp, o.checkpoint.dcp_layout, o.checkpoint.dcp_format,
                    s.with_optimizer ? ", with optimizer state" : ", weights only", megabytes(io.bytes), io.seconds));
  }
  if (!o.checkpoint.export_checkpoint.empty()) {
    const checkpoint::CheckpointDirHold hold = checkpoint::open_checkpoint_dir(o.checkpoint.export_checkpoint, *c.group);
    checkpoint::SaveOptions so;
    so.carried = s.extras.files;
    const checkpoint::SaveResult r = checkpoint::save_checkpoint(o.checkpoint.export_checkpoint, s.step, *c.sharded,
                                                                 owners, *c.group, so);
    say(fmt::format("Wrote checkpoint {}{}: {} in {:.2f} s", r.path,
                    s.with_optimizer ? " (with optimizer state: CheckpointOptions::resume continues it)"
                                      : " (weights only)",
                    megabytes(r.io.bytes), r.io.seconds));
  }
}

}  // namespace

TrainSummary convert_checkpoint(const TrainOptions& o, const comm::Runtime& rt) {
  FSDP_CHECK(o.mode == Mode::kConvert, "convert_checkpoint needs options.mode == Mode::kConvert");
  const comm::ProcessGroupPtr& world = rt.world_group;
  ModelConfigPtr cfg = validate_options(o, world->size(), nullptr);
  const bool lead = world->rank() == 0;
  const at::Device device = worker_device(o.device, rt.world.local_rank);
  set_current_device(device);
  Console console(o.log, lead);
  const LogLine say = console.level('I');
  const LogLine warn = console.level('W');
  const bool progress = lead && !o.log.quiet && isatty(STDERR_FILENO) == 1;
  Converting c = shard_for_conversion(o, rt, std::move(cfg), device);

  // The optimizer the run would have, so that its state travels when the source has it.
  optim::AdamW opt(o.adamw);
  opt.add_shards(c.sharded->shards(), c.sharded->units(), optim::param_rule(o.param_groups));
  MetadataState model(checkpoint::kModelKey, model_state(*c.cfg));
  MetadataState trainer(checkpoint::kTrainerKey, nullptr, check_trainer_state);
  Source s;
  if (!o.hf.init_from.empty()) {
    s = load_hf_source(o.hf.init_from, c, progress, say);
  } else if (checkpoint::list_checkpoints(o.checkpoint.dir).empty() && checkpoint::is_dcp_dir(o.checkpoint.dir)) {
    s = load_dcp_source(o.checkpoint.dir, c, {&model, &trainer, &opt}, trainer, opt, say, warn);
  } else {
    s = load_our_checkpoint(o.checkpoint.dir, c, {&model, &trainer}, opt, progress, say, warn);
  }
  // The trainer's state travels into a checkpoint target, its export record
  // rewritten to name what is carried now.
  nlohmann::json trainer_out = trainer.loaded().is_object() ? trainer.loaded() : nlohmann::json{{"step", s.step}};
  trainer_out["hf_export"] = export_record(s.extras);
  MetadataState carried(checkpoint::kTrainerKey, trainer_out);
  std::vector<StateOwner*> owners = {&model, &carried};
  if (s.with_optimizer) owners.push_back(&opt);
  write_targets(o, c, s, owners, progress, say, warn);
  TrainSummary summary;
  summary.parameters = c.cfg->num_parameters();
  summary.plan = c.sharded->describe();
  summary.start_step = s.step;
  summary.end_step = s.step;
  summary.resumed_from = s.path;
  return summary;
}

}  // namespace fsdp::train

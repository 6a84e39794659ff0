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
#include "fsdp/common/error.h"
#include "fsdp/models/registry.h"
#include "train/checks.h"
#include "train/console.h"
#include "train/export.h"
#include "train/model_build.h"

namespace fsdp::train {

TrainSummary convert_checkpoint(const TrainOptions& o, const comm::Runtime& rt) {
  FSDP_CHECK(o.mode == Mode::kConvert, "convert_checkpoint needs options.mode == Mode::kConvert");
  const comm::ProcessGroupPtr& world = rt.world_group;
  const models::LlamaConfig cfg = validate_options(o, world->size(), nullptr);
  const bool lead = world->rank() == 0;
  const at::Device device = worker_device(device_name(o.device), rt.world.local_rank);
  set_current_device(device);
  Console console(o, lead);
  const LogLine say = console.level('I');
  const LogLine warn = console.level('W');
  const bool progress = lead && !o.log.quiet && isatty(STDERR_FILENO) == 1;

  // A LoRA run's checkpoint: the same --lora-* flags. The parameters are
  // loaded as saved, frozen or not.
  BuildOptions b;
  b.seed = o.step.seed;
  b.freeze = false;
  const BuiltModel m = build_model(o, cfg, b);
  FsdpOptions fo = engine_options(o, *m.family, world->size());
  fo.device = device;
  if (fo.hybrid_shard_size == 0) fo.hybrid_shard_size = rt.world.local_world_size;
  fo.init_rule = m.init_rule;
  fo.seed = o.step.seed;
  auto sharded = fully_shard(m.root, world, fo);
  comm::ProcessGroupPtr group = rt.cpu_group ? rt.cpu_group : world;

  // The optimizer the run would have, so that its state travels when the source has it.
  optim::AdamW opt(o.adamw);
  opt.add_shards(sharded->shards(), sharded->units(), optim::param_rule(o.param_groups));
  MetadataState model(checkpoint::kModelKey, model_state(cfg));
  MetadataState trainer(checkpoint::kTrainerKey, nullptr);
  const checkpoint::DcpNames titan = checkpoint::torchtitan_llama_names(cfg.num_attention_heads, cfg.num_key_value_heads);
  const checkpoint::DcpLayout layout = checkpoint::parse_dcp_layout(o.checkpoint.dcp_layout, "--dcp-layout");

  int64_t step = 0;
  std::string source;
  bool with_optimizer = false;
  nlohmann::json extras = nlohmann::json::object();
  const auto ours = checkpoint::list_checkpoints(o.checkpoint.dir);
  if (ours.empty() && checkpoint::is_dcp_dir(o.checkpoint.dir)) {
    // A PyTorch distributed checkpoint (Note [DCP keys]).
    checkpoint::DcpLoadOptions dl;
    if (checkpoint::detect_dcp_layout(o.checkpoint.dir) == checkpoint::DcpLayout::kTorchtitan) dl.names = titan;
    dl.optimizer_if_present = true;
    const checkpoint::DcpLoadResult r = checkpoint::load_dcp(o.checkpoint.dir, *sharded, {&model, &trainer, &opt}, *group, dl);
    with_optimizer = r.optimizer_loaded;
    step = std::max<int64_t>(0, r.optimizer_step);
    if (trainer.loaded().is_object()) {
      step = trainer.loaded().value("step", step);
      extras = trainer.loaded().value("hf_export", extras);
    }
    if (with_optimizer && r.state->is_null()) opt.set_step_count(step);
    source = o.checkpoint.dir;
    say(fmt::format("Loaded the distributed checkpoint {} (step {}, {}{}): {} in {:.2f} s, {:.2f} GB/s", source, step,
                    cfg.summary(), with_optimizer ? ", with optimizer state" : ", weights only",
                    megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  } else {
    checkpoint::LoadOptions lo;
    lo.progress = progress;
    lo.dcp_names = &titan;
    // Its optimizer state too, when the newest checkpoint has one.
    with_optimizer = !ours.empty() && checkpoint::read_checkpoint_state(ours.front().path)->contains("optimizer");
    std::vector<StateOwner*> owners = {&model, &trainer};
    if (with_optimizer) owners.push_back(&opt);
    const checkpoint::LoadResult r = checkpoint::load_latest_checkpoint(o.checkpoint.dir, *sharded, owners, *group, lo);
    for (const auto& why : r.rejected) warn(why + "; trying the previous checkpoint");
    std::vector<std::string> ignored;
    checkpoint::list_checkpoints(o.checkpoint.dir, &ignored);
    for (const auto& i : ignored) warn(fmt::format("{}/{} is not a checkpoint: ignored", o.checkpoint.dir, i));
    FSDP_CHECK(r.loaded, "--checkpoint-dir ", o.checkpoint.dir, " holds no checkpoint to convert");
    const std::string diff = saved_model_mismatch(r.saved(checkpoint::kModelKey), cfg, r.path);
    FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " holds another model than the newest checkpoint's (", diff,
               "); convert it from a directory of its own");
    say(fmt::format("Loaded checkpoint {} (step {}, {}): {} in {:.2f} s, {:.2f} GB/s", r.path, r.step, cfg.summary(),
                    megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
    step = r.step;
    source = r.path;
    if (r.trainer_state->contains("hf_export")) extras = (*r.trainer_state)["hf_export"];
  }
  // The targets.
  if (!o.hf.export_dir.empty()) export_and_report(o, *sharded, cfg, *group, extras, progress, say, warn);
  std::vector<StateOwner*> owners = {&model, &trainer};
  if (with_optimizer) owners.push_back(&opt);
  MetadataState carried(checkpoint::kTrainerKey, trainer.loaded().is_object() ? trainer.loaded()
                                                                                : nlohmann::json{{"step", step}});
  owners[1] = &carried;
  if (!o.checkpoint.export_dcp.empty()) {
    checkpoint::DcpSaveOptions so;
    so.layout = layout;
    so.format = checkpoint::parse_dcp_format(o.checkpoint.dcp_format, "--dcp-format");
    if (layout == checkpoint::DcpLayout::kTorchtitan) so.names = titan;
    const checkpoint::IoStats io = checkpoint::save_dcp(o.checkpoint.export_dcp, *sharded, owners, *group, so);
    if (world->rank() == 0) {  // the model beside the weights: --init-from and convert read it
      write_output_file((std::filesystem::path(o.checkpoint.export_dcp) / "config.json").string(),
                        cfg.to_hf_config_json(), "--export-dcp");
    }
    say(fmt::format("Wrote the distributed checkpoint {} ({} layout, {}{}): {} in {:.2f} s",
                    o.checkpoint.export_dcp, o.checkpoint.dcp_layout, o.checkpoint.dcp_format,
                    with_optimizer ? ", with optimizer state" : ", weights only", megabytes(io.bytes), io.seconds));
  }
  if (!o.checkpoint.export_checkpoint.empty()) {
    const checkpoint::CheckpointDirHold hold = checkpoint::open_checkpoint_dir(o.checkpoint.export_checkpoint, *group);
    const checkpoint::SaveResult r = checkpoint::save_checkpoint(o.checkpoint.export_checkpoint, step, *sharded, owners, *group);
    say(fmt::format("Wrote checkpoint {}{}: {} in {:.2f} s", r.path,
                    with_optimizer ? " (with optimizer state: --resume continues it)" : " (weights only)",
                    megabytes(r.io.bytes), r.io.seconds));
  }
  TrainSummary summary;
  summary.parameters = cfg.num_parameters();
  summary.plan = sharded->describe();
  summary.start_step = step;
  summary.end_step = step;
  summary.resumed_from = source;
  return summary;
}

}  // namespace fsdp::train

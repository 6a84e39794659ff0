// Mode::kConvert: a checkpoint to Hugging Face files (Note [Checkpoint
// conversion] in validate.cpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "fsdp/checkpoint/hf.h"
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

  checkpoint::LoadOptions lo;
  lo.progress = progress;
  const checkpoint::LoadResult r =
      checkpoint::load_latest_checkpoint(o.checkpoint.dir, *sharded, /*optimizer=*/nullptr, *group, lo);
  for (const auto& why : r.rejected) warn(why + "; trying the previous checkpoint");
  std::vector<std::string> ignored;
  checkpoint::list_checkpoints(o.checkpoint.dir, &ignored);
  for (const auto& i : ignored) warn(fmt::format("{}/{} is not a checkpoint: ignored", o.checkpoint.dir, i));
  FSDP_CHECK(r.loaded, "--checkpoint-dir ", o.checkpoint.dir, " holds no checkpoint to convert");
  const std::string diff =
      checkpoint::config_mismatch(cfg, models::parse_hf_config(r.manifest->at("model_config").dump(), r.path));
  FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " holds another model than the newest checkpoint's (", diff,
             "); convert it from a directory of its own");
  say(fmt::format("Loaded checkpoint {} (step {}, {}): {} in {:.2f} s, {:.2f} GB/s", r.path, r.step, cfg.summary(),
                  megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  const nlohmann::json extras =
      r.trainer_state->contains("hf_export") ? (*r.trainer_state)["hf_export"] : nlohmann::json::object();
  export_and_report(o, *sharded, cfg, *group, extras, progress, say, warn);
  TrainSummary summary;
  summary.parameters = cfg.num_parameters();
  summary.plan = sharded->describe();
  summary.start_step = r.step;
  summary.end_step = r.step;
  summary.resumed_from = r.path;
  return summary;
}

}  // namespace fsdp::train

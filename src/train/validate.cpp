// validate_options: the checks that need no process group, so that bad input
// fails once, fast, with exit code 2 (fsdp/train/options.h): the list of each
// part's check (option_checks.cpp), and the conversion's own.
#include <algorithm>
#include <filesystem>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/output_file.h"
#include "train/checks.h"
#include "train/export.h"
#include "train/model_build.h"

namespace fsdp::train {
namespace {

// Whether writing directory `target` would replace `source`: the same
// directory (links and "." resolved), or one holding it.
bool replaces(const std::string& target, const std::string& source) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path t = fs::weakly_canonical(fs::absolute(target, ec), ec);
  const fs::path s = fs::weakly_canonical(fs::absolute(source, ec), ec);
  const fs::path rel = s.lexically_relative(t);
  return !rel.empty() && *rel.begin() != "..";
}

// An export never names its own source (issue 50): a conversion to bf16 into
// its --init-from would replace the input with its rounding, exit 0.
void check_targets_apart(const TrainOptions& o) {
  const std::vector<std::pair<const char*, std::string>> targets = {
      {"HfOptions::export_dir", o.hf.export_dir},
      {"CheckpointOptions::export_dcp", o.checkpoint.export_dcp},
      {"CheckpointOptions::export_checkpoint", o.checkpoint.export_checkpoint}};
  const std::vector<std::pair<const char*, std::string>> sources = {
      {"HfOptions::init_from", o.hf.init_from},
      {"CheckpointOptions::dir", o.checkpoint.dir},
      {"LoraOptions::init_adapter", o.lora.init_adapter}};
  for (const auto& [tflag, target] : targets) {
    if (target.empty()) continue;
    for (const auto& [sflag, source] : sources) {
      FSDP_CHECK(source.empty() || !replaces(target, source), tflag, " ", target, " would replace ", sflag, " ",
                 source, ", which the run reads: an export never overwrites its own source; choose another directory");
    }
  }
}

// Note [Checkpoint conversion]
// Mode::kConvert (fsdp-train convert --checkpoint-dir CK --export-hf OUT; the
// deprecated spelling --max-steps 0 --resume ...): load the newest valid
// checkpoint of CK (its parameters only: no optimizer state, no data, no
// tokenizer) into the model its manifest describes, and export it exactly as
// the run's --export-hf would have (Note [Export extras]). Any world size,
// sharding or wrap: the checkpoint is re-cut on load and the export gathers
// whole units, so the files do not depend on them. The source may instead be
// a Hugging Face directory (convert --init-from HF_DIR): its weights into the
// model its config.json describes, written out as any target (an export that
// reads back as the same model, its tokenizer and generation files carried).
ModelConfigPtr validate_conversion(const TrainOptions& o, int world_size, const ModelConfigPtr* resolved) {
  worker_device(o.device, /*local_rank=*/0);
  const char* what = "converting a checkpoint (Mode::kConvert)";
  const bool any_target =
      !o.hf.export_dir.empty() || !o.checkpoint.export_dcp.empty() || !o.checkpoint.export_checkpoint.empty();
  std::string missing;
  if (o.checkpoint.dir.empty() && o.hf.init_from.empty()) {
    missing = "CheckpointOptions::dir DIR (or HfOptions::init_from HF_DIR)";
  }
  if (!any_target) {
    missing += std::string(missing.empty() ? "" : ", ") +
               "HfOptions::export_dir OUT (or CheckpointOptions::export_dcp OUT, CheckpointOptions::export_checkpoint "
               "OUT)";
  }
  FSDP_CHECK(missing.empty(), what, " needs a source, CheckpointOptions::dir DIR or HfOptions::init_from HF_DIR, and a "
             "target: HfOptions::export_dir OUT, CheckpointOptions::export_dcp OUT or "
             "CheckpointOptions::export_checkpoint OUT (missing: ", missing, ")");
  FSDP_CHECK(o.hf.init_from.empty() || o.checkpoint.dir.empty(), what, " reads one source: CheckpointOptions::dir ",
             o.checkpoint.dir, " or HfOptions::init_from ", o.hf.init_from, " — leave out the other (a checkpoint "
             "carries its run's HfOptions::init_from files over by itself)");
  check_targets_apart(o);
  if (!o.hf.init_from.empty()) {
    checkpoint::find_hf_weights(o.hf.init_from);  // UsageError: no weights there
  } else {
    FSDP_CHECK(std::filesystem::is_directory(o.checkpoint.dir), "CheckpointOptions::dir ", o.checkpoint.dir,
               " is not a directory holding checkpoints");
  }
  if (!o.hf.export_dir.empty()) {
    check_export_target(o.hf, o.lora);
    checkpoint::hf_dtype_name(o.hf.export_dtype);  // float32, bfloat16 or float16, else UsageError
  }
  checkpoint::parse_dcp_layout(o.checkpoint.dcp_layout, "CheckpointOptions::dcp_layout");
  checkpoint::parse_dcp_format(o.checkpoint.dcp_format, "CheckpointOptions::dcp_format");
  if (!o.checkpoint.export_dcp.empty()) {
    checkpoint::check_dcp_target(o.checkpoint.export_dcp, "CheckpointOptions::export_dcp");
  }
  if (!o.checkpoint.export_checkpoint.empty()) {
    checkpoint::check_writable(o.checkpoint.export_checkpoint, "CheckpointOptions::export_checkpoint",
                               /*directory=*/true);
    checkpoint::check_checkpoint_dir(o.checkpoint.export_checkpoint);
  }
  check_engine_options(o, world_size);
  ModelConfigPtr cfg = resolved != nullptr ? *resolved : resolve_model_config(o);
  check(o.lora, {o, world_size, nullptr});
  check(o.lora, {o, world_size, cfg});
  if (!o.checkpoint.export_dcp.empty()) check(o.checkpoint, {o, world_size, cfg});  // its layout's names
  return cfg;
}

}  // namespace

// Note [Global batch across world sizes]
// The sampler gives step s the global samples [s*G, (s+1)*G) (Note [Global
// batch rule]), so a run that keeps G when its world size changes (an elastic
// restart with fewer or more nodes, a resume elsewhere) reads the same rows at
// every step as a run that never changed: only how they are split over ranks
// and micro-steps differs. By default G = B x A x W, and a changed W changes G
// (and the data order from the resumed step on; the resume warns). With
// --global-batch-size G the per-rank micro-batch B stays and the accumulation
// A = G / (B x W) takes up the change, as torchtitan's global_batch_size does;
// the memory per rank stays what it was and a step's arithmetic is the same
// mean over G rows. G must be a multiple of B x W for every world size the job
// may run at (the least common multiple of them, times B).
int64_t grad_accum_at(const StepOptions& st, int world_size) {
  if (st.global_batch_size == 0) return st.grad_accum;
  FSDP_CHECK(st.global_batch_size >= 1, "StepOptions::global_batch_size must be >= 1 (0: StepOptions::batch_size x "
             "StepOptions::grad_accum x ranks), got ", st.global_batch_size);
  FSDP_CHECK(st.batch_size >= 1, "StepOptions::batch_size must be >= 1, got ", st.batch_size);
  const int64_t procs = std::max(world_size, 1);
  const std::optional<int64_t> per_micro_step = checked_product({st.batch_size, procs});
  FSDP_CHECK(per_micro_step && st.global_batch_size % *per_micro_step == 0, "StepOptions::global_batch_size ",
             st.global_batch_size, " is not a multiple of StepOptions::batch_size ", st.batch_size, " x ", procs,
             " rank", procs == 1 ? "" : "s", " (the rows of one micro-step): give a global batch that "
             "StepOptions::batch_size times every world size the job may run at divides, or another "
             "StepOptions::batch_size");
  const int64_t accum = st.global_batch_size / *per_micro_step;
  FSDP_CHECK(st.grad_accum == 1 || st.grad_accum == accum, "StepOptions::grad_accum ", st.grad_accum,
             " and StepOptions::global_batch_size ", st.global_batch_size, " disagree: at ", procs, " rank",
             procs == 1 ? "" : "s", " x StepOptions::batch_size ", st.batch_size, " the global batch takes ", accum,
             " micro-steps; give one or the other");
  return accum;
}

void check_output_file(const std::string& path, const char* flag) {
  check_output_target(path, flag);  // Note [Output targets]: a directory, block device, socket... is refused
  const auto parent = std::filesystem::path(path).parent_path();
  FSDP_CHECK(parent.empty() || std::filesystem::is_directory(parent), flag, " ", path, ": directory ", parent.string(),
             " does not exist");
  FSDP_CHECK(!std::filesystem::is_directory(path), flag, " ", path, " is a directory; give a file name");
  checkpoint::check_writable(path, flag, /*directory=*/false);
}

void validate_options(const TrainOptions& o, int world_size) { (void)validate_options(o, world_size, nullptr); }

TrainOptions at_world_size(TrainOptions options, int world_size) {
  options.step.grad_accum = grad_accum_at(options.step, world_size);
  return options;
}

// The configuration is resolved where the checks come to it (when the caller
// has not resolved it), so that a bad flag is named before the model files
// are read.
ModelConfigPtr validate_options(const TrainOptions& o, int world_size, const ModelConfigPtr* resolved) {
  if (o.mode == Mode::kConvert) {  // Note [Checkpoint conversion]: no data, no training flags
    return validate_conversion(o, world_size, resolved);
  }
  // Note [Checks beside their structs]: each part, first without the model, then with it.
  const auto check_parts = [&](const CheckContext& c) {
    check(o.step, c);
    check(o.data, c);
    check_optimizer(c);
    check(o.checkpoint, c);
    check(o.hf, c);
    check(o.eval, c);
    check(o.lora, c);
    check(o.log, c);
  };
  worker_device(o.device, /*local_rank=*/0);  // a known device, a build that has it, at least one device
  check_engine_options(o, world_size);
  check_parts({o, world_size, nullptr});
  check_targets_apart(o);
  ModelConfigPtr cfg = resolved != nullptr ? *resolved : resolve_model_config(o);
  check_parts({o, world_size, cfg});
  if (!o.freeze.empty()) {  // UsageError: a TrainOptions::freeze that freezes nothing or all
    build_model(o.step, o.lora, o.freeze, o.param_groups, cfg, BuildOptions{});
  }
  return cfg;
}

}  // namespace fsdp::train

// validate_options: the checks that need no process group, so that bad input
// fails once, fast, with exit code 2 (fsdp/train/options.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/output_file.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/lora.h"
#include "fsdp/optim/adamw.h"
#include "train/checks.h"
#include "train/export.h"
#include "train/model_build.h"

namespace fsdp::train {
namespace {

// The --lora-* flags, and their targets (and --freeze) against the model,
// built on the meta device.
void validate_lora(const TrainOptions& o, const ModelConfigPtr& cfg) {
  if (!o.lora.enabled()) {
    for (const auto& [given, flag] : {std::pair<bool, const char*>{o.lora.merge, "--merge-lora"},
                                      {!o.lora.init_adapter.empty(), "--init-adapter"},
                                      {o.lora.alpha != 0, "--lora-alpha"},
                                      {o.lora.dropout != 0, "--lora-dropout"}}) {
      FSDP_CHECK(!given, flag, " needs LoRA: give --lora-rank N (e.g. 8)");
    }
    return;
  }
  FSDP_CHECK(o.lora.rank >= 1, "--lora-rank ", o.lora.rank, " must be >= 1 (e.g. 8 or 16; 0 turns LoRA off)");
  FSDP_CHECK(!o.lora.merge || !o.hf.export_dir.empty(), "--merge-lora merges the adapters into the --export-hf "
             "files; give --export-hf DIR (or leave out --merge-lora)");
  BuildOptions meta;
  meta.freeze = false;  // --freeze is checked with the whole build (validate_options)
  build_model(o.step, o.lora, o.freeze, o.param_groups, cfg, meta);  // UsageError: LoRA values, targets the model lacks
  if (!o.lora.init_adapter.empty()) {
    const models::LoraConfig a = checkpoint::read_peft_adapter_config(o.lora.init_adapter);
    std::vector<std::string> ours = o.lora.targets;
    std::sort(ours.begin(), ours.end());
    FSDP_CHECK(a.rank == o.lora.rank && a.targets == ours, "--init-adapter ", o.lora.init_adapter, " has r ", a.rank,
               " on ", fmt::format("{}", fmt::join(a.targets, ",")), " but the run has --lora-rank ", o.lora.rank,
               " --lora-targets ", fmt::format("{}", fmt::join(o.lora.targets, ",")), "; give the adapter's");
    models::check_adapter_alpha(o.lora.init_adapter, a, o.lora.effective_alpha());  // refused, never rescaled
  }
}

// --dcp-layout torchtitan needs the model family's torchtitan names (a T5 has none).
void check_dcp_names(const CheckpointOptions& ck, const ModelConfig& cfg) {
  FSDP_CHECK(ck.dcp_layout != "torchtitan" || cfg.torchtitan_names().has_value(), "--dcp-layout torchtitan: "
             "model '", cfg.name(), "' (", cfg.family().name(), ") has no torchtitan layout; use --dcp-layout torch");
}

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
      {"--export-hf", o.hf.export_dir},
      {"--export-dcp", o.checkpoint.export_dcp},
      {"--export-checkpoint", o.checkpoint.export_checkpoint}};
  const std::vector<std::pair<const char*, std::string>> sources = {
      {"--init-from", o.hf.init_from}, {"--checkpoint-dir", o.checkpoint.dir}, {"--init-adapter", o.lora.init_adapter}};
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
  worker_device(device_name(o.device), /*local_rank=*/0);
  const char* what = "converting a checkpoint (fsdp-train convert)";
  const bool any_target =
      !o.hf.export_dir.empty() || !o.checkpoint.export_dcp.empty() || !o.checkpoint.export_checkpoint.empty();
  std::string missing;
  if (o.checkpoint.dir.empty() && o.hf.init_from.empty()) missing = "--checkpoint-dir DIR (or --init-from HF_DIR)";
  if (!any_target) missing += std::string(missing.empty() ? "" : ", ") + "--export-hf OUT (or --export-dcp OUT, --export-checkpoint OUT)";
  FSDP_CHECK(missing.empty(), what, " needs a source, --checkpoint-dir DIR or --init-from HF_DIR, and a target: "
             "--export-hf OUT, --export-dcp OUT or --export-checkpoint OUT (missing: ", missing, ")");
  FSDP_CHECK(o.hf.init_from.empty() || o.checkpoint.dir.empty(), what, " reads one source: --checkpoint-dir ",
             o.checkpoint.dir, " or --init-from ", o.hf.init_from, " — leave out the other (a checkpoint carries "
             "its run's --init-from files over by itself)");
  check_targets_apart(o);
  if (!o.hf.init_from.empty()) {
    checkpoint::find_hf_weights(o.hf.init_from);  // UsageError: no weights there
  } else {
    FSDP_CHECK(std::filesystem::is_directory(o.checkpoint.dir), "--checkpoint-dir ", o.checkpoint.dir,
               " is not a directory holding checkpoints");
  }
  if (!o.hf.export_dir.empty()) {
    check_export_target(o.hf, o.lora);
    checkpoint::hf_dtype_name(o.hf.export_dtype);  // float32, bfloat16 or float16, else UsageError
  }
  checkpoint::parse_dcp_layout(o.checkpoint.dcp_layout, "--dcp-layout");
  checkpoint::parse_dcp_format(o.checkpoint.dcp_format, "--dcp-format");
  if (!o.checkpoint.export_dcp.empty()) checkpoint::check_dcp_target(o.checkpoint.export_dcp, "--export-dcp");
  if (!o.checkpoint.export_checkpoint.empty()) {
    checkpoint::check_writable(o.checkpoint.export_checkpoint, "--export-checkpoint", /*directory=*/true);
    checkpoint::check_checkpoint_dir(o.checkpoint.export_checkpoint);
  }
  check_engine_options(o, world_size);
  ModelConfigPtr cfg = resolved != nullptr ? *resolved : resolve_model_config(o);
  validate_lora(o, cfg);
  if (!o.checkpoint.export_dcp.empty()) check_dcp_names(o.checkpoint, *cfg);
  return cfg;
}

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
  FSDP_CHECK(st.global_batch_size >= 1, "--global-batch-size must be >= 1 (0: --batch-size x --grad-accum x ranks), "
             "got ", st.global_batch_size);
  FSDP_CHECK(st.batch_size >= 1, "--batch-size must be >= 1, got ", st.batch_size);
  const int64_t procs = std::max(world_size, 1);
  const std::optional<int64_t> per_micro_step = checked_product({st.batch_size, procs});
  FSDP_CHECK(per_micro_step && st.global_batch_size % *per_micro_step == 0, "--global-batch-size ",
             st.global_batch_size, " is not a multiple of --batch-size ", st.batch_size, " x ", procs, " rank",
             procs == 1 ? "" : "s", " (the rows of one micro-step): give a global batch that --batch-size times every "
             "world size the job may run at divides, or another --batch-size");
  const int64_t accum = st.global_batch_size / *per_micro_step;
  FSDP_CHECK(st.grad_accum == 1 || st.grad_accum == accum, "--grad-accum ", st.grad_accum,
             " and --global-batch-size ", st.global_batch_size, " disagree: at ", procs, " rank",
             procs == 1 ? "" : "s", " x --batch-size ", st.batch_size, " the global batch takes ", accum,
             " micro-steps; give one or the other");
  return accum;
}

// The step numbers and their products.
void validate_steps(const TrainOptions& o, int world_size) {
  FSDP_CHECK(o.step.batch_size >= 1, "--batch-size must be >= 1, got ", o.step.batch_size);
  FSDP_CHECK(o.step.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.step.grad_accum);
  FSDP_CHECK(o.step.stop_at_step >= 0 && o.step.stop_at_step <= o.step.max_steps, "--stop-at-step must be in [0, "
             "--max-steps ", o.step.max_steps, "] (0: train to --max-steps), got ", o.step.stop_at_step);
  FSDP_CHECK(o.step.stop_at_step == 0 || !o.checkpoint.dir.empty(), "--stop-at-step ", o.step.stop_at_step,
             " stops the run to continue it later, which needs its state: give --checkpoint-dir DIR (and --resume "
             "to continue)");
  FSDP_CHECK(o.step.loss_chunk_rows >= 0, "--loss-chunk-rows must be >= 0 (0: chosen from the vocabulary), got ",
             o.step.loss_chunk_rows);
  FSDP_CHECK(o.step.max_steps >= 1, "--max-steps must be >= 1, got ", o.step.max_steps,
             " (to convert a checkpoint without training: fsdp-train convert --checkpoint-dir DIR --export-hf OUT)");
  FSDP_CHECK(o.step.clip_grad >= 0, "--clip-grad must be >= 0 (0 disables clipping), got ", o.step.clip_grad);
  FSDP_CHECK(o.log.log_every >= 1, "--log-every must be >= 1, got ", o.log.log_every);
  FSDP_CHECK(o.data.seq_len >= 1, "--seq-len must be >= 1, got ", o.data.seq_len);
  FSDP_CHECK(o.data.prefetch >= 1, "the loader's prefetch depth must be >= 1, got ", o.data.prefetch);
  // Products of flags must fit in 64 bits before anything is sized or indexed by them
  // (the global batch, the sample index of the last step, a micro-batch's tokens).
  const int64_t procs = std::max(world_size, 1);
  auto fits = [](std::initializer_list<int64_t> factors) { return checked_product(factors).has_value(); };
  StepOptions st = o.step;  // as a run at world_size takes it (--global-batch-size)
  st.grad_accum = grad_accum_at(o.step, world_size);
  FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs}), "the global batch, --batch-size ", st.batch_size,
             " x --grad-accum ", st.grad_accum, " x ", procs, " process", procs == 1 ? "" : "es",
             ", is beyond 64-bit integers — use values whose product is a batch this machine can hold");
  FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs, st.max_steps}), "--max-steps ", st.max_steps,
             " global batches of ", st.batch_size * st.grad_accum * procs, " samples (--batch-size x --grad-accum x ",
             procs, " process", procs == 1 ? "" : "es", ") number samples beyond 64-bit integers — use fewer steps "
             "or a smaller batch");
  FSDP_CHECK(fits({st.batch_size, o.data.seq_len, 2}), "a micro-batch of --batch-size ", st.batch_size,
             " x --seq-len ", o.data.seq_len, " tokens is beyond 64-bit integers — use smaller values");
}

// The learning-rate schedule and AdamW's numbers.
void validate_optimizer(const TrainOptions& o) {
  optim::LrSchedule sched = o.schedule;
  sched.max_steps = o.step.max_steps;
  // The optimizer takes these as 32-bit float scalars: 1e300 is a finite double but no float.
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--lr", o.schedule.lr}, {"--min-lr", o.schedule.min_lr},
                                {"--weight-decay", o.adamw.weight_decay}, {"--beta1", o.adamw.beta1},
                                {"--beta2", o.adamw.beta2}}) {
    FSDP_CHECK(std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(), flag, " ", v,
               " is outside the range of a 32-bit float (|x| <= 3.4e38), which the optimizer computes in");
  }
  optim::check_lr_range(o.schedule.lr, o.schedule.min_lr, o.adamw, o.param_groups);  // x --lr-scale, / (1 - beta1)
  (void)optim::param_rule(o.param_groups);  // each lr_scales pattern compiles
  sched.validate();
  FSDP_CHECK(o.adamw.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.adamw.weight_decay);
  FSDP_CHECK(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1, "--beta1 must be in [0, 1), got ", o.adamw.beta1,
             " (PyTorch's default is 0.9)");
  FSDP_CHECK(o.adamw.beta2 >= 0 && o.adamw.beta2 < 1, "--beta2 must be in [0, 1), got ", o.adamw.beta2,
             " (PyTorch's default is 0.999; Llama used 0.95)");
}

// --checkpoint-dir, --checkpoint-every, --keep-last, --resume.
void validate_checkpoints(const CheckpointOptions& ck) {
  FSDP_CHECK(ck.format == "sharded" || ck.format == "dcp", "--checkpoint-format '", ck.format,
             "': expected sharded or dcp");
  checkpoint::parse_dcp_layout(ck.dcp_layout, "--dcp-layout");
  checkpoint::parse_dcp_format(ck.dcp_format, "--dcp-format");
  FSDP_CHECK(ck.every >= 0, "--checkpoint-every must be >= 0 (0: only at the end), got ", ck.every);
  FSDP_CHECK(ck.keep_last >= 0, "--keep-last must be >= 0 (0: keep all), got ", ck.keep_last);
  // A flag that would do nothing is refused, never ignored in silence (issue 50).
  for (const auto& [given, flag] : {std::pair<bool, const char*>{!ck.export_dcp.empty(), "--export-dcp"},
                                    {!ck.export_checkpoint.empty(), "--export-checkpoint"}}) {
    FSDP_CHECK(!given, flag, " is the target of a conversion: use it with 'fsdp-train convert --checkpoint-dir DIR' "
               "(a training run saves into --checkpoint-dir, and --export-hf exports at its end)");
  }
  const bool dcp_out = ck.format == "dcp";
  FSDP_CHECK(dcp_out || (ck.dcp_layout == "torch" && ck.dcp_format == "torch_save"),
             "--dcp-layout ", ck.dcp_layout, " / --dcp-format ", ck.dcp_format,
             " shape a distributed checkpoint, and this run writes none: add --checkpoint-format dcp (with "
             "--checkpoint-dir DIR), or leave them out");
  if (ck.dir.empty()) {
    FSDP_CHECK(!ck.resume, "--resume needs --checkpoint-dir DIR (the directory checkpoints are saved to "
               "and resumed from)");
    FSDP_CHECK(ck.every == 0, "--checkpoint-every needs --checkpoint-dir DIR");
    FSDP_CHECK(ck.keep_last == 0, "--keep-last needs --checkpoint-dir DIR");
    FSDP_CHECK(!ck.async, "--async-checkpoint needs --checkpoint-dir DIR (it saves checkpoints there in "
               "the background)");
    FSDP_CHECK(!dcp_out, "--checkpoint-format dcp needs --checkpoint-dir DIR (the format of the checkpoints saved "
               "there)");
    return;
  }
  std::error_code ec;
  FSDP_CHECK(!std::filesystem::exists(ck.dir, ec) || std::filesystem::is_directory(ck.dir, ec),
             "--checkpoint-dir ", ck.dir, " exists and is not a directory");
  checkpoint::check_writable(ck.dir, "--checkpoint-dir", /*directory=*/true);
  checkpoint::check_checkpoint_dir(ck.dir);  // Note [Ownership of what we delete]
  // A new run would overwrite (and --keep-last delete) another run's checkpoints.
  const auto existing = checkpoint::list_checkpoints(ck.dir);
  FSDP_CHECK(ck.resume || existing.empty(), "--checkpoint-dir ", ck.dir, " already holds ",
             existing.size(), " checkpoint", existing.size() == 1 ? "" : "s", " (newest ",
             existing.empty() ? "" : std::filesystem::path(existing.front().path).filename().string(),
             "); add --resume to continue from it, or choose another directory");
}

// Whether two paths name one file: the same inode when both exist, else the
// same path once "." and ".." are resolved.
// A device (/dev/null twice) takes any number of writers.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) {
    if (!std::filesystem::is_regular_file(a, ec)) return false;
    const bool same = std::filesystem::equivalent(a, b, ec);
    if (!ec) return same;
  }
  return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

// What rank 0 records: --metrics-file, --tensorboard, --profile-steps, --metrics-port.
void validate_records(const TrainOptions& o) {
  if (!o.log.metrics_file.empty()) check_output_file(o.log.metrics_file, "--metrics-file");
  if (!o.log.tensorboard_dir.empty()) {
    checkpoint::check_writable(o.log.tensorboard_dir, "--tensorboard", /*directory=*/true);
  }
  if (o.log.profile_end > o.log.profile_begin) {
    FSDP_CHECK(o.log.profile_begin >= 0, "--profile-steps ", o.log.profile_begin, ":", o.log.profile_end,
               " starts before step 0; steps are numbered from 0 as in the log's 'Batch N'");
    FSDP_CHECK(o.mode != Mode::kTrain || o.log.profile_begin < o.step.max_steps, "--profile-steps ",
               o.log.profile_begin, ":", o.log.profile_end, " starts at or after --max-steps ", o.step.max_steps,
               ", so nothing would be traced; choose steps below ", o.step.max_steps);
    FSDP_CHECK(!o.log.profile_file.empty(), "--profile-file is empty; give the trace's file name");
    check_output_file(o.log.profile_file, "--profile-file");
  }
  // Two records into one file lose one of them (the trace's rename replaces the
  // metrics; issue 39), and none may go into the file the options came from.
  std::vector<std::pair<const char*, std::string>> outputs;
  if (!o.log.metrics_file.empty()) outputs.emplace_back("--metrics-file", o.log.metrics_file);
  if (o.log.profile_end > o.log.profile_begin) outputs.emplace_back("--profile-file", o.log.profile_file);
  if (!o.log.config_file.empty()) outputs.emplace_back("--config", o.log.config_file);
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      FSDP_CHECK(!same_file(outputs[i].second, outputs[j].second), outputs[i].first, " ", outputs[i].second, " and ",
                 outputs[j].first, " ", outputs[j].second, " are the same file; give each its own");
    }
  }
  FSDP_CHECK(o.log.metrics_port >= -1 && o.log.metrics_port <= 65535, "--metrics-port ", o.log.metrics_port,
             " is not a TCP port; give one in [1, 65535] (or 0 for any free port)");
  FSDP_CHECK(!o.log.metrics_every_rank || o.log.metrics_port >= 0,
             "--metrics-every-rank needs --metrics-port PORT (rank r serves on PORT + its local rank)");
}

}  // namespace

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
  worker_device(device_name(o.device), /*local_rank=*/0);  // a known --device, a build that has it, at least one device
  validate_steps(o, world_size);
  FSDP_CHECK(!o.data.path.empty(), "--data is required: a text file, a JSON-lines file, a binary token file or a "
             "directory of .bin shards");
  // A file, a directory or a pattern (c4/en/c4-train.*.json.gz); data_files names what is missing.
  FSDP_CHECK(!data::data_files({o.data.path, o.data.format}).empty(), "--data ", o.data.path, ": no data files");
  data::tokenizer_file(o.data.tokenizer);  // exists, a regular file (not /dev/zero or a FIFO), not empty
  validate_optimizer(o);
  check_engine_options(o, world_size);
  FSDP_CHECK(std::isfinite(o.step.initial_loss_scale) && o.step.initial_loss_scale > 0,
             "--initial-loss-scale must be a finite number > 0 (e.g. 65536), got ", o.step.initial_loss_scale);
  FSDP_CHECK(o.fsdp.hybrid_shard_size >= 0, "--hybrid-shard-size must be >= 1 (or 0 for LOCAL_WORLD_SIZE), got ",
             o.fsdp.hybrid_shard_size);
  validate_checkpoints(o.checkpoint);
  if (!o.hf.init_from.empty() && checkpoint::is_dcp_dir(o.hf.init_from)) {
    // A PyTorch distributed checkpoint: its weights; the model is --model (or a config.json beside them).
    FSDP_CHECK(o.model != o.hf.init_from || std::filesystem::exists(std::filesystem::path(o.hf.init_from) / "config.json"),
               "--init-from ", o.hf.init_from, " is a PyTorch distributed checkpoint without config.json: name its "
               "model with --model (a preset, a config.json or a Hugging Face directory)");
  } else if (!o.hf.init_from.empty()) {
    checkpoint::find_hf_weights(o.hf.init_from);
    FSDP_CHECK(std::filesystem::exists(std::filesystem::path(o.hf.init_from) / "config.json"), "--init-from ",
               o.hf.init_from, " has no config.json (a Hugging Face model directory has config.json and "
               "*.safetensors)");
  }
  if (!o.hf.export_dir.empty()) {
    check_export_target(o.hf, o.lora);
    checkpoint::hf_dtype_name(o.hf.export_dtype);  // float32, bfloat16 or float16, else UsageError
  }
  check_targets_apart(o);
  FSDP_CHECK(o.eval.every >= 0, "--eval-every must be >= 0 (0: no periodic evaluation), got ", o.eval.every);
  FSDP_CHECK(o.eval.max_windows >= 0, "--eval-windows must be >= 0 (0: all), got ", o.eval.max_windows);
  const bool eval_only = o.mode == Mode::kEvaluate;
  if (o.eval.val_data.empty()) {
    FSDP_CHECK(o.eval.every == 0, "--eval-every needs --val-data PATH");
    FSDP_CHECK(!eval_only, "--eval-only needs --val-data PATH");
  } else {
    FSDP_CHECK(!data::data_files({o.eval.val_data, o.data.format}).empty(), "--val-data ", o.eval.val_data,
               ": no data files");
  }
  FSDP_CHECK(!eval_only || !o.hf.init_from.empty() || o.checkpoint.resume,
             "--eval-only evaluates existing weights: give --init-from DIR or --resume with --checkpoint-dir DIR");
  ModelConfigPtr cfg = resolved != nullptr ? *resolved : resolve_model_config(o);
  validate_lora(o, cfg);
  if (!o.freeze.empty()) {  // UsageError: a --freeze that freezes nothing or all
    build_model(o.step, o.lora, o.freeze, o.param_groups, cfg, BuildOptions{});
  }
  const std::optional<int64_t> longest = cfg->max_seq_len();
  FSDP_CHECK(!longest || o.data.seq_len <= *longest, "--seq-len ", o.data.seq_len, " is longer than model '",
             cfg->name(), "' supports (max_position_embeddings = ", longest.value_or(0), "); use --seq-len <= ",
             longest.value_or(0));
  FSDP_CHECK(o.data.target_len >= 0, "--target-len must be >= 0 (0: --seq-len), got ", o.data.target_len);
  if (cfg->data_kind() == DataKind::kPairs) {
    FSDP_CHECK(o.data.format == data::DataFormat::kAuto || o.data.format == data::DataFormat::kJsonl, "model '",
               cfg->name(), "' (", cfg->family().name(), ", an encoder-decoder) trains on (input, target) pairs from "
               "JSON lines; --data-format ", data::to_string(o.data.format), " cannot hold them");
    FSDP_CHECK(o.data.seq_len >= 2 && (o.data.target_len == 0 || o.data.target_len >= 2), "model '", cfg->name(),
               "' reads pairs of at least 2 tokens each (a token and EOS): --seq-len ", o.data.seq_len,
               ", --target-len ", o.data.target_len);
    FSDP_CHECK(checked_product({o.step.batch_size, o.data.target_len, 2}).has_value(), "a micro-batch of --batch-size ",
               o.step.batch_size, " x --target-len ", o.data.target_len, " tokens is beyond 64-bit integers — use "
               "smaller values");
  } else {
    FSDP_CHECK(o.data.target_len == 0, "--target-len is the decoder's width of an encoder-decoder model (t5); model '",
               cfg->name(), "' reads windows of --seq-len tokens");
  }
  check_dcp_names(o.checkpoint, *cfg);
  validate_records(o);
  return cfg;
}

}  // namespace fsdp::train

// Each part of the options checks itself (Note [Checks beside their
// structs], fsdp/train/options.h): the values, the files they name, and with
// the model what depends on it. Messages name the fields (StepOptions::
// batch_size), the value and the fix; the programs say their flags instead.
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
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/lora.h"
#include "fsdp/optim/adamw.h"
#include "train/checks.h"
#include "train/export.h"
#include "train/model_build.h"

namespace fsdp::train {
namespace {

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

// The encoder-decoder's pairs and the decoder's width, against the model.
void check_widths(const DataOptions& o, const CheckContext& c) {
  const ModelConfig& cfg = *c.model;
  const std::optional<int64_t> longest = cfg.max_seq_len();
  FSDP_CHECK(!longest || o.seq_len <= *longest, "DataOptions::seq_len ", o.seq_len, " is longer than model '",
             cfg.name(), "' supports (max_position_embeddings = ", longest.value_or(0),
             "); use DataOptions::seq_len <= ", longest.value_or(0));
  if (cfg.data_kind() == DataKind::kPairs) {
    FSDP_CHECK(o.format == data::DataFormat::kAuto || o.format == data::DataFormat::kJsonl, "model '", cfg.name(),
               "' (", cfg.family().name(), ", an encoder-decoder) trains on (input, target) pairs from JSON lines; "
               "DataOptions::format ", data::to_string(o.format), " cannot hold them");
    FSDP_CHECK(o.seq_len >= 2 && (o.target_len == 0 || o.target_len >= 2), "model '", cfg.name(),
               "' reads pairs of at least 2 tokens each (a token and EOS): DataOptions::seq_len ", o.seq_len,
               ", DataOptions::target_len ", o.target_len);
    const int64_t batch = c.run.step.batch_size;
    FSDP_CHECK(checked_product({batch, o.target_len, 2}).has_value(), "a micro-batch of StepOptions::batch_size ",
               batch, " x DataOptions::target_len ", o.target_len,
               " tokens is beyond 64-bit integers — use smaller values");
  } else {
    FSDP_CHECK(o.target_len == 0, "DataOptions::target_len is the decoder's width of an encoder-decoder model (t5); "
               "model '", cfg.name(), "' reads windows of DataOptions::seq_len tokens");
  }
}

}  // namespace

void check(const DataOptions& o, const CheckContext& c) {
  if (c.model != nullptr) return check_widths(o, c);
  FSDP_CHECK(o.seq_len >= 1, "DataOptions::seq_len must be >= 1, got ", o.seq_len);
  FSDP_CHECK(o.prefetch >= 1, "DataOptions::prefetch (the loader's depth) must be >= 1, got ", o.prefetch);
  FSDP_CHECK(o.target_len >= 0, "DataOptions::target_len must be >= 0 (0: DataOptions::seq_len), got ", o.target_len);
  FSDP_CHECK(!o.path.empty(), "DataOptions::path is required: a text file, a JSON-lines file, a binary token file or "
             "a directory of .bin shards");
  // A file, a directory or a pattern (c4/en/c4-train.*.json.gz); data_files names what is missing.
  FSDP_CHECK(!data::data_files({o.path, o.format}).empty(), "DataOptions::path ", o.path, ": no data files");
  data::tokenizer_file(o.tokenizer);  // exists, a regular file (not /dev/zero or a FIFO), not empty
}

void check(const StepOptions& o, const CheckContext& c) {
  if (c.model != nullptr) return;
  FSDP_CHECK(o.batch_size >= 1, "StepOptions::batch_size must be >= 1, got ", o.batch_size);
  FSDP_CHECK(o.grad_accum >= 1, "StepOptions::grad_accum must be >= 1, got ", o.grad_accum);
  FSDP_CHECK(o.stop_at_step >= 0 && o.stop_at_step <= o.max_steps, "StepOptions::stop_at_step must be in [0, "
             "StepOptions::max_steps ", o.max_steps, "] (0: train to StepOptions::max_steps), got ", o.stop_at_step);
  FSDP_CHECK(o.stop_at_step == 0 || !c.run.checkpoint.dir.empty(), "StepOptions::stop_at_step ", o.stop_at_step,
             " stops the run to continue it later, which needs its state: give CheckpointOptions::dir DIR (and "
             "CheckpointOptions::resume to continue)");
  FSDP_CHECK(o.loss_chunk_rows >= 0, "StepOptions::loss_chunk_rows must be >= 0 (0: chosen from the vocabulary), "
             "got ", o.loss_chunk_rows);
  FSDP_CHECK(o.max_steps >= 1, "StepOptions::max_steps must be >= 1, got ", o.max_steps, " (to convert a checkpoint "
             "without training: Mode::kConvert with CheckpointOptions::dir DIR HfOptions::export_dir OUT)");
  FSDP_CHECK(o.clip_grad >= 0, "StepOptions::clip_grad must be >= 0 (0 disables clipping), got ", o.clip_grad);
  FSDP_CHECK(std::isfinite(o.initial_loss_scale) && o.initial_loss_scale > 0,
             "StepOptions::initial_loss_scale must be a finite number > 0 (e.g. 65536), got ", o.initial_loss_scale);
  // Products of flags must fit in 64 bits before anything is sized or indexed by them
  // (the global batch, the sample index of the last step, a micro-batch's tokens).
  const int64_t procs = std::max(c.world_size, 1);
  auto fits = [](std::initializer_list<int64_t> factors) { return checked_product(factors).has_value(); };
  StepOptions st = o;  // as a run at world_size takes it (StepOptions::global_batch_size)
  st.grad_accum = grad_accum_at(o, c.world_size);
  const char* es = procs == 1 ? "" : "es";
  FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs}), "the global batch, StepOptions::batch_size ", st.batch_size,
             " x StepOptions::grad_accum ", st.grad_accum, " x ", procs, " process", es,
             ", is beyond 64-bit integers — use values whose product is a batch this machine can hold");
  FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs, st.max_steps}), "StepOptions::max_steps ", st.max_steps,
             " global batches of ", st.batch_size * st.grad_accum * procs, " samples (StepOptions::batch_size x "
             "StepOptions::grad_accum x ", procs, " process", es, ") number samples beyond 64-bit integers — use "
             "fewer steps or a smaller batch");
  const int64_t seq_len = c.run.data.seq_len;
  FSDP_CHECK(fits({st.batch_size, seq_len, 2}), "a micro-batch of StepOptions::batch_size ", st.batch_size,
             " x DataOptions::seq_len ", seq_len, " tokens is beyond 64-bit integers — use smaller values");
}

void check_optimizer(const CheckContext& c) {
  if (c.model != nullptr) return;
  const TrainOptions& o = c.run;
  optim::LrSchedule sched = o.schedule;
  sched.max_steps = o.step.max_steps;
  // The optimizer takes these as 32-bit float scalars: 1e300 is a finite double but no float.
  for (const auto& [field, v] : {std::pair<const char*, double>{"LrSchedule::lr", o.schedule.lr},
                                 {"LrSchedule::min_lr", o.schedule.min_lr},
                                 {"AdamWOptions::weight_decay", o.adamw.weight_decay},
                                 {"AdamWOptions::beta1", o.adamw.beta1},
                                 {"AdamWOptions::beta2", o.adamw.beta2}}) {
    FSDP_CHECK(std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(), field, " ", v,
               " is outside the range of a 32-bit float (|x| <= 3.4e38), which the optimizer computes in");
  }
  optim::check_lr_range(o.schedule.lr, o.schedule.min_lr, o.adamw, o.param_groups);  // x lr_scales, / (1 - beta1)
  (void)optim::param_rule(o.param_groups);  // each lr_scales pattern compiles
  sched.validate();
  FSDP_CHECK(o.adamw.weight_decay >= 0, "AdamWOptions::weight_decay must be >= 0, got ", o.adamw.weight_decay);
  FSDP_CHECK(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1, "AdamWOptions::beta1 must be in [0, 1), got ", o.adamw.beta1,
             " (PyTorch's default is 0.9)");
  FSDP_CHECK(o.adamw.beta2 >= 0 && o.adamw.beta2 < 1, "AdamWOptions::beta2 must be in [0, 1), got ", o.adamw.beta2,
             " (PyTorch's default is 0.999; Llama used 0.95)");
}

void check(const LogOptions& o, const CheckContext& c) {
  if (c.model != nullptr) return;
  FSDP_CHECK(o.log_every >= 1, "LogOptions::log_every must be >= 1, got ", o.log_every);
  if (!o.metrics_file.empty()) check_output_file(o.metrics_file, "LogOptions::metrics_file");
  if (!o.tensorboard_dir.empty()) {
    checkpoint::check_writable(o.tensorboard_dir, "LogOptions::tensorboard_dir", /*directory=*/true);
  }
  const bool traced = o.profile_end > o.profile_begin;
  if (traced) {
    const int64_t max_steps = c.run.step.max_steps;
    FSDP_CHECK(o.profile_begin >= 0, "LogOptions::profile_begin:profile_end ", o.profile_begin, ":", o.profile_end,
               " starts before step 0; steps are numbered from 0 as in the log's 'Batch N'");
    FSDP_CHECK(c.run.mode != Mode::kTrain || o.profile_begin < max_steps, "LogOptions::profile_begin:profile_end ",
               o.profile_begin, ":", o.profile_end, " starts at or after StepOptions::max_steps ", max_steps,
               ", so nothing would be traced; choose steps below ", max_steps);
    FSDP_CHECK(!o.profile_file.empty(), "LogOptions::profile_file is empty; give the trace's file name");
    check_output_file(o.profile_file, "LogOptions::profile_file");
  }
  // Two records into one file lose one of them (the trace's rename replaces the
  // metrics; issue 39), and none may go into the file the options came from.
  std::vector<std::pair<const char*, std::string>> outputs;
  if (!o.metrics_file.empty()) outputs.emplace_back("LogOptions::metrics_file", o.metrics_file);
  if (traced) outputs.emplace_back("LogOptions::profile_file", o.profile_file);
  if (!o.config_file.empty()) outputs.emplace_back("LogOptions::config_file", o.config_file);
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      FSDP_CHECK(!same_file(outputs[i].second, outputs[j].second), outputs[i].first, " ", outputs[i].second, " and ",
                 outputs[j].first, " ", outputs[j].second, " are the same file; give each its own");
    }
  }
  FSDP_CHECK(o.metrics_port >= -1 && o.metrics_port <= 65535, "LogOptions::metrics_port ", o.metrics_port,
             " is not a TCP port; give one in [1, 65535] (or 0 for any free port)");
  FSDP_CHECK(!o.metrics_every_rank || o.metrics_port >= 0, "LogOptions::metrics_every_rank needs "
             "LogOptions::metrics_port PORT (rank r serves on PORT + its local rank)");
}

void check(const CheckpointOptions& o, const CheckContext& c) {
  if (c.model != nullptr) {  // the torchtitan layout needs the model family's names (a T5 has none)
    FSDP_CHECK(o.dcp_layout != "torchtitan" || c.model->torchtitan_names().has_value(),
               "CheckpointOptions::dcp_layout torchtitan: model '", c.model->name(), "' (", c.model->family().name(),
               ") has no torchtitan layout; use CheckpointOptions::dcp_layout torch");
    return;
  }
  FSDP_CHECK(o.format == "sharded" || o.format == "dcp", "CheckpointOptions::format '", o.format,
             "': expected sharded or dcp");
  checkpoint::parse_dcp_layout(o.dcp_layout, "CheckpointOptions::dcp_layout");
  checkpoint::parse_dcp_format(o.dcp_format, "CheckpointOptions::dcp_format");
  FSDP_CHECK(o.every >= 0, "CheckpointOptions::every must be >= 0 (0: only at the end), got ", o.every);
  FSDP_CHECK(o.keep_last >= 0, "CheckpointOptions::keep_last must be >= 0 (0: keep all), got ", o.keep_last);
  // A flag that would do nothing is refused, never ignored in silence (issue 50).
  for (const auto& [given, field] :
       {std::pair<bool, const char*>{!o.export_dcp.empty(), "CheckpointOptions::export_dcp"},
        {!o.export_checkpoint.empty(), "CheckpointOptions::export_checkpoint"}}) {
    FSDP_CHECK(!given, field, " is the target of a conversion: use it with Mode::kConvert and CheckpointOptions::dir "
               "DIR (a training run saves into CheckpointOptions::dir, and HfOptions::export_dir exports at its end)");
  }
  const bool dcp_out = o.format == "dcp";
  FSDP_CHECK(dcp_out || (o.dcp_layout == "torch" && o.dcp_format == "torch_save"),
             "CheckpointOptions::dcp_layout ", o.dcp_layout, " / CheckpointOptions::dcp_format ", o.dcp_format,
             " shape a distributed checkpoint, and this run writes none: add CheckpointOptions::format dcp (with "
             "CheckpointOptions::dir DIR), or leave them out");
  if (o.dir.empty()) {
    FSDP_CHECK(!o.resume, "CheckpointOptions::resume needs CheckpointOptions::dir DIR (the directory checkpoints are "
               "saved to and resumed from)");
    FSDP_CHECK(o.every == 0, "CheckpointOptions::every needs CheckpointOptions::dir DIR");
    FSDP_CHECK(o.keep_last == 0, "CheckpointOptions::keep_last needs CheckpointOptions::dir DIR");
    FSDP_CHECK(!o.async, "CheckpointOptions::async needs CheckpointOptions::dir DIR (it saves checkpoints there in "
               "the background)");
    FSDP_CHECK(!dcp_out, "CheckpointOptions::format dcp needs CheckpointOptions::dir DIR (the format of the "
               "checkpoints saved there)");
    return;
  }
  std::error_code ec;
  FSDP_CHECK(!std::filesystem::exists(o.dir, ec) || std::filesystem::is_directory(o.dir, ec),
             "CheckpointOptions::dir ", o.dir, " exists and is not a directory");
  checkpoint::check_writable(o.dir, "CheckpointOptions::dir", /*directory=*/true);
  checkpoint::check_checkpoint_dir(o.dir);  // Note [Ownership of what we delete]
  // A new run would overwrite (and keep_last delete) another run's checkpoints.
  const auto existing = checkpoint::list_checkpoints(o.dir);
  FSDP_CHECK(o.resume || existing.empty(), "CheckpointOptions::dir ", o.dir, " already holds ", existing.size(),
             " checkpoint", existing.size() == 1 ? "" : "s", " (newest ",
             existing.empty() ? "" : std::filesystem::path(existing.front().path).filename().string(),
             "); add CheckpointOptions::resume to continue from it, or choose another directory");
}

void check(const HfOptions& o, const CheckContext& c) {
  if (c.model != nullptr) return;
  if (!o.init_from.empty() && checkpoint::is_dcp_dir(o.init_from)) {
    // A PyTorch distributed checkpoint: its weights; the model is TrainOptions::model (or a config.json beside them).
    FSDP_CHECK(c.run.model != o.init_from || std::filesystem::exists(std::filesystem::path(o.init_from) / "config.json"),
               "HfOptions::init_from ", o.init_from, " is a PyTorch distributed checkpoint without config.json: name "
               "its model with TrainOptions::model (a preset, a config.json or a Hugging Face directory)");
  } else if (!o.init_from.empty()) {
    checkpoint::find_hf_weights(o.init_from);  // UsageError: no weights there
    FSDP_CHECK(std::filesystem::exists(std::filesystem::path(o.init_from) / "config.json"), "HfOptions::init_from ", o.init_from, " has no config.json (a Hugging Face model directory has "
               "config.json and *.safetensors)");
  }
  if (!o.export_dir.empty()) {
    check_export_target(o, c.run.lora);
    checkpoint::hf_dtype_name(o.export_dtype);  // float32, bfloat16 or float16, else UsageError
  }
}

void check(const LoraOptions& o, const CheckContext& c) {
  if (c.model == nullptr) {
    if (!o.enabled()) {
      for (const auto& [given, field] : {std::pair<bool, const char*>{o.merge, "LoraOptions::merge"},
                                         {!o.init_adapter.empty(), "LoraOptions::init_adapter"},
                                         {o.alpha != 0, "LoraOptions::alpha"},
                                         {o.dropout != 0, "LoraOptions::dropout"}}) {
        FSDP_CHECK(!given, field, " needs LoRA: give LoraOptions::rank N (e.g. 8)");
      }
      return;
    }
    FSDP_CHECK(o.rank >= 1, "LoraOptions::rank ", o.rank, " must be >= 1 (e.g. 8 or 16; 0 turns LoRA off)");
    FSDP_CHECK(!o.merge || !c.run.hf.export_dir.empty(), "LoraOptions::merge merges the adapters into the "
               "HfOptions::export_dir files; give HfOptions::export_dir DIR (or leave out LoraOptions::merge)");
    return;
  }
  if (!o.enabled()) return;
  // The adapters on the model, built on the meta device: UsageError for values and targets the model lacks.
  BuildOptions meta;
  meta.freeze = false;  // TrainOptions::freeze is checked with the whole build (validate_options)
  build_model(c.run.step, o, c.run.freeze, c.run.param_groups, c.model, meta);
  if (o.init_adapter.empty()) return;
  const models::LoraConfig a = checkpoint::read_peft_adapter_config(o.init_adapter);
  std::vector<std::string> ours = o.targets;
  std::sort(ours.begin(), ours.end());
  FSDP_CHECK(a.rank == o.rank && a.targets == ours, "LoraOptions::init_adapter ", o.init_adapter, " has r ", a.rank,
             " on ", fmt::format("{}", fmt::join(a.targets, ",")), " but the run has LoraOptions::rank ", o.rank,
             " LoraOptions::targets ", fmt::format("{}", fmt::join(o.targets, ",")), "; give the adapter's");
  models::check_adapter_alpha(o.init_adapter, a, o.effective_alpha());  // refused, never rescaled
}

void check(const EvalOptions& o, const CheckContext& c) {
  if (c.model != nullptr) return;
  FSDP_CHECK(o.every >= 0, "EvalOptions::every must be >= 0 (0: no periodic evaluation), got ", o.every);
  FSDP_CHECK(o.max_windows >= 0, "EvalOptions::max_windows must be >= 0 (0: all), got ", o.max_windows);
  const bool eval_only = c.run.mode == Mode::kEvaluate;
  if (o.val_data.empty()) {
    FSDP_CHECK(o.every == 0, "EvalOptions::every needs EvalOptions::val_data PATH");
    FSDP_CHECK(!eval_only, "Mode::kEvaluate needs EvalOptions::val_data PATH");
  } else {
    FSDP_CHECK(!data::data_files({o.val_data, c.run.data.format}).empty(), "EvalOptions::val_data ", o.val_data,
               ": no data files");
  }
  FSDP_CHECK(!eval_only || !c.run.hf.init_from.empty() || c.run.checkpoint.resume, "Mode::kEvaluate evaluates "
             "existing weights: give HfOptions::init_from DIR or CheckpointOptions::resume with CheckpointOptions::dir "
             "DIR");
}

}  // namespace fsdp::train

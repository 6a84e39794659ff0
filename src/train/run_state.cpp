#include "train/run_state.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/common/error.h"
#include "fsdp/common/files.h"
#include "fsdp/common/json_input.h"
#include "fsdp/common/output_file.h"
#include "fsdp/common/state.h"
#include "fsdp/models/registry.h"
#include "train/export.h"
#include "train/model_build.h"

namespace fsdp::train {

nlohmann::json trainer_state(const DataOptions& data, const StepOptions& step, const RunState& s) {
  const optim::LrSchedule& sched = *s.schedule;
  nlohmann::json ts{{"step", s.completed},
                    {"samples_seen", s.completed * s.global_batch},
                    {"epochs", s.epochs},
                    {"seed", step.seed},
                    {"global_batch_size", s.global_batch},
                    {"batch_size", step.batch_size},
                    {"grad_accum", step.grad_accum},
                    {"world_size", s.world_size},
                    {"seq_len", data.seq_len},
                    {"shuffle", data.shuffle},
                    {"data", data.path},
                    {"tokenizer", data.tokenizer},
                    {"schedule",
                     {{"lr", sched.lr},
                      {"min_lr", sched.min_lr},
                      {"warmup_steps", sched.warmup_steps},
                      {"max_steps", sched.max_steps}}},
                    // Training draws no random numbers: parameters are initialized from (seed, name)
                    // and the data order is a pure function of (seed, step), so seed and step are the
                    // whole RNG state.
                    {"rng", "none consumed: seed and step determine initialization and data order"},
                    {"hf_export", *s.hf_extras}};
  if (s.scaler != nullptr) {
    ts["grad_scaler"] = {{"scale", s.scaler->scale_value()},
                         {"growth_tracker", s.scaler->growth_tracker()},
                         {"skipped_steps", s.scaler->skipped_steps()}};
  }
  return ts;
}

void check_trainer_state(const nlohmann::json& saved) {
  if (saved.is_null()) return;  // a checkpoint without one (PyTorch's, or weights only)
  auto bad = [](const auto&... why) { throw MalformedState(detail::cat(why...)); };
  auto count = [](const nlohmann::json& v) {
    return v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
  };
  if (!saved.is_object()) bad("the trainer's state is ", saved.dump(), ", not an object");
  if (saved.contains("step") && !count(saved["step"])) {
    bad("the trainer's step ", saved["step"].dump(), " is not a count of steps");
  }
  if (saved.contains("grad_scaler")) {
    const nlohmann::json& g = saved["grad_scaler"];
    const bool ok = g.is_object() && g.contains("scale") && g["scale"].is_number() &&
                    std::isfinite(g["scale"].get<double>()) && g["scale"].get<double>() > 0 &&
                    g.contains("growth_tracker") && count(g["growth_tracker"]);
    if (!ok) bad("the loss scaler's state ", g.dump(), " is not {\"scale\": a number > 0, \"growth_tracker\": a count}");
  }
  if (saved.contains("hf_export")) check_export_record(saved["hf_export"]);
}

int64_t resume_from(const DataOptions& data, const StepOptions& step, const checkpoint::LoadResult& r,
                    const ModelConfig& cfg, int64_t global_batch, optim::ShardedGradScaler* scaler,
                    const LogLine& say, const LogLine& warn) {
  const std::string diff = saved_model_mismatch(r.saved(checkpoint::kModelKey), cfg, r.path);
  FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " was saved from another model (", diff,
             "); resume with the model it was saved with or use another CheckpointOptions::dir");
  const nlohmann::json& ts = *r.trainer_state;
  const int64_t start = ts.contains("step") ? ts["step"].get<int64_t>() : r.step;  // checked on load
  if (scaler != nullptr && ts.contains("grad_scaler")) {
    scaler->set_state(ts["grad_scaler"].at("scale").get<double>(),
                      ts["grad_scaler"].at("growth_tracker").get<int64_t>());
  }
  say(fmt::format("Resumed from {} (step {}): {} in {:.2f} s, {:.2f} GB/s", r.path, start, megabytes(r.io.bytes),
                  r.io.seconds, r.io.gb_per_s()));
  auto differs = [&](const char* key, const nlohmann::json& now, const char* flag) {
    if (ts.contains(key) && ts[key] != now) {
      warn(fmt::format("the checkpoint was saved with {} {} (now {}): the data order from step {} on differs "
                       "from the saved run's", flag, ts[key].dump(), now.dump(), start));
    }
  };
  differs("global_batch_size", global_batch, "a global batch of");
  differs("seq_len", data.seq_len, "DataOptions::seq_len");
  differs("seed", step.seed, "StepOptions::seed");
  differs("shuffle", data.shuffle, "shuffle =");
  differs("data", data.path, "DataOptions::path");
  return start;
}

// Note [Metrics after a resume]
// A run resumed from the checkpoint of step S trains steps S, S+1, ... again;
// the interrupted run may have logged some of them (it stopped after its last
// checkpoint). Their records are dropped from --metrics-file before the
// resumed run appends, so each step is in the file once, with the values of
// the run that continues. So is the evaluation at step S (of the checkpoint's
// own weights), as TensorBoard drops it (Note [TensorBoard after a resume] in
// train/tensorboard.h): both show the same points. Lines that are not JSON
// objects with a "step" (an --eval-only record, a user's note) are kept as
// they are. The file is rewritten atomically.
int64_t drop_metrics_from(const std::string& path, int64_t first_step) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;
  std::istringstream in(read_input_file(path, "LogOptions::metrics_file", kMaxMetricsFileBytes,
                                       "give LogOptions::metrics_file a JSON-lines file of the run's records"));
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    std::string why;  // a line that is not JSON (or nests too deep) is kept as it is
    const std::optional<nlohmann::json> j = parse_json_input(line, why);
    if (j && j->is_object() && j->contains("step") && (*j)["step"].is_number_integer() &&
        (*j)["step"].get<int64_t>() >= first_step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped > 0) write_output_file(path, kept, "LogOptions::metrics_file");
  return dropped;
}

}  // namespace fsdp::train

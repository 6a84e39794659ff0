#include "fsdp/train/metrics.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "fsdp/common/error.h"
#include "fsdp/common/output_file.h"
#include "train/tensorboard.h"

namespace fsdp::train {
namespace {

using V = std::optional<double>;

double num(int64_t v) { return static_cast<double>(v); }
// Present only with dynamic loss scaling (fp16): the scale it used is > 0.
bool scaling(const MetricSource& s) { return s.step->loss_scale > 0; }

// The table (metrics_table: the step's rows, then the evaluation's). Keys
// and TensorBoard tags are those the files have always had; Prometheus
// names follow its conventions (base units in the name, _total for a
// counter), prefixed fsdp_train_ / fsdp_eval_.
constexpr auto S = MetricScope::kStep;
constexpr auto E = MetricScope::kEval;
constexpr auto I = MetricType::kInteger;
constexpr auto R = MetricType::kReal;
constexpr auto F = MetricType::kFlag;
constexpr unsigned JP = kToJson | kToPrometheus;

// The table's rows of a step record, in their order.
std::vector<Metric> step_metrics() {
  return {
      {S, "step", I, JP, "", "fsdp_train_step", "", "",
       "the step logged, numbered from 0 as in the log's 'Batch N'",
       [](const MetricSource& s) -> V { return num(s.step->step); }},
      {S, "loss", R, kToAll, "train/loss", "fsdp_train_loss", "", "",
       "mean next-token loss of the step over the whole global batch (all ranks)",
       [](const MetricSource& s) -> V { return s.step->loss; }},
      {S, "lr", R, kToAll, "train/lr", "fsdp_train_lr", "", "", "learning rate of the step",
       [](const MetricSource& s) -> V { return s.step->lr; }},
      {S, "grad_norm", R, kToAll, "train/grad_norm", "fsdp_train_grad_norm", "", "",
       "global gradient norm before clipping (0 for a skipped step)",
       [](const MetricSource& s) -> V { return s.step->grad_norm; }},
      {S, "samples_per_s", R, kToAll, "train/samples_per_s", "fsdp_train_samples_per_second", "1/s", "",
       "global samples per second over the steps since the previous logged one",
       [](const MetricSource& s) -> V { return s.step->samples_per_s; }},
      {S, "tokens_per_s", R, kToAll, "train/tokens_per_s", "fsdp_train_tokens_per_second", "1/s", "",
       "global tokens per second over the same steps (samples_per_s x --seq-len)",
       [](const MetricSource& s) -> V { return s.step->tokens_per_s; }},
      {S, "step_time_s", R, kToAll, "train/step_time_s", "fsdp_train_step_time_seconds", "seconds", "",
       "wall time of the logged step on this rank",
       [](const MetricSource& s) -> V { return s.step->step_time_s; }},
      {S, "peak_mem_bytes", I, kToAll, "train/peak_mem_bytes", "fsdp_train_peak_memory_bytes", "bytes", "",
       "peak memory of this rank: resident set on the CPU, the caching allocator's peak on a GPU (-1: unknown)",
       [](const MetricSource& s) -> V { return num(s.step->peak_mem_bytes); }},
      {S, "unsharded_peak_bytes", I, kToAll, "train/unsharded_peak_bytes", "fsdp_train_unsharded_peak_bytes",
       "bytes", "", "most unsharded parameter and gradient bytes the engine held at once since the previous logged step",
       [](const MetricSource& s) -> V { return num(s.step->unsharded_peak_bytes); }},
      {S, "unsharded_bound_bytes", I, JP, "", "fsdp_train_unsharded_bound_bytes", "bytes", "",
       "the sharding plan's bound on unsharded_peak_bytes",
       [](const MetricSource& s) -> V { return num(s.step->unsharded_bound_bytes); }},
      {S, "mfu", R, JP, "", "fsdp_train_mfu", "ratio", "GPUs with a known peak",
       "model FLOPs utilization of this rank: model FLOPs per second over the device's data-sheet peak",
       [](const MetricSource& s) -> V { return s.step->mfu >= 0 ? V(s.step->mfu) : std::nullopt; }},
      {S, "allgather_bytes", I, JP, "", "fsdp_train_allgather_bytes", "bytes", "",
       "bytes this rank all-gathered in the logged step",
       [](const MetricSource& s) -> V { return num(s.step->comm.allgather_bytes); }},
      {S, "reduce_scatter_bytes", I, JP, "", "fsdp_train_reduce_scatter_bytes", "bytes", "",
       "bytes this rank reduce-scattered in the logged step",
       [](const MetricSource& s) -> V { return num(s.step->comm.reduce_scatter_bytes); }},
      {S, "allreduce_bytes", I, JP, "", "fsdp_train_allreduce_bytes", "bytes", "",
       "bytes this rank all-reduced in the logged step (NO_SHARD, HYBRID_SHARD replicas)",
       [](const MetricSource& s) -> V { return num(s.step->comm.allreduce_bytes); }},
      {S, "loss_scale", R, JP, "", "fsdp_train_loss_scale", "", "dynamic loss scaling (fp16)",
       "the loss scale the step used",
       [](const MetricSource& s) -> V { return scaling(s) ? V(s.step->loss_scale) : std::nullopt; }},
      {S, "skipped", F, JP, "", "fsdp_train_step_skipped", "", "dynamic loss scaling (fp16)",
       "whether the step was skipped for inf/nan gradients (Prometheus: 1 or 0)",
       [](const MetricSource& s) -> V { return scaling(s) ? V(s.step->skipped ? 1.0 : 0.0) : std::nullopt; }},
      {S, "skipped_steps", I, JP, "", "fsdp_train_skipped_steps_total", "", "dynamic loss scaling (fp16)",
       "steps skipped for inf/nan gradients since the run started (a checkpoint carries the count over)",
       [](const MetricSource& s) -> V { return scaling(s) ? V(num(s.step->skipped_steps)) : std::nullopt; }},
      {S, "checkpoint_stall_s", R, JP, "", "fsdp_train_checkpoint_stall_seconds", "seconds", "--checkpoint-dir",
       "seconds checkpoint saves held training since the previous logged step (synchronous: whole saves; "
       "--async-checkpoint: staging, commits and waits for a save in flight)",
       [](const MetricSource& s) -> V { return s.step->checkpoint_stall_s >= 0 ? V(s.step->checkpoint_stall_s) : std::nullopt; }},
      {S, "checkpoint_wait_s", R, JP, "", "fsdp_train_checkpoint_wait_seconds", "seconds", "--checkpoint-dir",
       "of checkpoint_stall_s, seconds a save waited for the previous one still in flight (--async-checkpoint)",
       [](const MetricSource& s) -> V { return s.step->checkpoint_wait_s >= 0 ? V(s.step->checkpoint_wait_s) : std::nullopt; }},
      {S, "checkpoint_staging_bytes", I, JP, "", "fsdp_train_checkpoint_staging_bytes", "bytes", "--checkpoint-dir",
       "host memory this rank's checkpoint staging buffers hold (--async-checkpoint; kept between saves, 0 without)",
       [](const MetricSource& s) -> V {
         return s.step->checkpoint_staging_bytes >= 0 ? V(num(s.step->checkpoint_staging_bytes)) : std::nullopt;
       }},
      {S, "world_size", I, JP, "", "fsdp_world_size", "", "", "processes training",
       [](const MetricSource& s) -> V { return num(s.world_size); }},
  };
}

// The table's rows of an evaluation record, after the step's.
std::vector<Metric> eval_metrics() {
  return {
      {E, "step", I, JP, "", "fsdp_eval_step", "", "not in evaluation-only runs",
       "completed training steps when evaluated",
       [](const MetricSource& s) -> V { return s.eval_only ? std::nullopt : V(num(s.eval->step)); }},
      {E, "eval_loss", R, kToAll, "eval/loss", "fsdp_eval_loss", "", "",
       "exact mean next-token loss over every target of the evaluated --val-data windows",
       [](const MetricSource& s) -> V { return s.eval->loss; }},
      {E, "eval_tokens", I, JP, "", "fsdp_eval_tokens", "", "", "target tokens evaluated (all ranks)",
       [](const MetricSource& s) -> V { return num(s.eval->targets); }},
  };
}

}  // namespace

const std::vector<Metric>& metrics_table() {
  static const std::vector<Metric> table = [] {
    std::vector<Metric> t = step_metrics();
    for (Metric& m : eval_metrics()) t.push_back(std::move(m));
    return t;
  }();
  return table;
}

MetricsRecord make_metrics_record(MetricScope scope, const MetricSource& source) {
  FSDP_ASSERT(scope == MetricScope::kStep ? source.step != nullptr : source.eval != nullptr,
              "a metrics record needs the record of its scope");
  MetricsRecord r;
  r.scope = scope;
  r.source = source;
  for (const Metric& m : metrics_table()) {
    if (m.scope != scope) continue;
    if (const std::optional<double> v = m.value(source)) r.entries.push_back({&m, *v});
  }
  return r;
}

std::string metrics_json_line(const MetricsRecord& record) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& e : record.entries) {
    if ((e.metric->sinks & kToJson) == 0) continue;
    const std::string key(e.metric->key);
    switch (e.metric->type) {
      case MetricType::kInteger: j[key] = static_cast<int64_t>(e.value); break;
      case MetricType::kReal: j[key] = e.value; break;
      case MetricType::kFlag: j[key] = e.value != 0; break;
    }
  }
  return j.dump();
}

namespace {

class JsonLinesSink : public MetricSink {
 public:
  explicit JsonLinesSink(const std::string& path) : path_(path) {
    open_output_for_append(out_, path, "--metrics-file");  // a FIFO without reader: refused (Note [Output targets])
    FSDP_CHECK(out_.good(), "--metrics-file ", path, ": cannot open for appending");
  }
  void write(const MetricsRecord& record) override {
    errno = 0;
    out_ << metrics_json_line(record) << "\n" << std::flush;
    if (!out_) {
      FSDP_FAIL("--metrics-file ", path_, ": writing failed (", errno != 0 ? std::strerror(errno) : "stream error",
                "); free space on its disk or choose another file");
    }
  }

 private:
  std::string path_;
  std::ofstream out_;
};

class TensorBoardSink : public MetricSink {
 public:
  TensorBoardSink(const std::string& dir, int64_t resumed_at) : writer_(dir, resumed_at) {}
  void write(const MetricsRecord& record) override {
    std::vector<std::pair<std::string, double>> scalars;
    for (const auto& e : record.entries) {
      if ((e.metric->sinks & kToTensorBoard) != 0) scalars.emplace_back(e.metric->tensorboard, e.value);
    }
    // A step's scalars at its own number; an evaluation's at the completed steps.
    const int64_t step = record.scope == MetricScope::kStep ? record.source.step->step : record.source.eval->step;
    if (!scalars.empty()) writer_.scalars(step, scalars);
  }

 private:
  TensorBoardWriter writer_;
};

}  // namespace

std::unique_ptr<MetricSink> make_json_lines_sink(const std::string& path) {
  return std::make_unique<JsonLinesSink>(path);
}

std::unique_ptr<MetricSink> make_tensorboard_sink(const std::string& dir, int64_t resumed_at) {
  return std::make_unique<TensorBoardSink>(dir, resumed_at);
}

std::string metric_names(MetricScope scope, MetricSinks sink) {
  std::string out;
  for (const Metric& m : metrics_table()) {
    if (m.scope != scope || (m.sinks & sink) == 0) continue;
    const std::string_view name = sink == kToTensorBoard ? m.tensorboard : sink == kToPrometheus ? m.prometheus : m.key;
    out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  }
  return out;
}

std::string metrics_markdown() {
  std::string out =
      "| scope | --metrics-file key | TensorBoard tag | Prometheus name | type | unit | present | meaning |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
  auto cell = [](std::string_view s) { return s.empty() ? std::string("-") : fmt::format("`{}`", s); };
  for (const Metric& m : metrics_table()) {
    const char* type = m.type == MetricType::kInteger ? "integer" : m.type == MetricType::kReal ? "number" : "boolean";
    const bool counter = m.prometheus.size() > 6 && m.prometheus.substr(m.prometheus.size() - 6) == "_total";
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", m.scope == MetricScope::kStep ? "step" : "eval",
                       (m.sinks & kToJson) ? cell(m.key) : "-", (m.sinks & kToTensorBoard) ? cell(m.tensorboard) : "-",
                       (m.sinks & kToPrometheus) ? cell(m.prometheus) + (counter ? " (counter)" : " (gauge)") : "-",
                       type, m.unit.empty() ? "-" : std::string(m.unit), m.when.empty() ? "always" : std::string(m.when),
                       m.help);
  }
  return out;
}

}  // namespace fsdp::train

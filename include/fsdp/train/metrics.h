// The metrics a run reports, from one table, and the outputs they go to.
//
// Every metric is one row of metrics_table() (metrics.cpp): its key in the
// --metrics-file JSON lines, its TensorBoard tag, its Prometheus name, its
// type, when it is present and what it means, and how to read its value from
// a step's or an evaluation's record. The outputs (sinks) take a
// MetricsRecord built from the table; the --metrics-file/--tensorboard/
// --metrics-port help texts and the metrics page of the documentation
// (metrics_markdown(), fsdp-train --list-metrics) are generated from it. A
// new metric is one row (and, when its value is new, a field of StepRecord
// or EvalRecord filled in where it is measured).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/train/records.h"

namespace fsdp::train {

// Which record a metric belongs to.
enum class MetricScope {
  kStep,  // a logged training step (every --log-every steps, the last, a stopping one)
  kEval,  // an evaluation
};

// How a value is written: JSON integer, number or boolean; Prometheus always a number.
enum class MetricType { kInteger, kReal, kFlag };

// The outputs a metric goes to (a bit set).
enum MetricSinks : unsigned {
  kToJson = 1u << 0,         // --metrics-file
  kToTensorBoard = 1u << 1,  // --tensorboard (its tag)
  kToPrometheus = 1u << 2,   // --metrics-port (its name)
  kToAll = kToJson | kToTensorBoard | kToPrometheus,
};

// What a metric's value is read from.
struct MetricSource {
  const StepRecord* step = nullptr;  // kStep
  const EvalRecord* eval = nullptr;  // kEval
  int world_size = 1;
  bool eval_only = false;  // an evaluation-only run (its evaluation has no step in the JSON record)
};

struct Metric {
  MetricScope scope;
  std::string_view key;          // --metrics-file key (unique within the scope)
  MetricType type;
  unsigned sinks;                // MetricSinks
  std::string_view tensorboard;  // tag; "" when kToTensorBoard is not set
  std::string_view prometheus;   // name (with the fsdp_ prefix); "" when kToPrometheus is not set
  std::string_view unit;         // "bytes", "seconds", ... ("" for none)
  std::string_view when;         // when it is present ("" always)
  std::string_view help;         // what it means, one sentence
  // The value, or nullopt where the metric is absent for this record.
  std::optional<double> (*value)(const MetricSource&);
};

// Every metric, step metrics first, in the order outputs list them.
const std::vector<Metric>& metrics_table();

// One record's present metrics, in table order, with their values.
struct MetricsRecord {
  MetricScope scope = MetricScope::kStep;
  MetricSource source;
  struct Entry {
    const Metric* metric;
    double value;
  };
  std::vector<Entry> entries;
};
MetricsRecord make_metrics_record(MetricScope scope, const MetricSource& source);

// An output of metrics records. Implementations: the --metrics-file JSON
// lines (metrics.cpp), TensorBoard (metrics.cpp), Prometheus (prometheus.h);
// the console line is the trainer's own (it also says the ETA and progress).
class MetricSink {
 public:
  virtual ~MetricSink() = default;
  virtual void write(const MetricsRecord& record) = 0;
};

// --metrics-file: one JSON object per record, appended and flushed at once.
// Failure naming the file when a record cannot be written (metrics are results).
std::unique_ptr<MetricSink> make_json_lines_sink(const std::string& path);
// --tensorboard DIR: one event per record (train/tensorboard.h).
std::unique_ptr<MetricSink> make_tensorboard_sink(const std::string& dir, int64_t resumed_at);

// A record as its --metrics-file line (one JSON object, no newline).
std::string metrics_json_line(const MetricsRecord& record);

// The keys (kToJson), tags (kToTensorBoard) or names (kToPrometheus) of a
// scope's metrics, comma-separated, for the flags' help texts.
std::string metric_names(MetricScope scope, MetricSinks sink);
// The table as Markdown (fsdp-train --list-metrics; the documentation's metrics page).
std::string metrics_markdown();

}  // namespace fsdp::train

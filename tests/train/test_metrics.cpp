// The metrics table and what the outputs make of one record: the JSON line,
// the Prometheus exposition, the table's own invariants (train/metrics.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>
#include <string>

#include "fsdp/common/error.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/prometheus.h"

namespace fsdp::train {
namespace {

StepRecord a_step() {
  StepRecord r;
  r.step = 41;
  r.loss = 7.242910385131836;
  r.lr = 0.0003;
  r.grad_norm = 0.8123;
  r.step_time_s = 0.25;
  r.samples_per_s = 9.41;
  r.tokens_per_s = 2408.96;
  r.peak_mem_bytes = 281 << 20;
  r.unsharded_peak_bytes = 1 << 20;
  r.unsharded_bound_bytes = 3 << 19;
  r.comm.allgather_bytes = 123;
  r.comm.reduce_scatter_bytes = 456;
  r.comm.allreduce_bytes = 0;
  return r;
}

std::set<std::string> keys_of(const std::string& line) {
  std::set<std::string> keys;
  const nlohmann::json j = nlohmann::json::parse(line);
  for (const auto& item : j.items()) keys.insert(item.key());
  return keys;
}

MetricsRecord step_record(const StepRecord& r, int world_size = 2) {
  MetricSource s;
  s.step = &r;
  s.world_size = world_size;
  return make_metrics_record(MetricScope::kStep, s);
}

}  // namespace

// The --metrics-file lines keep the keys they had before the table: what
// scripts/plot_metrics.py and users' scripts read. With fp16 loss scaling the
// scale, the skip flag and (new) the count of skipped steps; MFU where known.
TEST(Metrics, JsonLinesKeepTheirKeys) {
  const std::set<std::string> base = {"step", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s",
                                      "step_time_s", "peak_mem_bytes", "unsharded_peak_bytes",
                                      "unsharded_bound_bytes", "allgather_bytes", "reduce_scatter_bytes",
                                      "allreduce_bytes", "world_size"};
  StepRecord r = a_step();
  EXPECT_EQ(keys_of(metrics_json_line(step_record(r))), base);
  r.mfu = 0.42;
  r.loss_scale = 65536;
  r.skipped = true;
  r.skipped_steps = 3;
  std::set<std::string> more = base;
  more.insert({"mfu", "loss_scale", "skipped", "skipped_steps"});
  const std::string line = metrics_json_line(step_record(r));
  EXPECT_EQ(keys_of(line), more);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_TRUE(j["skipped"].is_boolean());
  EXPECT_TRUE(j["step"].is_number_integer());
  EXPECT_TRUE(j["peak_mem_bytes"].is_number_integer());
  EXPECT_EQ(j["loss"].get<double>(), r.loss);  // the same double, not a rounded text
  EXPECT_EQ(j["world_size"].get<int>(), 2);

  EvalRecord e;
  e.step = 100;
  e.loss = 5.125;
  e.targets = 40960;
  MetricSource s;
  s.eval = &e;
  EXPECT_EQ(keys_of(metrics_json_line(make_metrics_record(MetricScope::kEval, s))),
            (std::set<std::string>{"step", "eval_loss", "eval_tokens"}));
  s.eval_only = true;  // an evaluation-only run's record has no step
  EXPECT_EQ(keys_of(metrics_json_line(make_metrics_record(MetricScope::kEval, s))),
            (std::set<std::string>{"eval_loss", "eval_tokens"}));
}

// Names are unique and well-formed, each output a row claims has its name,
// every row says what it means: adding a metric is one row, and a row that
// forgets a name or reuses one fails here.
TEST(Metrics, TableInvariants) {
  std::set<std::string> json_keys[2], prom, tags;
  const std::regex prom_name("fsdp_[a-z][a-z0-9_]*");
  for (const Metric& m : metrics_table()) {
    const int scope = m.scope == MetricScope::kStep ? 0 : 1;
    EXPECT_TRUE(json_keys[scope].insert(std::string(m.key)).second) << "key " << m.key << " twice";
    EXPECT_FALSE(m.help.empty()) << m.key;
    EXPECT_NE(m.value, nullptr) << m.key;
    EXPECT_EQ((m.sinks & kToPrometheus) != 0, !m.prometheus.empty()) << m.key;
    EXPECT_EQ((m.sinks & kToTensorBoard) != 0, !m.tensorboard.empty()) << m.key;
    if (!m.prometheus.empty()) {
      EXPECT_TRUE(std::regex_match(std::string(m.prometheus), prom_name)) << m.prometheus;
      EXPECT_TRUE(prom.insert(std::string(m.prometheus)).second) << m.prometheus << " twice";
    }
    if (!m.tensorboard.empty()) EXPECT_TRUE(tags.insert(std::string(m.tensorboard)).second) << m.tensorboard;
  }
  for (const char* name : {"fsdp_train_loss", "fsdp_train_step", "fsdp_train_lr", "fsdp_train_grad_norm",
                           "fsdp_train_tokens_per_second", "fsdp_train_samples_per_second",
                           "fsdp_train_step_time_seconds", "fsdp_train_peak_memory_bytes",
                           "fsdp_train_unsharded_peak_bytes", "fsdp_train_unsharded_bound_bytes", "fsdp_train_mfu",
                           "fsdp_eval_loss", "fsdp_train_skipped_steps_total", "fsdp_world_size"}) {
    EXPECT_EQ(prom.count(name), 1u) << name << " is not served";
  }
  // The --help texts and the documentation come from the table.
  EXPECT_NE(metric_names(MetricScope::kStep, kToJson).find("unsharded_bound_bytes"), std::string::npos);
  EXPECT_NE(metric_names(MetricScope::kStep, kToTensorBoard).find("train/unsharded_peak_bytes"), std::string::npos);
  const std::string md = metrics_markdown();
  for (const Metric& m : metrics_table()) EXPECT_NE(md.find(std::string(m.help)), std::string::npos) << m.key;
}

// What a scrape answers: HELP, TYPE and one sample per served metric with the
// rank label, values as the JSON line has them; metrics absent from the
// record (no loss scaling) are not served; a later record replaces the values.
TEST(Metrics, PrometheusExposition) {
  PrometheusExporter exporter("127.0.0.1", 0, 3);
  EXPECT_GT(exporter.port(), 0);
  EXPECT_EQ(exporter.url(), "http://127.0.0.1:" + std::to_string(exporter.port()) + "/metrics");
  EXPECT_EQ(exporter.exposition(), "");  // nothing logged yet
  StepRecord r = a_step();
  exporter.write(step_record(r, 4));
  const std::string text = exporter.exposition();
  EXPECT_NE(text.find("# TYPE fsdp_train_loss gauge\nfsdp_train_loss{rank=\"3\"} 7.242910385131836\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("fsdp_train_step{rank=\"3\"} 41\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fsdp_world_size{rank=\"3\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("fsdp_train_peak_memory_bytes{rank=\"3\"} 294649856\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP fsdp_train_lr learning rate of the step\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("loss_scale"), std::string::npos) << "no loss scaling, no scale served";
  r.step = 42;
  r.loss_scale = 1024;
  r.skipped_steps = 2;
  exporter.write(step_record(r, 4));
  const std::string later = exporter.exposition();
  EXPECT_NE(later.find("fsdp_train_step{rank=\"3\"} 42\n"), std::string::npos) << later;
  EXPECT_NE(later.find("# TYPE fsdp_train_skipped_steps_total counter\nfsdp_train_skipped_steps_total{rank=\"3\"} 2\n"),
            std::string::npos) << later;
}

// A port another socket listens on is refused up front, naming the flag and the address.
TEST(Metrics, PortInUseIsAUsageError) {
  PrometheusExporter first("127.0.0.1", 0, 0);
  const int port = first.port();
  try {
    PrometheusExporter second("127.0.0.1", port, 0);
    FAIL() << "a second server on port " << port;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics-port " + std::to_string(port) + ": 127.0.0.1:" +
                                         std::to_string(port) + " is in use"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(check_metrics_address("localhost", 0), UsageError);  // not a numeric address
  EXPECT_THROW(check_metrics_address("127.0.0.1", 70000), UsageError);
}

}  // namespace fsdp::train

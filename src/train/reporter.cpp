// The trainer's reporter (reporter.h).
#include "train/reporter.h"

#include <fmt/format.h>

#include <filesystem>

#include <unistd.h>

#include "fsdp/common/config_file.h"
#include "fsdp/common/output_file.h"
#include "fsdp/train/prometheus.h"
#include "train/run_state.h"

namespace fsdp::train {
namespace {

// metrics.jsonl -> metrics.config.toml, beside it.
std::string config_path_beside(const std::string& metrics_file) {
  std::filesystem::path p(metrics_file);
  return (p.parent_path() / (p.stem().string() + ".config.toml")).string();
}

}  // namespace

Reporter::Reporter(const LogOptions& log, int rank, int world_size, bool eval_only)
    : log_(log),
      rank_(rank),
      world_size_(world_size),
      eval_only_(eval_only),
      console_(log_, rank == 0),
      say_(console_.level('I')),
      warn_(console_.level('W')),
      progress_(rank == 0 && !log_.quiet && isatty(STDERR_FILENO) == 1),
      tracer_(log_) {}

// Before anything is built, so that a port in use fails the run before it
// trains unobserved (Note [Prometheus endpoint]).
std::string Reporter::start_endpoint(const comm::Runtime& rt) {
  const bool lead = rank_ == 0;
  if (log_.metrics_port < 0 || !(lead || log_.metrics_every_rank)) return "";
  const int port = log_.metrics_port == 0 || !log_.metrics_every_rank ? log_.metrics_port
                                                                      : log_.metrics_port + rt.world.local_rank;
  auto exporter = std::make_unique<PrometheusExporter>(log_.metrics_host, port, rank_);
  const std::string url = lead ? exporter->url() : "";
  if (log_.metrics_every_rank && log_.metrics_port == 0) {
    // Any free port: each rank's is its own, so rank 0 names every one (issue 39).
    comm::ProcessGroup& g = rt.cpu_group ? *rt.cpu_group : *rt.world_group;
    const at::Tensor mine = at::full({1}, static_cast<int64_t>(exporter->port()), at::kLong);
    const at::Tensor all = at::empty({world_size_}, at::kLong);
    g.all_gather(all, mine)->wait();
    std::string ports;
    for (int r = 0; r < world_size_; ++r) {
      ports += fmt::format("{}rank {} port {}", r == 0 ? "" : ", ", r, all[r].item<int64_t>());
    }
    say_(fmt::format("Prometheus metrics on {} (every rank, any free port: {})", exporter->url(), ports));
  } else {
    say_(fmt::format("Prometheus metrics on {}{}", exporter->url(),
                     log_.metrics_every_rank ? " (every rank: LogOptions::metrics_port + its local rank)" : ""));
  }
  sinks_.push_back(std::move(exporter));
  return url;
}

void Reporter::open_records(int64_t start_step, bool resume) {
  if (rank_ != 0) return;
  if (!log_.metrics_file.empty()) {
    if (resume && !eval_only_) {
      if (const int64_t n = drop_metrics_from(log_.metrics_file, start_step); n > 0) {
        say_(fmt::format("dropped {} record{} of steps >= {} from {}: the resumed run trains those steps again", n,
                         n == 1 ? "" : "s", start_step, log_.metrics_file));
      }
    }
    sinks_.push_back(make_json_lines_sink(log_.metrics_file));
    if (!log_.config_text.empty() && may_write_beside(log_.metrics_file)) {  // never /dev/null.config.toml
      write_config_copy(config_path_beside(log_.metrics_file), "LogOptions::metrics_file");
    }
  }
  if (!log_.tensorboard_dir.empty()) {
    sinks_.push_back(make_tensorboard_sink(log_.tensorboard_dir, resume ? start_step : -1));
    if (!log_.config_text.empty()) {
      write_config_copy((std::filesystem::path(log_.tensorboard_dir) / "config.toml").string(),
                        "LogOptions::tensorboard_dir");
    }
  }
}

// A derived name (Note [Output targets]): a user's file there, or the
// --config file itself, stays as it is; the run goes on without the copy.
void Reporter::write_config_copy(const std::string& path, const char* flag) {
  const std::string why = write_derived_output_file(path, log_.config_text, flag, kEffectiveConfigMarker,
                                                    log_.config_file);
  if (!why.empty()) warn_(fmt::format("the run's configuration was not copied: {}", why));
}

void Reporter::publish(MetricScope scope, const StepRecord* step, const EvalRecord* eval) {
  if (sinks_.empty()) return;
  MetricSource source;
  source.step = step;
  source.eval = eval;
  source.world_size = world_size_;
  source.eval_only = eval_only_;
  const MetricsRecord record = make_metrics_record(scope, source);
  for (const auto& sink : sinks_) sink->write(record);
}

}  // namespace fsdp::train

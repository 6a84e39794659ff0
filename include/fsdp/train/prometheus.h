// --metrics-port: the run's metrics for Prometheus (Note [Prometheus endpoint]
// in prometheus.cpp).
//
// GET /metrics answers the text exposition format 0.0.4: every metric of
// metrics_table() with a Prometheus name, as of the latest logged step and
// evaluation, labelled rank="<rank>". The values are those the same record
// wrote to --metrics-file; one scrape sees one record's values, never a mix
// of two. The HTTP server (Boost.Beast) runs on a thread of its own: a slow,
// stalled or malformed request holds its own connection for at most its
// request timeout and never the training thread, which only swaps the values
// under a mutex.
#pragma once

#include <memory>
#include <string>

#include "fsdp/train/metrics.h"

namespace fsdp::train {

// Throws UsageError unless a server could listen on host:port now: `host` a
// numeric IPv4 or IPv6 address of this machine ("127.0.0.1", "0.0.0.0",
// "::1"), `port` in [0, 65535] (0: any free one) and not in use. The message
// names --metrics-host / --metrics-port.
void check_metrics_address(const std::string& host, int port);

class PrometheusExporter : public MetricSink {
 public:
  // Serves GET /metrics on host:port (0: a free port, see port()) for the
  // process of `rank`. UsageError as check_metrics_address when the address
  // cannot be listened on.
  PrometheusExporter(const std::string& host, int port, int rank);
  // Stops the server (waits for requests in flight, at most their timeout).
  ~PrometheusExporter() override;
  PrometheusExporter(const PrometheusExporter&) = delete;
  PrometheusExporter& operator=(const PrometheusExporter&) = delete;

  // Replaces the values of the record's metrics (thread-safe with scrapes).
  void write(const MetricsRecord& record) override;

  int port() const;
  // "http://<host>:<port>/metrics".
  std::string url() const;
  // What a scrape answers now.
  std::string exposition() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::train

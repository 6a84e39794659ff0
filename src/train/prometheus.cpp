#include "fsdp/train/prometheus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <civetweb.h>
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::train {

// Note [Prometheus endpoint]
// Prometheus pulls: its server scrapes GET /metrics every few seconds, so
// fsdp-train keeps the latest values and answers each scrape with them.
// Rank 0 serves by default (its loss, learning rate and gradient norm are the
// global ones; speeds, memory and communication are its own); with
// --metrics-every-rank each process serves on --metrics-port + its local rank,
// so every GPU's memory and speed can be watched. The server (CivetWeb,
// Debian's libcivetweb) runs on its own threads: the training thread only
// copies a record's values under the mutex, a scrape renders them under the
// same mutex and writes the response without it. A client that sends
// nothing, sends slowly or reads slowly holds one server thread until its
// request timeout (kRequestTimeoutMs); a malformed request gets CivetWeb's
// 400. Neither reaches the training thread. The address is checked before
// anything is built (check_metrics_address): a port in use is a UsageError,
// not a run that trains unobserved.

namespace {

constexpr const char* kRequestTimeoutMs = "5000";
constexpr const char* kServerThreads = "4";

// A numeric address: its family, and its text as CivetWeb's listening_ports wants it.
struct Address {
  int family = AF_INET;
  sockaddr_storage addr{};
  socklen_t len = 0;
};

Address parse_address(const std::string& host, int port) {
  FSDP_CHECK(port >= 0 && port <= 65535, "--metrics-port ", port,
             " is not a TCP port; give one in [1, 65535] (or 0 for any free port)");
  Address a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    a.len = sizeof(sockaddr_in);
    return a;
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    a.family = AF_INET6;
    a.len = sizeof(sockaddr_in6);
    return a;
  }
  FSDP_CHECK(false, "--metrics-host '", host, "' is not a numeric IP address; give one of this machine's, e.g. "
             "127.0.0.1 (this machine only) or 0.0.0.0 (every interface, for a Prometheus server elsewhere)");
  return a;
}

std::string listening_spec(const std::string& host, int port, int family) {
  return family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// A Prometheus sample value: integers as integers, others the shortest text
// that reads back as the same double (as the JSON lines write them).
std::string sample_text(const Metric& m, double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (m.type != MetricType::kReal) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

// HELP text escaping of the exposition format: backslash and line feed.
std::string help_text(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

void check_metrics_address(const std::string& host, int port) {
  const Address a = parse_address(host, port);
  const int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FSDP_CHECK(fd >= 0, "--metrics-host ", host, ": cannot open a socket (", std::strerror(errno), ")");
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len);
  const int err = errno;
  ::close(fd);
  if (rc == 0) return;
  FSDP_CHECK(err != EADDRINUSE, "--metrics-port ", port, ": ", listening_spec(host, port, a.family),
             " is in use by another process; choose another port (or 0 for any free one)");
  FSDP_CHECK(err != EADDRNOTAVAIL, "--metrics-host ", host, " is not an address of this machine; give one of its "
             "addresses, 127.0.0.1 or 0.0.0.0");
  FSDP_CHECK(err != EACCES, "--metrics-port ", port, ": ports below 1024 need privileges; choose one >= 1024");
  FSDP_CHECK(false, "--metrics-host ", host, " --metrics-port ", port, ": cannot listen there (",
             std::strerror(err), ")");
}

class PrometheusExporter::Impl {
 public:
  Impl(const std::string& host, int port, int rank) : host_(host), rank_(rank) {
    const Address a = parse_address(host, port);
    check_metrics_address(host, port);
    static std::once_flag init;
    std::call_once(init, [] { mg_init_library(0); });
    const std::string ports = listening_spec(host, port, a.family);
    const char* options[] = {"listening_ports", ports.c_str(), "num_threads", kServerThreads,
                             "request_timeout_ms", kRequestTimeoutMs, "enable_keep_alive", "no", nullptr};
    mg_callbacks callbacks{};
    // CivetWeb's own messages (a client's bad request) are no news for the training log.
    callbacks.log_message = [](const mg_connection*, const char*) { return 1; };
    mg_init_data init_data{};
    init_data.callbacks = &callbacks;
    init_data.user_data = this;
    init_data.configuration_options = options;
    char error_text[256] = {0};
    unsigned error_code = 0;
    mg_error_data error{};
    error.code = &error_code;
    error.text = error_text;
    error.text_buffer_size = sizeof(error_text);
    ctx_ = mg_start2(&init_data, &error);
    FSDP_CHECK(ctx_ != nullptr, "--metrics-port ", port, ": cannot serve on ", ports, " (", error_text,
               "); choose another port (or 0 for any free one)");
    mg_server_port bound[2]{};
    const int n = mg_get_server_ports(ctx_, 2, bound);
    port_ = n >= 1 ? bound[0].port : port;
    mg_set_request_handler(ctx_, "/metrics$", &Impl::handle, this);
  }

  ~Impl() {
    if (ctx_ != nullptr) mg_stop(ctx_);
  }

  void write(const MetricsRecord& record) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : record.entries) {
      if ((e.metric->sinks & kToPrometheus) != 0) values_[e.metric] = e.value;
    }
  }

  std::string exposition() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const Metric& m : metrics_table()) {
      const auto it = values_.find(&m);
      if (it == values_.end()) continue;
      const bool counter = m.prometheus.size() > 6 && m.prometheus.substr(m.prometheus.size() - 6) == "_total";
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{rank=\"{}\"}} {}\n", m.prometheus, help_text(m.help),
                         m.prometheus, counter ? "counter" : "gauge", m.prometheus, rank_, sample_text(m, it->second));
    }
    return out;
  }

  int port() const { return port_; }
  const std::string& host() const { return host_; }

 private:
  static int handle(mg_connection* conn, void* self) {
    const mg_request_info* ri = mg_get_request_info(conn);
    const std::string method = ri != nullptr && ri->request_method != nullptr ? ri->request_method : "";
    if (method != "GET" && method != "HEAD") {
      mg_send_http_error(conn, 405, "%s", "only GET /metrics\n");
      return 405;
    }
    const std::string body = static_cast<Impl*>(self)->exposition();
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
              body.size());
    if (method == "GET") mg_write(conn, body.data(), body.size());
    return 200;
  }

  const std::string host_;
  const int rank_;
  int port_ = 0;
  mg_context* ctx_ = nullptr;
  mutable std::mutex mu_;                 // guards values_
  std::map<const Metric*, double> values_;  // the latest value of each metric served
};

PrometheusExporter::PrometheusExporter(const std::string& host, int port, int rank)
    : impl_(std::make_unique<Impl>(host, port, rank)) {}
PrometheusExporter::~PrometheusExporter() = default;
void PrometheusExporter::write(const MetricsRecord& record) { impl_->write(record); }
int PrometheusExporter::port() const { return impl_->port(); }
std::string PrometheusExporter::exposition() const { return impl_->exposition(); }

std::string PrometheusExporter::url() const {
  const bool v6 = impl_->host().find(':') != std::string::npos;
  return v6 ? fmt::format("http://[{}]:{}/metrics", impl_->host(), port())
            : fmt::format("http://{}:{}/metrics", impl_->host(), port());
}

}  // namespace fsdp::train

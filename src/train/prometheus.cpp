#include "fsdp/train/prometheus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <pthread.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "fsdp/common/error.h"

namespace fsdp::train {

// Note [Prometheus endpoint]
// Prometheus pulls: its server scrapes GET /metrics every few seconds, so
// fsdp-train keeps the latest values and answers each scrape with them.
// Rank 0 serves by default (its loss, learning rate and gradient norm are the
// global ones; speeds, memory and communication are its own); with
// --metrics-every-rank each process serves on --metrics-port + its local rank,
// so every GPU's memory and speed can be watched. The server (Boost.Beast's
// HTTP on Boost.Asio, header-only) runs on one thread of its own, every
// connection asynchronous on it: the training thread only copies a record's
// values under the mutex, a scrape renders them under the same mutex and
// writes the response without it. A client that sends nothing, sends slowly
// or reads slowly holds only its own connection, until its request timeout
// (kRequestTimeout); at most kMaxConnections are open at once (more are
// closed on arrival). A request that is not HTTP gets 400, a method other
// than GET or HEAD 405, another path 404. None of it reaches the training
// thread. The address is checked before anything is built
// (check_metrics_address): a port in use is a UsageError, not a run that
// trains unobserved.
//
// Why not CivetWeb, the first choice: it starts its threads with 100 KiB
// stacks, and in a process that loads CUDA's libraries their static
// thread-local storage alone is larger (about 170 KiB: cublasLt 92 KiB),
// so glibc refuses to create them (EINVAL) and the endpoint could not start
// in any CUDA build. std::thread's stacks are the process default.

namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = boost::asio::ip::tcp;

constexpr std::chrono::milliseconds kRequestTimeout{5000};
constexpr int kMaxConnections = 64;
constexpr std::chrono::milliseconds kAcceptRetry{100};  // after accept failed (out of descriptors)
constexpr uint32_t kRequestLimit = 8192;  // bytes of a request's header (and body)

// A numeric address: its family and socket address.
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
    beast::error_code ec;
    const tcp::endpoint at(net::ip::make_address(host, ec), static_cast<uint16_t>(port));
    FSDP_CHECK(!ec, "--metrics-host '", host, "': ", ec.message());
    acceptor_.open(at.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(at, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    FSDP_CHECK(!ec, "--metrics-port ", port, ": cannot serve on ", listening_spec(host, port, a.family), " (",
               ec.message(), "); choose another port (or 0 for any free one)");
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "fsdp-metrics");  // named in top, gdb and the hostile campaign
      // A handler's exception (an allocation failing) ends that request, not the server.
      while (true) {
        try {
          ioc_.run();
          return;
        } catch (const std::exception&) {
        }
      }
    });
  }

  ~Impl() {
    net::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
    });
    ioc_.stop();
    if (thread_.joinable()) thread_.join();
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
  // One connection: read one request (header and body within kRequestLimit
  // bytes, all of it within kRequestTimeout), answer it, close.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(tcp::socket socket, Impl* server) : stream_(std::move(socket)), server_(server) {
      ++server_->connections_;
    }
    ~Session() { --server_->connections_; }

    void start() {
      parser_.emplace();
      parser_->header_limit(kRequestLimit);
      parser_->body_limit(kRequestLimit);
      stream_.expires_after(kRequestTimeout);
      http::async_read(stream_, buffer_, *parser_,
                       [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    }

   private:
    void on_read(beast::error_code ec) {
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
          ec == net::error::connection_reset || ec == net::error::eof) {
        return close();
      }
      if (ec) return answer(http::status::bad_request, "not an HTTP request; GET /metrics\n", false);
      const auto& req = parser_->get();
      const bool head = req.method() == http::verb::head;
      if (req.method() != http::verb::get && !head) {
        return answer(http::status::method_not_allowed, "only GET /metrics\n", false);
      }
      const beast::string_view target = req.target();
      const beast::string_view path = target.substr(0, target.find('?'));
      if (path != "/metrics") return answer(http::status::not_found, "not found; GET /metrics\n", false);
      answer(http::status::ok, server_->exposition(), head);
    }

    void answer(http::status status, std::string body, bool head) {
      auto res = std::make_shared<http::response<http::string_body>>(status, 11);
      res->set(http::field::content_type, status == http::status::ok ? "text/plain; version=0.0.4; charset=utf-8"
                                                                     : "text/plain; charset=utf-8");
      res->set(http::field::cache_control, "no-store");
      if (status == http::status::method_not_allowed) res->set(http::field::allow, "GET, HEAD");
      res->keep_alive(false);
      res->content_length(body.size());
      if (!head) res->body() = std::move(body);
      stream_.expires_after(kRequestTimeout);
      http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, size_t) { self->close(); });
    }

    void close() {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_.close();
    }

    beast::tcp_stream stream_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    Impl* server_;
  };

  void accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS): the connection
        // stays queued and accept fails again at once. Retrying at once spun a
        // core and slowed training by 40% (issue 39); wait, then try again.
        retry_.expires_after(kAcceptRetry);
        retry_.async_wait([this](beast::error_code wait_ec) {
          if (!wait_ec && acceptor_.is_open()) accept();
        });
        return;
      }
      if (connections_ < kMaxConnections) std::make_shared<Session>(std::move(socket), this)->start();
      accept();  // a refused connection closes with its socket here
    });
  }

  const std::string host_;
  const int rank_;
  int port_ = 0;
  std::atomic<int> connections_{0};  // open sessions; outlives ioc_, whose end destroys the last ones
  net::io_context ioc_{1};
  tcp::acceptor acceptor_{ioc_};
  net::steady_timer retry_{ioc_};  // the next accept after a failed one
  std::thread thread_;
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

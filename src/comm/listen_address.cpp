#include "comm/listen_address.h"

#include "comm/socket.h"
#include "fsdp/common/error.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <sstream>

namespace fsdp::comm::tcp {

namespace {

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0 ||
         host.rfind("::ffff:127.", 0) == 0;
}

// The first address `host` resolves to that a socket can bind, numeric; "" if
// none (c10d's test before it uses the hostname for Gloo).
std::string bindable_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return "";
  std::string found;
  for (addrinfo* a = result; a != nullptr && found.empty(); a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    if (bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0) found = numeric_host(a->ai_addr, a->ai_addrlen);
  }
  freeaddrinfo(result);
  return found;
}

// The numeric address of interface `ifname` (IPv4 first, else IPv6), "" if it
// has none; `available` lists the interfaces that have one.
std::string interface_address(const std::string& ifname, std::string* available) {
  ifaddrs* list = nullptr;
  FSDP_CHECK(getifaddrs(&list) == 0, "getifaddrs failed: ", errno_text(errno),
             " — cannot look up GLOO_SOCKET_IFNAME=", ifname);
  std::string v4, v6;
  std::set<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    names.insert(i->ifa_name);
    if (ifname != i->ifa_name) continue;
    const std::string host = numeric_host(i->ifa_addr, sockaddr_len(i->ifa_addr));
    if (family == AF_INET && v4.empty()) v4 = host;
    if (family == AF_INET6 && v6.empty()) v6 = host;
  }
  freeifaddrs(list);
  std::ostringstream os;
  for (const auto& n : names) os << (os.tellp() > 0 ? ", " : "") << n;
  *available = os.str();
  return v4.empty() ? v6 : v4;
}

// Note [Advertised address]
// A job that spans nodes must never advertise a loopback address: the other
// nodes would dial their own loopback ("cannot connect to rank 0 at
// 127.0.0.1"). Many images map the host's name to 127.0.0.1 or 127.0.1.1 in
// /etc/hosts, so the hostname rule alone fails there. Then the address is the
// one the kernel picks to reach MASTER_ADDR (route_source_address: a UDP
// socket connected to it, which sends nothing): the interface on the path to
// the master, as NCCL matches the master's subnet. GLOO_SOCKET_IFNAME, when
// set, is used before any of this.
ListenAddress across_nodes(const TcpTransportOptions& t, const std::string& name, const std::string& by_name) {
  const std::string why = by_name.empty() ? detail::cat("host name '", name, "' does not resolve to a bindable address")
                                          : detail::cat("host name '", name, "' gives loopback ", by_name);
  const std::string routed = route_source_address(t.master_addr);
  FSDP_CHECK(!routed.empty() && !is_loopback(routed), "the job spans several nodes but this ", why,
             routed.empty() ? detail::cat(", and MASTER_ADDR ", t.master_addr, " does not resolve or has no route")
                            : detail::cat(", and the route to MASTER_ADDR ", t.master_addr, " leaves through ", routed),
             " — set GLOO_SOCKET_IFNAME to the interface that reaches the other nodes (e.g. GLOO_SOCKET_IFNAME=eth0)");
  return {routed, detail::cat("the interface that routes to MASTER_ADDR ", t.master_addr, "; ", why)};
}

ListenAddress choose_listen_host(const TcpTransportOptions& t) {
  if (is_loopback(t.master_addr)) return {"127.0.0.1", "loopback (MASTER_ADDR is local)"};
  if (!t.socket_ifname.empty()) {
    std::string available;
    const std::string host = interface_address(t.socket_ifname, &available);
    FSDP_CHECK(!host.empty(), "GLOO_SOCKET_IFNAME=", t.socket_ifname,
               " names no network interface with an IPv4 or IPv6 address on this host (interfaces: ",
               available, ") — set GLOO_SOCKET_IFNAME to the interface that reaches MASTER_ADDR ",
               t.master_addr);
    return {host, "interface " + t.socket_ifname + " (GLOO_SOCKET_IFNAME)"};
  }
  char name[256] = {0};
  FSDP_CHECK(gethostname(name, sizeof(name) - 1) == 0, "gethostname failed: ", errno_text(errno),
             " — set GLOO_SOCKET_IFNAME to the network interface to use");
  const std::string host = bindable_address(name);
  if (!host.empty() && (t.single_node || !is_loopback(host))) return {host, std::string("hostname ") + name};
  if (t.single_node) return {"127.0.0.1", "loopback (hostname does not resolve)"};
  return across_nodes(t, name, host);
}

}  // namespace

std::string route_source_address(const std::string& destination) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(destination.c_str(), "9", &hints, &result) != 0) return "";
  std::string found;
  for (addrinfo* a = result; a != nullptr && found.empty(); a = a->ai_next) {
    Fd fd(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0 || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      found = numeric_host(reinterpret_cast<sockaddr*>(&local), len);
    }
  }
  freeaddrinfo(result);
  return found;
}

ListenAddress choose_listen_address(const TcpTransportOptions& t) {
  ListenAddress a = choose_listen_host(t);
  a.shared_memory = t.shared_memory;
  return a;
}

}  // namespace fsdp::comm::tcp

// Where a rank of the TCP transport listens (private to comm/): the address
// its peers dial, chosen from MASTER_ADDR, GLOO_SOCKET_IFNAME and the host's
// name with c10d Gloo's rules.
#pragma once

#include "fsdp/comm/backends.h"

#include <string>

namespace fsdp::comm::tcp {

// Where a rank listens. The port is chosen per mesh by the OS.
struct ListenAddress {
  std::string host;  // numeric ("127.0.0.1", "10.1.2.3", "fe80::1%eth0")
  std::string how;   // for errors: "loopback (MASTER_ADDR is local)", "interface eth0 (GLOO_SOCKET_IFNAME)"
  // Exchange with the ranks of the same host through shared memory (Note
  // [Shared memory] in shm_transport.cpp); their sockets stay open, silent.
  bool shared_memory = false;
};

// MASTER_ADDR local: 127.0.0.1. Else GLOO_SOCKET_IFNAME's interface (its first
// IPv4 address, else IPv6). Else the address this host's name resolves to, if
// a socket can bind it (c10d's rule for Gloo) — and, when the job spans
// several nodes, if it is not a loopback address. Else, on a single node,
// 127.0.0.1; across nodes, the address of the interface that routes to
// MASTER_ADDR (Note [Advertised address] in listen_address.cpp). Throws
// fsdp::UsageError naming the fix when none of these gives an address.
ListenAddress choose_listen_address(const TcpTransportOptions& options);

// The local address the kernel would send from to reach `destination` (a
// host name or a numeric address), numeric; "" when it does not resolve or
// has no route. Sends nothing.
std::string route_source_address(const std::string& destination);

}  // namespace fsdp::comm::tcp

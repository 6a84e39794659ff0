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
// a socket can bind it (c10d's rule for Gloo). Else, on a single node,
// 127.0.0.1. Throws fsdp::UsageError naming the fix otherwise.
ListenAddress choose_listen_address(const TcpTransportOptions& options);

}  // namespace fsdp::comm::tcp

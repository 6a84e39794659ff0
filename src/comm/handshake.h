// Connecting the ranks of one lane (private to comm/): see Note [Handshake]
// in handshake.cpp.
#pragma once

#include "comm/listen_address.h"
#include "comm/socket.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace fsdp::comm::tcp {

// One connected, nonblocking TCP socket to every other rank of the lane
// (index: the peer's rank; invalid for `rank` itself), TCP_NODELAY set.
// Publishes this rank's address under "lane/<lane>/<rank>" in `store`.
// Blocks until done or `timeout`. A peer started with another world size, or
// another group or lane, is an fsdp::UsageError naming both values; a peer
// that does not show up is an fsdp::Failure naming it.
std::vector<Fd> connect_lane_sockets(c10d::Store& store, const ListenAddress& address, const std::string& group,
                                     const std::string& lane, int rank, int size, std::chrono::milliseconds timeout);

}  // namespace fsdp::comm::tcp

// The transport of the CPU process group (private to comm/): a mesh of
// connections per lane (mesh.h), each peer's bytes through a channel
// (channel.h: TCP, or shared memory on the same host), connected by the
// handshake (handshake.h) on the address listen_address.h chooses.
#pragma once

#include "comm/channel.h"
#include "comm/listen_address.h"
#include "comm/mesh.h"

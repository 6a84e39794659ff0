// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected = 0x82F63B78), the
// checksum of iSCSI, ext4 metadata, LevelDB/RocksDB blocks and gRPC.
//
// Chosen over SHA-256 for checkpoint files because it runs at memory speed:
// x86-64 CPUs with SSE4.2 have a CRC32C instruction (used when the CPU
// reports it, checked once at run time); elsewhere a slicing-by-8 table
// version (~1-2 GB/s). It detects every burst error up to 32 bits and any
// random corruption with probability 1 - 2^-32: a guard against torn writes,
// truncation and bit rot, not against tampering.
//
//   crc32c("123456789") == 0xE3069283
//   crc32c_extend(crc32c(a), b) == crc32c(a + b)
#pragma once

#include <cstddef>
#include <cstdint>

namespace fsdp::checkpoint {

// The CRC-32C of `data[0, n)` continued from `crc` (the CRC of what came
// before; 0 for nothing).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);

inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// True when the hardware instruction is in use (for logs and benchmarks).
bool crc32c_hardware();

}  // namespace fsdp::checkpoint

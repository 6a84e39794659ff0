// Shared helpers of the comm tests: deterministic per-rank inputs, the
// rank-order reference reduction the process groups promise to match bit for
// bit, and free ports.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "fsdp/comm/process_group.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace fsdp::comm::test {

// Rank r's input: identical in every process for the same (rank, n, dtype, seed).
inline at::Tensor input(int rank, int64_t n, at::ScalarType dtype, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed * 1000003ULL + static_cast<uint64_t>(rank));
  if (at::isFloatingType(dtype)) {
    return at::randn({n}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  }
  if (dtype == at::kByte) return at::randint(0, 256, {n}, gen, at::TensorOptions().dtype(dtype));
  return at::randint(-1000000, 1000000, {n}, gen, at::TensorOptions().dtype(dtype));
}

// op over contributions[0], [1], ... in that order; bf16/fp16 accumulate in fp32
// and round once; kAvg divides the sum by the count before rounding.
inline at::Tensor rank_order_reduce(const std::vector<at::Tensor>& contributions, ReduceOp op) {
  const auto dtype = contributions.at(0).scalar_type();
  if (op == ReduceOp::kMax) {
    at::Tensor acc = contributions[0].clone();
    for (size_t i = 1; i < contributions.size(); ++i) acc = at::maximum(acc, contributions[i]);
    return acc;
  }
  const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
  at::Tensor acc = contributions[0].to(half ? at::kFloat : dtype, /*non_blocking=*/false, /*copy=*/true);
  for (size_t i = 1; i < contributions.size(); ++i) acc.add_(contributions[i].to(acc.scalar_type()));
  if (op == ReduceOp::kAvg) acc.div_(static_cast<int64_t>(contributions.size()));
  return acc.to(dtype);
}

// Same dtype, same size, same bytes.
inline ::testing::AssertionResult bits_equal(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type() || actual.numel() != expected.numel()) {
    return ::testing::AssertionFailure() << "got " << actual.scalar_type() << "[" << actual.numel()
                                         << "], expected " << expected.scalar_type() << "["
                                         << expected.numel() << "]";
  }
  const auto a = actual.contiguous();
  const auto e = expected.contiguous();
  if (std::memcmp(a.data_ptr(), e.data_ptr(), a.numel() * a.element_size()) == 0) {
    return ::testing::AssertionSuccess();
  }
  const auto diff = a.ne(e);
  const int64_t first = diff.nonzero().numel() ? diff.nonzero()[0][0].item<int64_t>() : -1;
  auto fa = a.to(at::kDouble), fe = e.to(at::kDouble);
  return ::testing::AssertionFailure()
         << diff.sum().item<int64_t>() << " of " << a.numel() << " elements differ; first at "
         << first << ": got " << (first >= 0 ? fa[first].item<double>() : 0.0) << ", expected "
         << (first >= 0 ? fe[first].item<double>() : 0.0) << "; max |diff| "
         << (fa - fe).abs().max().item<double>();
}

inline std::string label(at::ScalarType t, int64_t n, int world, int rank) {
  return std::string(c10::toString(t)) + " n=" + std::to_string(n) + " world=" +
         std::to_string(world) + " rank=" + std::to_string(rank);
}

// A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace fsdp::comm::test

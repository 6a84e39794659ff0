// Every collective on 1-4 real processes over 127.0.0.1, on each CPU backend: the TCP
// group, c10d's ProcessGroupGloo through our adapter (rank-order reductions), and Gloo
// with its own reductions. Against results each rank computes locally from every
// rank's deterministic input. Sizes that do not divide evenly; fp32, bf16, fp16,
// fp64 and integer types; bit-exact where the contract promises it (reduce_scatter and
// all_reduce sum in rank order), within each dtype's rounding where Gloo sums in
// its own order.
#include <gtest/gtest.h>

#include "comm/comm_test_util.h"
#include "fsdp/comm/process_group.h"
#include "support/multiproc.h"

#include <thread>

namespace fsdp::comm {
namespace {

using test::bits_equal;
using test::input;
using test::label;
using test::rank_order_reduce;

constexpr int64_t kLarge = (1 << 20) + 3;  // ~1M elements, odd

// Whether the group under test sums in rank order (the tcp group, Gloo through
// the adapter's kRankOrder) or in its backend's own order (Gloo's ring), set by
// each TEST before its body runs.
bool g_backend_sums = false;

// The reduced `actual` against the rank-order reference: the same bits, or,
// for a backend's own summation order, the exact sum within the dtype's
// rounding over the ranks (maxima and integer sums are exact in any order).
::testing::AssertionResult reduced_ok(const at::Tensor& actual, const std::vector<at::Tensor>& contributions,
                                      ReduceOp op) {
  const at::Tensor reference = rank_order_reduce(contributions, op);
  const auto dtype = actual.scalar_type();
  if (!g_backend_sums || op == ReduceOp::kMax || !at::isFloatingType(dtype)) return bits_equal(actual, reference);
  at::Tensor exact = at::zeros({actual.numel()}, at::kDouble);
  for (const auto& c : contributions) exact += c.to(at::kDouble);
  if (op == ReduceOp::kAvg) exact /= static_cast<double>(contributions.size());
  const double tol = dtype == at::kBFloat16 ? 3e-2 : dtype == at::kHalf ? 4e-3 : dtype == at::kFloat ? 1e-5 : 1e-12;
  const at::Tensor got = actual.to(at::kDouble);
  if (at::allclose(got, exact, tol, tol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << (got - exact).abs().max().item<double>()
                                       << " from the exact sum, beyond " << tol << " (" << dtype << ")";
}
// Elements per 1 MiB segment of the pipelined reduce (tcp_group.cpp), by element size.
constexpr int64_t kSeg4 = (1 << 20) / 4;
constexpr int64_t kSeg2 = (1 << 20) / 2;

// input() for every dtype that collectives move, int16 and bool included.
at::Tensor moved_input(int rank, int64_t n, at::ScalarType dtype, uint64_t seed) {
  if (dtype == at::kShort || dtype == at::kBool) return input(rank, n, at::kByte, seed).to(dtype);
  return input(rank, n, dtype, seed);
}

void check_all_gather(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  // Every dtype process_group.h moves (Gloo itself refuses int16; the adapter moves bytes).
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kByte, at::kHalf, at::kDouble, at::kShort, at::kBool}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, kLarge}) {
      if (n == kLarge && dtype != at::kFloat) continue;  // one large case keeps the suite fast
      const uint64_t seed = 11 + n;
      std::vector<at::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(moved_input(q, n, dtype, seed));
      const at::Tensor expected = at::cat(all);

      const at::Tensor in = moved_input(r, n, dtype, seed);
      const at::Tensor out = at::empty({w * n}, in.options());
      pg.all_gather(out, in)->wait();
      EXPECT_TRUE(bits_equal(out, expected)) << label(dtype, n, w, r);

      // In place: the rank's own chunk of the output is the input.
      const at::Tensor flat = at::zeros({w * n}, in.options());
      flat.narrow(0, r * n, n).copy_(in);
      pg.all_gather(flat, flat.narrow(0, r * n, n))->wait();
      EXPECT_TRUE(bits_equal(flat, expected)) << "in place " << label(dtype, n, w, r);
    }
  }
  const CommCounters c = pg.counters();
  EXPECT_EQ(c.allgather_calls, 2 * (8 * 4 - 7));
}

void check_reduce_scatter(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  struct Case {
    at::ScalarType dtype;
    ReduceOp op;
    int64_t n;
  };
  std::vector<Case> cases;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
        cases.push_back({dtype, op, n});
    }
    cases.push_back({at::kLong, ReduceOp::kSum, n});
    cases.push_back({at::kInt, ReduceOp::kMax, n});
  }
  cases.push_back({at::kFloat, ReduceOp::kSum, kLarge});
  cases.push_back({at::kBFloat16, ReduceOp::kAvg, kLarge});
  for (const Case& c : cases) {
    const uint64_t seed = 101 + c.n;
    const at::Tensor in = input(r, w * c.n, c.dtype, seed);
    const at::Tensor in_before = in.clone();
    const at::Tensor out = at::empty({c.n}, in.options());
    pg.reduce_scatter(out, in, c.op)->wait();
    std::vector<at::Tensor> contributions;
    for (int q = 0; q < w; ++q)
      contributions.push_back(input(q, w * c.n, c.dtype, seed).narrow(0, r * c.n, c.n));
    const std::string what = label(c.dtype, c.n, w, r) + " op=" + to_string(c.op);
    EXPECT_TRUE(reduced_ok(out, contributions, c.op)) << what;
    EXPECT_TRUE(bits_equal(in, in_before)) << "input modified: " << what;
    if (c.dtype == at::kFloat && c.op == ReduceOp::kSum) {
      // The reference really is the sum (guards against a shared mistake).
      at::Tensor exact = at::zeros({c.n}, at::kDouble);
      for (const auto& t : contributions) exact += t.to(at::kDouble);
      EXPECT_TRUE(at::allclose(out.to(at::kDouble), exact, 1e-5, 1e-5)) << what;
    }
  }
}

void check_all_reduce(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, kLarge}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        if (dtype == at::kLong && op == ReduceOp::kAvg) continue;
        if (n == kLarge && !((dtype == at::kFloat && op == ReduceOp::kSum) ||
                             (dtype == at::kBFloat16 && op == ReduceOp::kAvg))) {
          continue;
        }
        const uint64_t seed = 7 * n + static_cast<int>(op);
        const at::Tensor t = input(r, n, dtype, seed);
        pg.all_reduce(t, op)->wait();
        std::vector<at::Tensor> contributions;
        for (int q = 0; q < w; ++q) contributions.push_back(input(q, n, dtype, seed));
        EXPECT_TRUE(reduced_ok(t, contributions, op)) << label(dtype, n, w, r) << " op=" << to_string(op);
      }
    }
  }
  // Identical bits on every rank: gather everyone's result of a bf16 average.
  const at::Tensor t = input(r, 1001, at::kBFloat16, 5).mul_(r + 1);
  pg.all_reduce(t, ReduceOp::kAvg)->wait();
  const at::Tensor all = at::empty({w * 1001}, t.options());
  pg.all_gather(all, t)->wait();
  for (int q = 0; q < w; ++q)
    EXPECT_TRUE(bits_equal(all.narrow(0, q * 1001, 1001), t)) << "rank " << q;
}

void check_broadcast(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  for (int root = 0; root < w; ++root) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, kLarge}) {
        if (n == kLarge && (dtype != at::kFloat || root != w - 1)) continue;
        const uint64_t seed = 31 + n;
        const at::Tensor t = input(r, n, dtype, seed);
        pg.broadcast(t, root)->wait();
        EXPECT_TRUE(bits_equal(t, input(root, n, dtype, seed)))
            << label(dtype, n, w, r) << " root=" << root;
      }
    }
  }
}

// Sizes on and around the 1 MiB segments the reduce lane pipelines in, in
// every reduced dtype width, and all_reduce sizes that need padding.
void check_segment_boundaries(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  struct Case {
    at::ScalarType dtype;
    int64_t n;
  };
  for (const Case& c : {Case{at::kFloat, kSeg4 - 1}, Case{at::kFloat, kSeg4}, Case{at::kFloat, kSeg4 + 1},
                        Case{at::kFloat, 2 * kSeg4 + 1}, Case{at::kBFloat16, kSeg2 + 1}, Case{at::kHalf, kSeg2},
                        Case{at::kDouble, (1 << 20) / 8 + 3}, Case{at::kLong, (1 << 20) / 8 - 1}}) {
    const std::string what = label(c.dtype, c.n, w, r);
    const uint64_t seed = 500 + c.n;
    const at::Tensor in = input(r, w * c.n, c.dtype, seed);
    const at::Tensor out = at::empty({c.n}, in.options());
    pg.reduce_scatter(out, in, ReduceOp::kSum)->wait();
    std::vector<at::Tensor> contributions;
    for (int q = 0; q < w; ++q) {
      contributions.push_back(input(q, w * c.n, c.dtype, seed).narrow(0, r * c.n, c.n));
    }
    EXPECT_TRUE(reduced_ok(out, contributions, ReduceOp::kSum)) << "reduce_scatter " << what;

    // all_reduce of w*n + 1 elements: chunks of n + 1, the last one padded.
    const int64_t m = w * c.n + 1;
    const at::Tensor t = input(r, m, c.dtype, seed + 1);
    pg.all_reduce(t, ReduceOp::kSum)->wait();
    std::vector<at::Tensor> all;
    for (int q = 0; q < w; ++q) all.push_back(input(q, m, c.dtype, seed + 1));
    EXPECT_TRUE(reduced_ok(t, all, ReduceOp::kSum)) << "all_reduce " << what;
  }
}

// bf16/fp16 sums are accumulated in fp32 and rounded once: equal to the local
// rank-order fp32 reference, and (from 3 ranks) different from summing in the
// half type step by step. The first and last element of every chunk carry a
// case where the two differ: 1 + (w-1) * half an ulp of 1, which step-by-step
// rounds back to 1 at every step. The last ones sit in a chunk's second segment.
void check_half_precision_sums(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const double half_ulp = dtype == at::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;  // at 1.0
    const int64_t n = kSeg2 + 5;
    // Rank q's input of `len` elements in chunks of `chunk`.
    auto contribution = [&](int q, int64_t len, int64_t chunk, uint64_t seed) {
      at::Tensor t = input(q, len, dtype, seed);
      for (int64_t start = 0; start < len; start += chunk) {
        t[start] = q == 0 ? 1.0 : half_ulp;
        t[start + chunk - 1] = q == 0 ? 1.0 : half_ulp;
      }
      return t;
    };
    std::vector<at::Tensor> inputs, chunks;
    for (int q = 0; q < w; ++q) inputs.push_back(contribution(q, w * n, n, 900));
    // reduce_scatter: chunk r of everyone's input.
    const at::Tensor out = at::empty({n}, inputs[0].options());
    pg.reduce_scatter(out, inputs[static_cast<size_t>(r)], ReduceOp::kSum)->wait();
    for (int q = 0; q < w; ++q) chunks.push_back(inputs[static_cast<size_t>(q)].narrow(0, r * n, n));
    EXPECT_TRUE(reduced_ok(out, chunks, ReduceOp::kSum)) << "reduce_scatter " << label(dtype, n, w, r);
    // all_reduce, whose chunks (n/w each) put the crafted elements on ranks 0 and w-1.
    const at::Tensor t = contribution(r, n, n, 901);
    pg.all_reduce(t, ReduceOp::kSum)->wait();
    std::vector<at::Tensor> all;
    for (int q = 0; q < w; ++q) all.push_back(contribution(q, n, n, 901));
    EXPECT_TRUE(reduced_ok(t, all, ReduceOp::kSum)) << "all_reduce " << label(dtype, n, w, r);
    if (w >= 3 && !g_backend_sums) {
      at::Tensor naive = all[0].clone();
      for (int q = 1; q < w; ++q) naive.add_(all[static_cast<size_t>(q)]);  // rounds at every step
      for (int64_t i : {int64_t{0}, n - 1}) {
        EXPECT_EQ(naive[i].item<double>(), 1.0);
        EXPECT_GT(t[i].item<double>(), 1.0) << "element " << i << " summed in the half type";
        EXPECT_GT(out[i].item<double>(), 1.0) << "element " << i << " summed in the half type";
      }
    }
  }
}

// Many collectives back to back on both lanes at once: one thread issues only
// gather-lane work, another only reduce-lane work, neither waits until all are
// issued; then every result is checked.
void check_back_to_back_on_both_lanes(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  constexpr int kOps = 60;
  const at::ScalarType dtypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kLong};
  auto size_of = [](int i) { return int64_t{1} + (int64_t{i} * 7919) % 40000; };
  std::vector<at::Tensor> gather_out(kOps), bcast(kOps), rs_out(kOps), ar(kOps);
  std::vector<WorkPtr> gather_works(kOps), reduce_works(kOps);
  std::thread gather_thread([&] {
    for (int i = 0; i < kOps; ++i) {
      const auto dtype = dtypes[i % 4];
      const int64_t n = size_of(i);
      if (i % 3 == 2) {
        bcast[i] = input(r, n, dtype, 3000 + i);
        gather_works[i] = pg.broadcast(bcast[i], i % w);
      } else if (i % 3 == 1) {  // in place
        gather_out[i] = at::zeros({w * n}, at::TensorOptions().dtype(dtype));
        gather_out[i].narrow(0, r * n, n).copy_(input(r, n, dtype, 3000 + i));
        gather_works[i] = pg.all_gather(gather_out[i], gather_out[i].narrow(0, r * n, n));
      } else {
        gather_out[i] = at::empty({w * n}, at::TensorOptions().dtype(dtype));
        gather_works[i] = pg.all_gather(gather_out[i], input(r, n, dtype, 3000 + i));
      }
    }
  });
  std::thread reduce_thread([&] {
    for (int i = 0; i < kOps; ++i) {
      const auto dtype = dtypes[(i + 1) % 4];
      const int64_t n = size_of(i + kOps);
      if (i % 2 == 0) {
        rs_out[i] = at::empty({n}, at::TensorOptions().dtype(dtype));
        reduce_works[i] = pg.reduce_scatter(rs_out[i], input(r, w * n, dtype, 4000 + i), ReduceOp::kSum);
      } else {
        ar[i] = input(r, n, dtype, 4000 + i);
        reduce_works[i] = pg.all_reduce(ar[i], ReduceOp::kSum);
      }
    }
  });
  gather_thread.join();
  reduce_thread.join();
  for (int i = kOps - 1; i >= 0; --i) {
    reduce_works[i]->wait();
    gather_works[kOps - 1 - i]->wait();
  }
  for (int i = 0; i < kOps; ++i) {
    const auto dtype = dtypes[i % 4];
    const int64_t n = size_of(i);
    if (i % 3 == 2) {
      EXPECT_TRUE(bits_equal(bcast[i], input(i % w, n, dtype, 3000 + i))) << "broadcast " << i;
    } else {
      std::vector<at::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(input(q, n, dtype, 3000 + i));
      EXPECT_TRUE(bits_equal(gather_out[i], at::cat(all))) << "all_gather " << i;
    }
    const auto rdtype = dtypes[(i + 1) % 4];
    const int64_t rn = size_of(i + kOps);
    std::vector<at::Tensor> contributions;
    for (int q = 0; q < w; ++q) {
      contributions.push_back(i % 2 == 0 ? input(q, w * rn, rdtype, 4000 + i).narrow(0, r * rn, rn)
                                         : input(q, rn, rdtype, 4000 + i));
    }
    EXPECT_TRUE(reduced_ok(i % 2 == 0 ? rs_out[i] : ar[i], contributions, ReduceOp::kSum))
        << (i % 2 == 0 ? "reduce_scatter " : "all_reduce ") << i;
  }
}

// Collectives write through raw views: the version counters of the tensors
// they write stay put (FSDP refills parameter buffers this way; a bump would
// invalidate tensors autograd saved).
void check_version_counters(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  const int64_t n = 1001;
  const at::Tensor flat = at::zeros({w * n});
  const at::Tensor shard = at::zeros({n});
  const at::Tensor padded = at::zeros({w * n + 1});  // all_reduce with padding
  const auto v_flat = flat._version();
  const auto v_shard = shard._version();
  const auto v_padded = padded._version();
  pg.all_gather(flat, input(r, n, at::kFloat, 1))->wait();
  pg.all_gather(flat, flat.narrow(0, r * n, n))->wait();
  pg.broadcast(flat, 0)->wait();
  pg.reduce_scatter(shard, input(r, w * n, at::kFloat, 2), ReduceOp::kSum)->wait();
  pg.all_reduce(flat, ReduceOp::kSum)->wait();
  pg.all_reduce(padded, ReduceOp::kAvg)->wait();
  EXPECT_EQ(flat._version(), v_flat);
  EXPECT_EQ(shard._version(), v_shard);
  EXPECT_EQ(padded._version(), v_padded);
}

// All-gathers and reduce-scatters issued before waiting on any: the two lanes
// run concurrently, each in issue order, and waits may come in any order.
void check_async_overlap(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  const int64_t n = 300007;
  std::vector<at::Tensor> gather_out, rs_out, rs_in;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 3; ++i) {
    gather_out.push_back(at::empty({w * n}, at::kFloat));
    works.push_back(pg.all_gather(gather_out.back(), input(r, n, at::kFloat, 1000 + i)));
    rs_in.push_back(input(r, w * n, at::kBFloat16, 2000 + i));
    rs_out.push_back(at::empty({n}, at::kBFloat16));
    works.push_back(pg.reduce_scatter(rs_out.back(), rs_in.back(), ReduceOp::kSum));
  }
  const at::Tensor scalar = at::full({1}, static_cast<double>(r + 1), at::kDouble);
  works.push_back(pg.all_reduce(scalar, ReduceOp::kSum));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (const auto& work : works) EXPECT_TRUE(work->completed());
  EXPECT_EQ(scalar.item<double>(), w * (w + 1) / 2.0);
  for (int i = 0; i < 3; ++i) {
    std::vector<at::Tensor> all, contributions;
    for (int q = 0; q < w; ++q) {
      all.push_back(input(q, n, at::kFloat, 1000 + i));
      contributions.push_back(input(q, w * n, at::kBFloat16, 2000 + i).narrow(0, r * n, n));
    }
    EXPECT_TRUE(bits_equal(gather_out[i], at::cat(all))) << "all_gather " << i;
    EXPECT_TRUE(reduced_ok(rs_out[i], contributions, ReduceOp::kSum)) << "reduce_scatter " << i;
  }
  const CommCounters c = pg.counters();
  EXPECT_EQ(c.allgather_calls, 3);
  const int64_t moved = w > 1 ? 1 : 0;  // a group of one rank moves no bytes
  EXPECT_EQ(c.allgather_bytes, moved * 3 * w * n * 4);
  EXPECT_EQ(c.reduce_scatter_calls, 3);
  EXPECT_EQ(c.reduce_scatter_bytes, moved * 3 * w * n * 2);
  EXPECT_EQ(c.allreduce_calls, 1);
  EXPECT_EQ(c.allreduce_bytes, moved * 8);
}

// One TEST per world size, each running every collective: a worker process
// costs ~1 s of LibTorch start-up, so the cases share processes; SCOPED_TRACE
// and the labels name the collective in failures.
// all_to_all: chunk j of rank r's input (values 1000 r + j, several dtypes and
// sizes) lands in chunk r of rank j's output; and the transport counts (W - 1)
// chunks sent, of the bytes the input holds per chunk.
void check_all_to_all(ProcessGroup& pg) {
  const int w = pg.size(), r = pg.rank();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kByte, at::kShort, at::kBool}) {
    for (int64_t n : {1, 7, 300000}) {
      if (n == 300000 && (dtype == at::kShort || dtype == at::kBool)) continue;
      at::Tensor in = at::empty({w * n}, at::TensorOptions().dtype(at::kFloat));
      for (int j = 0; j < w; ++j) in.narrow(0, j * n, n).fill_((1000 * r + j) % 251);
      in = in.to(dtype);
      at::Tensor out = at::full({w * n}, -1, at::TensorOptions().dtype(dtype));
      const int64_t before = pg.wire_bytes_sent();
      pg.all_to_all(out, in)->wait();
      const int64_t sent = pg.wire_bytes_sent() - before;
      if (before >= 0) {  // -1: the backend cannot tell (c10d's)
        EXPECT_EQ(sent, (w - 1) * n * static_cast<int64_t>(in.element_size())) << dtype << " n=" << n;
      }
      for (int j = 0; j < w; ++j) {
        const double want = (1000 * j + r) % 251;
        EXPECT_TRUE(out.narrow(0, j * n, n).to(at::kDouble).eq(dtype == at::kBool ? double(want != 0) : want).all().item<bool>())
            << dtype << " n=" << n << ": chunk from rank " << j;
      }
    }
  }
  EXPECT_GT(pg.counters().alltoall_calls, 0);
}

void check_everything(ProcessGroup& pg) {
  {
    SCOPED_TRACE("all_to_all");
    check_all_to_all(pg);
  }
  {
    SCOPED_TRACE("all_gather");
    check_all_gather(pg);
  }
  {
    SCOPED_TRACE("reduce_scatter");
    check_reduce_scatter(pg);
  }
  {
    SCOPED_TRACE("all_reduce");
    check_all_reduce(pg);
  }
  {
    SCOPED_TRACE("broadcast");
    check_broadcast(pg);
  }
  {
    SCOPED_TRACE("segment boundaries");
    check_segment_boundaries(pg);
  }
  {
    SCOPED_TRACE("half-precision sums");
    check_half_precision_sums(pg);
  }
  {
    SCOPED_TRACE("back to back on both lanes");
    check_back_to_back_on_both_lanes(pg);
  }
  {
    SCOPED_TRACE("version counters");
    check_version_counters(pg);
  }
  if (pg.size() > 1) {
    SCOPED_TRACE("async overlap");
    pg.reset_counters();
    check_async_overlap(pg);
  }
}

// Each backend at each world size: (test, world size, FSDP_TEST_BACKEND).
void run_everything(int world_size, const std::string& backend) {
  g_backend_sums = backend == "gloo-native";
  testing::run_distributed(
      world_size,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.backend(), backend == "tcp" ? "tcp" : "c10d-gloo");
        check_everything(pg);
      },
      std::chrono::seconds(180), {{"FSDP_TEST_BACKEND", backend}});
}

TEST(Collectives, EveryCollectiveOnOneProcess) { run_everything(1, "tcp"); }
TEST(Collectives, EveryCollectiveOnTwoProcesses) { run_everything(2, "tcp"); }
TEST(Collectives, EveryCollectiveOnThreeProcesses) { run_everything(3, "tcp"); }
TEST(Collectives, EveryCollectiveOnFourProcesses) { run_everything(4, "tcp"); }
// c10d's ProcessGroupGloo under the adapter: the same bits as the TCP group.
TEST(CollectivesGloo, EveryCollectiveOnOneProcess) { run_everything(1, "gloo"); }
TEST(CollectivesGloo, EveryCollectiveOnTwoProcesses) { run_everything(2, "gloo"); }
TEST(CollectivesGloo, EveryCollectiveOnThreeProcesses) { run_everything(3, "gloo"); }
TEST(CollectivesGloo, EveryCollectiveOnFourProcesses) { run_everything(4, "gloo"); }
// Gloo's own reduce_scatter and allreduce: the exact sums within rounding.
TEST(CollectivesGlooNative, EveryCollectiveOnOneProcess) { run_everything(1, "gloo-native"); }
TEST(CollectivesGlooNative, EveryCollectiveOnTwoProcesses) { run_everything(2, "gloo-native"); }
TEST(CollectivesGlooNative, EveryCollectiveOnThreeProcesses) { run_everything(3, "gloo-native"); }
TEST(CollectivesGlooNative, EveryCollectiveOnFourProcesses) { run_everything(4, "gloo-native"); }

}  // namespace
}  // namespace fsdp::comm

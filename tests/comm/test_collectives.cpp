// Every collective on 1-4 real processes (Gloo over 127.0.0.1), against results
// each rank computes locally from every rank's deterministic input. Sizes that
// do not divide evenly; fp32, bf16 and integer types; bit-exact where the
// contract promises it (reduce_scatter and all_reduce sum in rank order).
#include <gtest/gtest.h>

#include "comm/comm_test_util.h"
#include "fsdp/comm/process_group.h"
#include "support/multiproc.h"

namespace fsdp::comm {
namespace {

using test::bits_equal;
using test::input;
using test::label;
using test::rank_order_reduce;

constexpr int64_t kLarge = (1 << 20) + 3;  // ~1M elements, odd

void check_all_gather(ProcessGroup& pg) {
  const int w = pg.size();
  const int r = pg.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kByte}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, kLarge}) {
      if (n == kLarge && dtype != at::kFloat) continue;  // one large case keeps the suite fast
      const uint64_t seed = 11 + n;
      std::vector<at::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(input(q, n, dtype, seed));
      const at::Tensor expected = at::cat(all);

      const at::Tensor in = input(r, n, dtype, seed);
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
  EXPECT_EQ(c.allgather_calls, 2 * (4 * 4 - 3));
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
    EXPECT_TRUE(bits_equal(out, rank_order_reduce(contributions, c.op))) << what;
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
        EXPECT_TRUE(bits_equal(t, rank_order_reduce(contributions, op)))
            << label(dtype, n, w, r) << " op=" << to_string(op);
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
    EXPECT_TRUE(bits_equal(rs_out[i], rank_order_reduce(contributions, ReduceOp::kSum)))
        << "reduce_scatter " << i;
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
void check_everything(ProcessGroup& pg) {
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
  if (pg.size() > 1) {
    SCOPED_TRACE("async overlap");
    pg.reset_counters();
    check_async_overlap(pg);
  }
}

TEST(Collectives, EveryCollectiveOnOneProcess) { testing::run_distributed(1, check_everything); }
TEST(Collectives, EveryCollectiveOnTwoProcesses) { testing::run_distributed(2, check_everything); }
TEST(Collectives, EveryCollectiveOnThreeProcesses) {
  testing::run_distributed(3, check_everything);
}
TEST(Collectives, EveryCollectiveOnFourProcesses) { testing::run_distributed(4, check_everything); }

}  // namespace
}  // namespace fsdp::comm

// Compressed collectives (FsdpOptions::compression, docs/compression.md):
//  - the int8 kernels against a reference computed in double, within their
//    stated error (Note [Block int8] in src/fsdp/quantize.h); stochastic
//    rounding unbiased and reproducible;
//  - the bytes the transport puts on the wire equal what each format promises
//    (gather_wire_bytes / reduce_wire_bytes), counted by the tcp group's meshes;
//  - a short training run per option ends near the native run's loss.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "fsdp/common/error.h"
#include "fsdp/compressed_collectives.h"
#include "fsdp/estimate.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/quantize.h"
#include "parity.h"
#include "support/errors.h"
#include "support/multiproc.h"
#include "toy_models.h"

namespace fsdp {
using detail::Rounding;
using testing::borrow;

namespace {

// Values of many magnitudes, a block of zeros and a block with one large outlier.
std::vector<float> sample(int64_t n, int64_t block, uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor x = torch::randn({n}) * torch::pow(10.0, torch::randint(-3, 3, {n}).to(at::kFloat));
  std::vector<float> v(x.data_ptr<float>(), x.data_ptr<float>() + n);
  for (int64_t i = block; i < std::min(n, 2 * block); ++i) v[static_cast<size_t>(i)] = 0.0f;
  if (n > 3 * block) v[static_cast<size_t>(2 * block + 5)] = 1e6f;
  return v;
}

// Reference scale of element i of a chunk x that holds flat elements
// [start, start + n): max |x| / 127 over its block of the flat grid
// ([kB, (k+1)B) with k = (start + i) / B) cut at the chunk's ends, in double.
double ref_scale(const std::vector<float>& x, int64_t i, int64_t block, int64_t start) {
  const int64_t k = (start + i) / block;
  const int64_t lo = std::max<int64_t>(0, k * block - start);
  const int64_t hi = std::min<int64_t>((k + 1) * block - start, static_cast<int64_t>(x.size()));
  double m = 0;
  for (int64_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(static_cast<double>(x[static_cast<size_t>(j)])));
  return m / 127.0;
}

std::vector<float> roundtrip(const std::vector<float>& x, int64_t block, Rounding r, uint64_t seed,
                             int64_t start = 0) {
  const auto n = static_cast<int64_t>(x.size());
  // Filled with a marker: unused scale slots and the padding must go out as zeros.
  std::vector<uint8_t> wire(static_cast<size_t>(detail::int8_chunk_bytes(n, block)), 0xA5);
  detail::quantize_int8(x.data(), n, start, block, r, seed, wire.data());
  const int64_t used = n == 0 ? 0 : ((start % block) + n + block - 1) / block;
  for (int64_t b = 4 * used; b < 4 * detail::int8_scale_count(n, block); ++b) {
    EXPECT_EQ(wire[static_cast<size_t>(b)], 0) << "unused scale byte " << b;
  }
  for (auto b = static_cast<size_t>(4 * detail::int8_scale_count(n, block) + n); b < wire.size(); ++b) {
    EXPECT_EQ(wire[b], 0) << "padding byte " << b;
  }
  std::vector<float> out(x.size());
  detail::dequantize_int8(wire.data(), n, start, block, out.data());
  return out;
}

}  // namespace

TEST(Quantize, ChunkLayoutIsScalesThenValuesPaddedToEightBytes) {
  // Scale slots: n / B when B divides n; else the most blocks of the flat grid a chunk
  // of n can touch (1000 = 3 x 256 + 232, starting 255 past a grid line: 1 + 3 + 1).
  EXPECT_EQ(detail::int8_scale_count(1024, 256), 4);
  EXPECT_EQ(detail::int8_scale_count(1000, 256), 5);
  EXPECT_EQ(detail::int8_scale_count(1025, 256), 5);  // one past: at most 1 + 4 blocks, or 4 + 1
  EXPECT_EQ(detail::int8_scale_count(7, 1), 7);
  EXPECT_EQ(detail::int8_chunk_bytes(1024, 256), 1040);  // 16 + 1024
  EXPECT_EQ(detail::int8_chunk_bytes(1000, 256), 1024);  // 20 + 1000 -> 1024
  EXPECT_EQ(detail::int8_chunk_bytes(1001, 256), 1024);  // 20 + 1001 -> 1024
  EXPECT_EQ(detail::int8_chunk_bytes(7, 1), 40);         // 28 + 7 -> 40
  EXPECT_EQ(detail::int8_chunk_bytes(0, 256), 0);
  // Every start a chunk can have fits its slots (checked by the kernels themselves).
  for (int64_t n : {1, 2, 255, 257, 1000, 1023}) {
    for (int64_t r = 0; r < 300; ++r) {
      const int64_t start = r * n, used = (start % 256 + n + 255) / 256;
      ASSERT_LE(used, detail::int8_scale_count(n, 256)) << "n " << n << ", rank " << r;
    }
  }
  // What each format promises per element of fp32 parameters or gradients.
  const int64_t n = 1 << 20;
  EXPECT_EQ(detail::gather_wire_bytes(WireFormat::kNative, n, at::kFloat, 256), 4 * n);
  EXPECT_EQ(detail::gather_wire_bytes(WireFormat::kBf16, n, at::kFloat, 256), 2 * n);
  EXPECT_EQ(detail::gather_wire_bytes(WireFormat::kInt8, n, at::kFloat, 256), n + 4 * n / 256);  // 1.0156 per element
  EXPECT_EQ(detail::reduce_wire_bytes(WireFormat::kNative, n, at::kBFloat16, 256), 2 * n);
  EXPECT_EQ(detail::reduce_wire_bytes(WireFormat::kInt8, n, at::kFloat, 64), n + 4 * n / 64);
}

TEST(Quantize, NearestIsWithinHalfAScaleOfTheReference) {
  // The chunks of ranks 0, 1 and 3 of n = 4B + 3 elements (a partial last block): on and off the grid.
  for (const auto& [block, rank] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 0}, {7, 0}, {7, 1}, {7, 3}, {64, 0}, {64, 1}, {64, 3}, {256, 0}, {256, 1}, {256, 3}}) {
    const int64_t n = 4 * block + 3, start = rank * n;
    const std::vector<float> x = sample(n, block, 11);
    const std::vector<float> y = roundtrip(x, block, Rounding::kNearest, 0, start);
    int64_t off_grid = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double s = ref_scale(x, i, block, start);
      const double xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
      // Stated bound: s / 2, plus float rounding of the scale and the product.
      ASSERT_LE(std::fabs(xi - yi), s / 2 * (1 + 1e-5) + 1e-30)
          << "block " << block << " start " << start << " element " << i;
      // On the reference grid: y = s q with q the nearest integer to x / s.
      const double q = std::nearbyint(xi / s);
      if (s > 0 && std::fabs(yi - s * q) > 1e-6 * s * 127) ++off_grid;
    }
    EXPECT_EQ(off_grid, 0) << "block " << block << " start " << start;
    if (rank == 0) {
      for (int64_t i = block; i < 2 * block; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], 0.0f);  // zeros stay exact
    }
  }
}

// Why blocks follow the flat grid (Note [Block int8]): four ranks' chunks of 100
// elements over two parameters, a norm-like weight of 128 ones and then 272 small
// weights (std 0.02), block 64. The parameter boundary, 128, is on the grid; the
// chunks of ranks 1 and 3 start off it. Every small weight is quantized with a
// scale from small weights only, whichever rank holds it: within half of its own
// block's scale, far under the 1 / 254 a shared block with the ones would give.
TEST(Quantize, BlocksFollowTheFlatGridAcrossRanks) {
  const int64_t block = 64, n = 100, ranks = 4, boundary = 128;
  torch::manual_seed(3);
  at::Tensor flat = at::cat({torch::ones({boundary}), 0.02 * torch::randn({ranks * n - boundary})});
  double worst_small = 0, small_amax = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const float* p = flat.data_ptr<float>() + r * n;
    const std::vector<float> x(p, p + n);
    const std::vector<float> y = roundtrip(x, block, Rounding::kNearest, 0, r * n);
    for (int64_t i = 0; i < n; ++i) {
      if (r * n + i < boundary) {
        EXPECT_NEAR(y[static_cast<size_t>(i)], 1.0f, 1e-6) << "rank " << r << " element " << i;
        continue;
      }
      const double err = std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]);
      ASSERT_LE(err, ref_scale(x, i, block, r * n) / 2 * (1 + 1e-5) + 1e-30) << "rank " << r << " element " << i;
      worst_small = std::max(worst_small, err);
      small_amax = std::max(small_amax, std::fabs(static_cast<double>(x[static_cast<size_t>(i)])));
    }
  }
  EXPECT_LE(worst_small, small_amax / 254 * (1 + 1e-5));
  EXPECT_LT(worst_small, 0.25 / 254) << "a small weight shared a scale with the ones";
}

TEST(Quantize, StochasticRoundingIsUnbiasedBoundedAndReproducible) {
  const int64_t block = 32, n = 4 * block;
  const std::vector<float> x = sample(n, block, 5);
  const int trials = 4000;
  std::vector<double> mean(static_cast<size_t>(n), 0.0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<float> y = roundtrip(x, block, Rounding::kStochastic, 1000 + t);
    for (int64_t i = 0; i < n; ++i) {
      const double s = ref_scale(x, i, block, 0);
      ASSERT_LT(std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]), s * (1 + 1e-5) + 1e-30);
      mean[static_cast<size_t>(i)] += y[static_cast<size_t>(i)] / trials;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    // The mean of `trials` draws, each off by less than s: within 5 standard errors of x.
    const double s = ref_scale(x, i, block, 0);
    EXPECT_LE(std::fabs(mean[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]), 5 * s / 2 / std::sqrt(trials) + 1e-30)
        << "element " << i;
  }
  // The same seed gives the same bytes, whatever the number of threads.
  const std::vector<float> big = sample(1 << 18, 256, 9);
  std::vector<uint8_t> a(static_cast<size_t>(detail::int8_chunk_bytes(1 << 18, 256))), b(a.size());
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  detail::quantize_int8(big.data(), 1 << 18, 0, 256, Rounding::kStochastic, 42, a.data());
  at::set_num_threads(2);
  detail::quantize_int8(big.data(), 1 << 18, 0, 256, Rounding::kStochastic, 42, b.data());
  at::set_num_threads(threads);
  EXPECT_EQ(a, b);
  detail::quantize_int8(big.data(), 1 << 18, 0, 256, Rounding::kStochastic, 43, b.data());
  EXPECT_NE(a, b);
}

TEST(Quantize, NonFiniteValuesArriveAsNaNAndDequantizeAddAccumulates) {
  std::vector<float> x = {1.0f, -2.0f, std::numeric_limits<float>::infinity(), 0.5f, 3.0f, 0.25f};
  const std::vector<float> y = roundtrip(x, 3, Rounding::kNearest, 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(i)])) << i;
  EXPECT_NEAR(y[4], 3.0f, 3.0f / 254);
  std::vector<uint8_t> wire(static_cast<size_t>(detail::int8_chunk_bytes(3, 3)));
  const std::vector<float> z = {1.0f, 2.0f, 3.0f};
  detail::quantize_int8(z.data(), 3, 0, 3, Rounding::kNearest, 0, wire.data());
  std::vector<float> acc = {10.0f, 20.0f, 30.0f};
  detail::dequantize_int8_add(wire.data(), 3, 0, 3, acc.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(acc[static_cast<size_t>(i)], 11.0f * (i + 1), 3.0f / 254);
}

namespace {

struct Case {
  const char* name;
  WireFormat gather, reduce;
};
const Case kCases[] = {
    {"native", WireFormat::kNative, WireFormat::kNative},   {"ag bf16", WireFormat::kBf16, WireFormat::kNative},
    {"ag int8", WireFormat::kInt8, WireFormat::kNative},     {"rs bf16", WireFormat::kNative, WireFormat::kBf16},
    {"rs int8", WireFormat::kNative, WireFormat::kInt8},     {"ag int8 + rs bf16", WireFormat::kInt8, WireFormat::kBf16},
};

testing::ToyConfig wide_toy() {
  testing::ToyConfig c;
  c.d_in = 9;
  c.d = 48;
  c.f = 101;  // odd: padding, and int8 blocks that end inside a shard
  c.d_out = 5;
  return c;
}

FsdpOptions with_wire(const Case& c, ShardingStrategy s) {
  FsdpOptions o;
  o.strategy = s;
  o.compression.all_gather = c.gather;
  o.compression.reduce_scatter = c.reduce;
  o.compression.block_size = 64;
  return o;
}

}  // namespace

// One forward and backward: per peer, every all-gather sends gather_wire_bytes of
// this rank's shard (non-root units twice under FULL_SHARD, once under
// SHARD_GRAD_OP and for the root), every reduce-scatter reduce_wire_bytes.
TEST(Compression, BytesOnTheWireAreWhatTheFormatPromises) {
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    for (int w : {2, 3}) {
      testing::run_distributed(w, [&](comm::ProcessGroup& pg) {
        for (const Case& c : kCases) {
          const testing::ToyConfig cfg = wide_toy();
          auto model = testing::make_toy(cfg, false, 3);
          auto sharded = fully_shard(model.ptr(), borrow(pg), with_wire(c, s));
          comm::ProcessGroup& group = *sharded->shard_group();
          auto x = torch::randn({4, cfg.d_in});
          auto y = torch::randn({4, cfg.d_out});
          const int64_t before = group.wire_bytes_sent();
          model->forward(x, y).backward();
          const int64_t sent = group.wire_bytes_sent() - before;
          int64_t expected = 0;
          for (const auto& u : sharded->units()) {
            const int gathers = u.name.empty() || s == ShardingStrategy::kShardGradOp ? 1 : 2;
            expected += gathers * detail::gather_wire_bytes(c.gather, u.shard_numel, at::kFloat, 64);
            expected += detail::reduce_wire_bytes(c.reduce, u.shard_numel, at::kFloat, 64);
          }
          expected *= w - 1;
          EXPECT_EQ(sent, expected) << c.name << ", " << to_string(s) << ", W=" << w;
        }
      });
    }
  }
}

// A compressed reduce-scatter takes the mean itself: what would divide or sum
// the gradients otherwise is refused at the first reduction, with its name and
// the fix, never ignored. An fp16 reduce dtype divides before and after the sum
// (Note in reduce_spec), so it is among them.
TEST(Compression, AReduceThatDividesOrSumsIsRefusedWithACompressedReduceScatter) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    const testing::ToyConfig cfg = wide_toy();
    const auto backward_with = [&](const std::function<void(FsdpOptions&)>& set,
                                   const std::function<void(ShardedModel&)>& after = nullptr) {
      auto model = testing::make_toy(cfg, false, 5);
      FsdpOptions o = with_wire(kCases[4], ShardingStrategy::kFullShard);  // rs int8
      set(o);
      auto sharded = fully_shard(model.ptr(), borrow(pg), o);
      if (after) after(*sharded);
      model->forward(torch::randn({4, cfg.d_in}), torch::randn({4, cfg.d_out})).backward();
    };
    const std::string fp16 = testing::usage_error_of(
        [&] { backward_with([](FsdpOptions& o) { o.mixed_precision.reduce_dtype = at::kHalf; }); });
    EXPECT_CONTAINS(fp16, "computes the mean itself");
    EXPECT_CONTAINS(fp16, "an fp16 reduce dtype");
    EXPECT_CONTAINS(fp16, "reduce in fp32 or bf16");
    const std::string factor = testing::usage_error_of(
        [&] { backward_with([](FsdpOptions&) {}, [](ShardedModel& s) { s.set_gradient_divide_factor(4.0); }); });
    EXPECT_CONTAINS(factor, "a gradient divide factor");
    const std::string sum = testing::usage_error_of([&] {
      backward_with([](FsdpOptions&) {}, [](ShardedModel& s) { s.set_force_sum_reduction_for_comms(true); });
    });
    EXPECT_CONTAINS(sum, "force-sum");
    // bf16 reduce with the same wire trains.
    backward_with([](FsdpOptions& o) { o.mixed_precision.reduce_dtype = at::kBFloat16; });
  });
}

// What a compute sees after a compressed gather: SHARD_GRAD_OP keeps the
// parameters unsharded from forward to the end of backward, so after forward
// each parameter is read and held against the master copy (gather_unit)
// with the format's bound: bf16 within half a unit in the 8th significant
// bit, int8 within half of its block's scale (blocks of 64 elements on the
// flat parameter's grid, cut at each rank's shard).
TEST(Compression, GatheredParametersAreTheMastersWithinTheFormatsError) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    for (const Case& c : kCases) {
      if (c.gather == WireFormat::kNative || c.reduce != WireFormat::kNative) continue;
      const testing::ToyConfig cfg = wide_toy();
      auto model = testing::make_toy(cfg, false, 7);
      auto sharded = fully_shard(model.ptr(), borrow(pg), with_wire(c, ShardingStrategy::kShardGradOp));
      std::vector<at::Tensor> masters;
      for (size_t u = 0; u < sharded->units().size(); ++u) masters.push_back(sharded->gather_unit(u));
      auto x = torch::randn({4, cfg.d_in});
      at::Tensor loss = model->forward(x, torch::randn({4, cfg.d_out}));
      auto params = model->named_parameters(true);
      double worst = 0;  // the largest error as a fraction of its bound
      for (size_t u = 0; u < sharded->units().size(); ++u) {
        const UnitInfo& info = sharded->units()[u];
        const at::Tensor m = masters[u];
        const float* mp = m.data_ptr<float>();
        // The int8 bound of flat element i: half the scale of its block of the flat grid
        // ([64k, 64(k + 1))), cut at the ends of its rank's shard.
        std::vector<double> half_scale(static_cast<size_t>(info.numel), 0.0);
        for (int64_t i = 0; i < info.numel; ++i) {
          const int64_t r = i / info.shard_numel, k = i / 64;
          const int64_t b0 = std::max(r * info.shard_numel, k * 64);
          const int64_t b1 = std::min({(k + 1) * 64, (r + 1) * info.shard_numel, info.numel});
          double amax = 0;
          for (int64_t k = b0; k < b1; ++k) amax = std::max(amax, std::fabs(static_cast<double>(mp[k])));
          half_scale[static_cast<size_t>(i)] = amax / 127 / 2;
        }
        for (const ParamPlacement& p : info.params) {
          at::Tensor got = params[p.name].detach().flatten();
          const float* gp = got.data_ptr<float>();
          for (int64_t k = 0; k < p.numel; ++k) {
            const int64_t i = p.flat_offset + k;
            const double mk = mp[i], err = std::fabs(gp[k] - mk);
            const double bound = c.gather == WireFormat::kBf16 ? std::ldexp(std::fabs(mk), -8) * (1 + 1e-6)
                                                              : half_scale[static_cast<size_t>(i)] * (1 + 1e-5);
            ASSERT_LE(err, bound + 1e-30) << c.name << ": " << p.name << "[" << k << "] = " << gp[k]
                                          << ", master " << mk;
            if (bound > 0) worst = std::max(worst, err / bound);
          }
        }
      }
      EXPECT_GT(worst, 0.2) << c.name << ": the gathered parameters are suspiciously exact";
      loss.backward();
      if (pg.rank() == 0) std::printf("%-20s worst error %.2f of the bound\n", c.name, worst);
    }
  });
}

// One backward of the same model and batch under each reduce-scatter format
// against the native wire: the reduced gradient shards differ by no more
// than the format's rounding allows (relative L2 error: bf16 rounds each
// rank's contribution to 8 significant bits, int8 to 1/127 of its block's
// largest value, stochastically).
TEST(Compression, ReducedGradientsMatchTheNativeWithinTheFormatsError) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    std::vector<at::Tensor> native;
    for (const Case& c : kCases) {
      if (c.gather != WireFormat::kNative) continue;
      const testing::ToyConfig cfg = wide_toy();
      auto model = testing::make_toy(cfg, false, 7);
      auto sharded = fully_shard(model.ptr(), borrow(pg), with_wire(c, ShardingStrategy::kFullShard));
      torch::manual_seed(100 + pg.rank());
      auto x = torch::randn({16, cfg.d_in});
      model->forward(x, torch::sin(x.narrow(1, 0, cfg.d_out) * 2)).backward();
      std::vector<at::Tensor> grads;
      for (const ShardRef& r : sharded->shards()) grads.push_back(r.grad.clone());
      at::Tensor g = torch::cat(grads);
      if (native.empty()) {
        native.push_back(g);
        continue;
      }
      const double err = ((g - native[0]).norm() / native[0].norm()).item<double>();
      const double bound = c.reduce == WireFormat::kInt8 ? 3e-2 : 4e-3;
      EXPECT_LT(err, bound) << c.name;
      EXPECT_GT(err, 0) << c.name << ": the wire format changed nothing";
      if (pg.rank() == 0) {
        std::printf("%-20s relative L2 error of the reduced gradients %.2e (bound %.0e)\n", c.name, err, bound);
      }
    }
  });
}

// 25 AdamW steps of a toy regression on 2 ranks under each option: the loss
// falls as far as the native run's does (to under 1% of the first step's;
// the native run reaches 0.7%), and every rank computes with the same
// parameters.
TEST(Compression, TrainingWithEachOptionConverges) {
  testing::run_distributed(2, [&](comm::ProcessGroup& pg) {
    for (const Case& c : kCases) {
      const testing::ToyConfig cfg = wide_toy();
      auto model = testing::make_toy(cfg, false, 7);
      auto sharded = fully_shard(model.ptr(), borrow(pg), with_wire(c, ShardingStrategy::kFullShard));
      optim::AdamWOptions ao;
      ao.lr = 3e-3;
      optim::AdamW opt(ao);
      opt.add_shards(sharded->shards());
      torch::manual_seed(100 + pg.rank());
      auto x = torch::randn({16, cfg.d_in});
      auto y = torch::sin(x.narrow(1, 0, cfg.d_out) * 2);
      double first = 0, last = 0;
      for (int step = 0; step < 25; ++step) {
        at::Tensor loss = model->forward(x, y);
        loss.backward();
        opt.step();
        sharded->zero_grad();
        at::Tensor mean = loss.detach().clone();
        pg.all_reduce(mean, comm::ReduceOp::kAvg)->wait();
        (step == 0 ? first : last) = mean.item<double>();
      }
      EXPECT_LT(last, 0.01 * first) << c.name << ": the loss did not fall far enough (" << first << " -> " << last << ")";
      if (pg.rank() == 0) std::printf("%-20s loss %.3f -> %.4f\n", c.name, first, last);
      // Every rank decodes the same gathered bytes, its own chunk included: the same input gives
      // the same loss, bit for bit.
      at::Tensor same;
      {
        at::NoGradGuard no_grad;
        torch::manual_seed(9);
        same = model->forward(torch::randn({8, cfg.d_in}), torch::randn({8, cfg.d_out})).detach().reshape({1});
      }
      at::Tensor rank0 = same.clone();
      pg.broadcast(rank0, 0)->wait();
      EXPECT_TRUE(torch::equal(same, rank0)) << c.name << ": rank " << pg.rank() << " computes " << same.item<double>()
                                             << ", rank 0 " << rank0.item<double>();
    }
  });
}

// The step-time model counts the bytes each format puts on the wire (docs/estimate.md):
// per element, 1 + 4 / block for int8, 2 for bf16, the dtype's size natively.
TEST(Compression, TheEstimateCountsTheWireBytes) {
  auto toy = testing::make_toy(wide_toy(), /*meta=*/true, 0).ptr();
  ClusterSpec c;
  c.name = "two nodes";
  c.nodes = 2;
  c.inter = {1e6, 0};
  c.intra = {1e12, 0};
  const auto cost = [](const std::vector<UnitInfo>&) { return UnitCompute{1e-3, 2e-3, -1}; };
  FsdpOptions native;
  FsdpOptions packed = with_wire(kCases[5], ShardingStrategy::kFullShard);  // int8 gathers, bf16 reductions
  const StepEstimate a = estimate_step(toy, native, c, StepWorkload{}, cost);
  const StepEstimate b = estimate_step(toy, packed, c, StepWorkload{}, cost);
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t k = 0; k < a.units.size(); ++k) {
    const int64_t elems = a.units[k].gather_bytes / 4;
    EXPECT_EQ(b.units[k].gather_bytes, static_cast<int64_t>(static_cast<double>(elems) * (1 + 4.0 / 64)));
    EXPECT_EQ(b.units[k].reduce_bytes, a.units[k].reduce_bytes / 2);
    EXPECT_NEAR(b.units[k].all_gather_s / a.units[k].all_gather_s, (1 + 4.0 / 64) / 4, 1e-3);
  }
  EXPECT_LT(b.comm_s, 0.45 * a.comm_s);
  EXPECT_LT(b.step_time_s, a.step_time_s);
}

TEST(Compression, OptionsAreChecked) {
  FsdpOptions o;
  o.compression.block_size = 0;
  EXPECT_THROW(check_options(o, 2), UsageError);
  o.compression.block_size = 256;
  o.compression.all_gather = WireFormat::kInt8;
  o.device = at::Device(at::kCUDA, 0);
  EXPECT_THROW(check_options(o, 2), UsageError);
  o.compression.all_gather = WireFormat::kBf16;  // bf16 gathers are a plain all-gather: any device
  EXPECT_NO_THROW(check_options(o, 2));
  EXPECT_EQ(parse_wire_format("int8", "--x"), WireFormat::kInt8);
  EXPECT_THROW(parse_wire_format("fp8", "--all-gather-wire"), UsageError);
}

}  // namespace fsdp

// BackgroundLoader: same batches as the synchronous path, errors in order, shutdown.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/loader.h"

#include <atomic>
#include <chrono>

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

std::shared_ptr<const TokenDataset> numbered(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 31) % 1009);
  return make_token_dataset(std::move(v), "numbered");
}

// Delegates to a dataset, failing any read that touches position >= fail_from.
class FailingDataset final : public TokenDataset {
 public:
  FailingDataset(std::shared_ptr<const TokenDataset> inner, int64_t fail_from)
      : inner_(std::move(inner)), fail_from_(fail_from) {}
  int64_t size() const override { return inner_->size(); }
  void read(int64_t begin, int64_t count, int32_t* out) const override {
    if (begin + count > fail_from_) FSDP_FAIL("disk on fire at token ", begin);
    inner_->read(begin, count, out);
  }
  std::string locate(int64_t pos) const override { return inner_->locate(pos); }
  std::string describe() const override { return "failing"; }

 private:
  std::shared_ptr<const TokenDataset> inner_;
  int64_t fail_from_;
};

std::shared_ptr<BatchSampler> sampler(std::shared_ptr<const TokenDataset> d, int64_t accum, bool shuffle = true) {
  SamplerOptions o;
  o.seq_len = 8;
  o.batch_size = 3;
  o.world_size = 2;
  o.rank = 1;
  o.grad_accum = accum;
  o.seed = 3;
  o.shuffle = shuffle;
  return std::make_shared<BatchSampler>(std::move(d), o);
}

}  // namespace

TEST(BackgroundLoader, YieldsExactlyTheSynchronousBatches) {
  for (int64_t depth : {1, 2, 5}) {
    const auto s = sampler(numbered(2000), 3);
    BackgroundLoader loader(s, /*start_step=*/0, {depth});
    for (int64_t step = 0; step < 7; ++step) {
      for (int64_t a = 0; a < 3; ++a) {
        const Batch got = loader.next();
        const Batch want = s->get(step, a);
        ASSERT_EQ(got.step, step);
        ASSERT_EQ(got.micro_step, a);
        ASSERT_TRUE(got.inputs.equal(want.inputs)) << "depth " << depth << " step " << step << " micro " << a;
        ASSERT_TRUE(got.targets.equal(want.targets));
      }
    }
  }
}

TEST(BackgroundLoader, ResumesFromAStep) {
  const auto s = sampler(numbered(2000), 2);
  BackgroundLoader loader(s, /*start_step=*/41);
  for (int64_t step = 41; step < 45; ++step) {
    for (int64_t a = 0; a < 2; ++a) {
      const Batch got = loader.next();
      ASSERT_EQ(got.step, step);
      ASSERT_TRUE(got.inputs.equal(s->get(step, a).inputs));
    }
  }
}

TEST(BackgroundLoader, ErrorsArriveInOrderAndStay) {
  // No shuffle, T = 8, B = 3, rank 1 of 2, G = 6: step q reads windows 6q+3 .. 6q+5,
  // i.e. tokens [48q + 24, 48q + 49). Reads past token 100 fail, so steps 0 and 1
  // arrive and step 2 raises.
  const auto s = sampler(std::make_shared<FailingDataset>(numbered(2000), 100), 1, /*shuffle=*/false);
  BackgroundLoader loader(s, 0, {/*queue_depth=*/8});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the producer meet the error first
  int64_t delivered = 0;
  try {
    for (;;) {
      const Batch b = loader.next();
      ASSERT_EQ(b.step, delivered);
      ASSERT_TRUE(b.inputs.equal(s->get(delivered, 0).inputs));
      ++delivered;
    }
  } catch (const fsdp::Failure& e) {
    EXPECT_CONTAINS(e.what(), "disk on fire");
  }
  EXPECT_EQ(delivered, 2);
  EXPECT_CONTAINS(error_of<fsdp::Failure>([&] { loader.next(); }), "disk on fire");  // and stays
}

TEST(BackgroundLoader, ShutsDownWithAFullQueueAndRejectsNextAfterStop) {
  const auto s = sampler(numbered(2000), 1);
  {
    BackgroundLoader loader(s, 0, {4});
    loader.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // producer blocks on a full queue
  }  // the destructor must wake and join it
  BackgroundLoader loader(s, 0, {2});
  loader.stop();
  loader.stop();  // idempotent
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { loader.next(); }), "after stop()");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { BackgroundLoader(s, 0, {0}); }), "queue_depth must be >= 1");
}

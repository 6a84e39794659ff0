// Background loader: a thread that prepares the next batches while the step runs.
//
// It walks the sequence (start_step, 0), (start_step, 1), ..., (start_step, A-1),
// (start_step + 1, 0), ... and calls BatchSampler::get for each, keeping at most
// `queue_depth` finished batches ahead of the consumer. next() returns them in that
// order, so the batches are exactly those of the synchronous path (the sampler is a
// pure function of (step, micro_step)). For an exact resume, construct the loader
// with start_step = the saved step (Note [Resume] in sampler.h).
//
// Errors: an exception thrown while preparing a batch is delivered by the next() call
// that would have returned that batch (after every earlier batch), and rethrown by
// every later call; the thread stops producing.
//
// Shutdown: the destructor (or stop()) wakes the thread and joins it; batches still
// queued are dropped. next() after stop() throws UsageError.
//
// Threading: one consumer thread calls next(); the loader owns its producer thread.
#pragma once

#include "fsdp/data/sampler.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace fsdp::data {

struct LoaderOptions {
  int64_t queue_depth = 2;  // batches prepared ahead of the consumer, >= 1
  // Pin the batches' host memory (for asynchronous copies to the GPU). Ignored when
  // the LibTorch build has no CUDA.
  bool pin_memory = false;
};

class BackgroundLoader {
 public:
  // Starts the thread. UsageError if start_step < 0 or queue_depth < 1.
  BackgroundLoader(std::shared_ptr<const BatchSampler> sampler, int64_t start_step,
                   LoaderOptions options = {});
  ~BackgroundLoader();
  BackgroundLoader(const BackgroundLoader&) = delete;
  BackgroundLoader& operator=(const BackgroundLoader&) = delete;

  // The next batch in order; blocks until it is ready.
  Batch next();
  // Stops and joins the thread. Idempotent.
  void stop();

  const BatchSampler& sampler() const { return *sampler_; }

 private:
  // A queue slot: a batch, or the error raised while preparing it.
  struct Item {
    Batch batch;
    std::exception_ptr error;
  };
  void run();

  std::shared_ptr<const BatchSampler> sampler_;
  LoaderOptions options_;
  int64_t start_step_;

  std::mutex mu_;
  std::condition_variable cv_;  // signalled on push, pop and stop
  std::deque<Item> queue_;      // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::exception_ptr error_;    // guarded by mu_: the error once next() has met it
  std::thread thread_;
};

}  // namespace fsdp::data

// The background loader's producer thread and hand-off.
#include "fsdp/data/loader.h"

#include "fsdp/common/error.h"

namespace fsdp::data {

BackgroundLoader::BackgroundLoader(std::shared_ptr<const BatchSampler> sampler, int64_t start_step,
                                   LoaderOptions options)
    : sampler_(std::move(sampler)), options_(options), start_step_(start_step) {
  FSDP_CHECK(sampler_ != nullptr, "BackgroundLoader needs a sampler, got none");
  FSDP_CHECK(start_step >= 0, "start_step must be >= 0, got ", start_step);
  FSDP_CHECK(options_.queue_depth >= 1, "queue_depth must be >= 1, got ", options_.queue_depth);
  thread_ = std::thread([this] { run(); });
}

BackgroundLoader::~BackgroundLoader() { stop(); }

void BackgroundLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
}

void BackgroundLoader::run() {
  const int64_t accum = sampler_->options().grad_accum;
  for (int64_t q = 0;; ++q) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || static_cast<int64_t>(queue_.size()) < options_.queue_depth; });
      if (stopping_) return;
    }
    // Prepared outside the lock: the consumer keeps taking batches meanwhile.
    Item item;
    try {
      item.batch = sampler_->get(start_step_ + q / accum, q % accum);
      if (options_.pin_memory && at::hasCUDA()) {
        item.batch.inputs = item.batch.inputs.pin_memory();
        item.batch.targets = item.batch.targets.pin_memory();
      }
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;  // the consumer gets the error in order, then on every call
  }
}

Batch BackgroundLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  FSDP_CHECK(!stopping_, "BackgroundLoader::next() called after stop()");
  if (error_) std::rethrow_exception(error_);
  cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  FSDP_CHECK(!stopping_, "BackgroundLoader stopped while next() was waiting");
  Item item = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();  // a slot is free
  if (item.error) {
    {
      std::lock_guard<std::mutex> relock(mu_);
      error_ = item.error;
    }
    std::rethrow_exception(item.error);
  }
  return std::move(item.batch);
}

}  // namespace fsdp::data

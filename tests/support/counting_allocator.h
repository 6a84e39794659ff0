// A CPU allocator that counts what LibTorch allocates through it: the live
// bytes, their peak and the largest single allocation since the last reset.
// Install it with c10::SetCPUAllocator(&counting, priority) and put the
// original back (with a higher priority) when done; keep it alive for the
// process (tensors allocated through it may outlive the test).
#pragma once
#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace fsdp::testing {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr p = inner_->allocate(n);
    auto* ctx = new Ctx{p.release_context(), p.get_deleter(), n, this};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    raise(peak_, now);
    raise(largest_, static_cast<int64_t>(n));
    return {p.get(), ctx, &Ctx::free, p.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  void reset_peak() {
    peak_ = live_.load();
    largest_ = 0;
  }
  int64_t peak() const { return peak_.load(); }
  int64_t live() const { return live_.load(); }
  int64_t largest() const { return largest_.load(); }  // the largest one allocation since reset_peak

 private:
  static void raise(std::atomic<int64_t>& v, int64_t to) {
    int64_t cur = v.load();
    while (to > cur && !v.compare_exchange_weak(cur, to)) {
    }
  }
  struct Ctx {
    void* inner_ctx;
    c10::DeleterFnPtr inner_free;
    size_t n;
    CountingAllocator* owner;
    static void free(void* p) {
      auto* c = static_cast<Ctx*>(p);
      c->inner_free(c->inner_ctx);
      c->owner->live_.fetch_sub(static_cast<int64_t>(c->n));
      delete c;
    }
  };
  c10::Allocator* inner_;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> largest_{0};
};

}  // namespace fsdp::testing

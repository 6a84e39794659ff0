#include "fsdp/common/internals.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <vector>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

namespace fsdp::internals {

// Page-aligned (>= the 64 bytes LibTorch expects) anonymous mappings, cached by
// size up to a byte budget. The allocator object lives inside the shared state:
// storages keep a raw pointer to it, and every block keeps the state alive.
struct HostBufferPool::State final : c10::Allocator {
  explicit State(size_t max_cached) : max_cached_bytes(max_cached) {}
  ~State() override {
    for (auto& [bytes, ptrs] : free)
      for (void* p : ptrs) munmap(p, bytes);
  }

  struct Block {
    void* ptr;
    size_t bytes;
    std::shared_ptr<State> pool;
  };

  static void release(void* ctx) {
    std::unique_ptr<Block> b(static_cast<Block*>(ctx));
    State& s = *b->pool;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.cached + b->bytes <= s.max_cached_bytes) {
        s.free[b->bytes].push_back(b->ptr);
        s.cached += b->bytes;
        return;
      }
    }
    munmap(b->ptr, b->bytes);
  }

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free.find(n);
      if (it != free.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached -= n;
      }
    }
    if (p == nullptr) {
      p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                                       "mmap of " + std::to_string(n) + " bytes failed (out of memory)");
    }
    return c10::DataPtr(p, new Block{p, n, self.lock()}, &State::release, c10::Device(c10::kCPU));
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  const size_t max_cached_bytes;
  std::weak_ptr<State> self;
  mutable std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // bytes -> released blocks of that size
  size_t cached = 0;
};

HostBufferPool::HostBufferPool(size_t max_cached_bytes) : state_(std::make_shared<State>(max_cached_bytes)) {
  state_->self = state_;
}

HostBufferPool::~HostBufferPool() = default;

at::Tensor HostBufferPool::empty(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, state_.get(), /*resizable=*/false);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, {numel}, {1});
}

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->reset();
}

void alloc_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void adopt_storage(const at::Tensor& t, const at::Tensor& from) {
  c10::StorageImpl* src = from.storage().unsafeGetStorageImpl();
  c10::StorageImpl* dst = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = src->nbytes();
  c10::DataPtr bytes = src->set_data_ptr(c10::DataPtr(nullptr, src->device()));
  src->set_nbytes(0);
  dst->set_data_ptr_noswap(std::move(bytes));
  dst->set_nbytes(nbytes);
}

bool storage_allocated(const at::Tensor& t) {
  // nbytes, not data(): a refusing storage throws from data().
  return t.storage().unsafeGetStorageImpl()->nbytes() > 0;
}

c10::Storage refusing_storage(at::Device device, std::string message) {
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                    c10::DataPtr(nullptr, device), nullptr, /*resizable=*/false);
  impl->release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(message));
  return c10::Storage(std::move(impl));
}

void set_storage(const at::Tensor& t, const c10::Storage& storage) {
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(storage);
}

void rebind_data(const at::Tensor& dst, const at::Tensor& src) {
  dst.unsafeGetTensorImpl()->shallow_copy_from(src.getIntrusivePtr());
  reset_grad_accumulator(dst);
}

std::shared_ptr<torch::autograd::Node> grad_accumulator(const at::Tensor& p) {
  return torch::autograd::impl::grad_accumulator(p);
}

void reset_grad_accumulator(const at::Tensor& p) {
  torch::autograd::impl::set_grad_accumulator(p, std::weak_ptr<torch::autograd::Node>());
}

namespace {
struct CallbackPostHook : torch::autograd::FunctionPostHook {
  explicit CallbackPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }
  std::function<void()> fn_;
};
}  // namespace

void add_post_hook(torch::autograd::Node& node, std::function<void()> hook) {
  node.add_post_hook(std::make_unique<CallbackPostHook>(std::move(hook)));
}

void queue_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

}  // namespace fsdp::internals

#include "fsdp/common/internals.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <sys/mman.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

namespace fsdp::internals {

namespace {

struct MmapBlock {
  void* ptr;
  size_t bytes;
};

void unmap_block(void* ctx) {
  auto* b = static_cast<MmapBlock*>(ctx);
  munmap(b->ptr, b->bytes);
  delete b;
}

// Page-aligned (>= the 64 bytes LibTorch expects) anonymous mappings.
struct MmapAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &unmap_block, c10::Device(c10::kCPU));
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                          "mmap of " + std::to_string(n) + " bytes failed (out of memory)");
    return c10::DataPtr(p, new MmapBlock{p, n}, &unmap_block, c10::Device(c10::kCPU));
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

MmapAllocator g_mmap_allocator;  // stateless

}  // namespace

at::Tensor empty_mmap(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, &g_mmap_allocator, /*resizable=*/false);
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

bool storage_allocated(const at::Tensor& t) {
  return t.storage().unsafeGetStorageImpl()->data() != nullptr;
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

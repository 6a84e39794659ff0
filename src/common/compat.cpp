#include "fsdp/common/compat.h"

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

namespace fsdp::compat {

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

}  // namespace fsdp::compat

// The LibTorch internals the engine relies on, behind one small interface: storage
// release and refill (the FSDP1 trick, docs/design.md), rebinding a parameter to a view
// of a flat buffer, and the autograd hooks FSDP needs (AccumulateGrad post-hooks,
// end-of-backward callbacks). Each is checked by a unit test (tests/fsdp,
// tests/common); if a LibTorch release changes one of these internals, this file
// and internals.cpp are the only code to touch.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/headeronly/version.h>

#include <functional>
#include <memory>

namespace fsdp::internals {

// "2.11.0" etc., for logs and --version.
inline const char* torch_version() { return TORCH_VERSION; }

// ---- storage release / refill (the FSDP1 trick; see docs/design.md) -------------
// Releases the bytes of t's storage. Every view of that storage keeps its
// sizes and strides but has no data until alloc_storage.
void free_storage(const at::Tensor& t);
// Gives t's storage `nbytes` fresh, uninitialized bytes from its own
// allocator. Views made earlier (and tensors autograd saved) see the new bytes.
void alloc_storage(const at::Tensor& t, size_t nbytes);
// Gives t's storage the bytes of `from`'s storage (which is left without
// any): a buffer someone else allocated becomes t's, views included.
// Requires: from's storage holds at least t's bytes, on t's device.
void adopt_storage(const at::Tensor& t, const at::Tensor& from);
// Whether t's storage currently holds bytes.
bool storage_allocated(const at::Tensor& t);
// A storage without bytes on `device` whose data any kernel or accessor
// refuses with `message` (a c10::Error) instead of reading a null pointer.
c10::Storage refusing_storage(at::Device device, std::string message);
// Points t (the same TensorImpl: sizes, strides, offset, autograd metadata
// stay) at `storage`.
void set_storage(const at::Tensor& t, const c10::Storage& storage);

// Makes `dst` describe `src`'s data (storage, sizes, strides, dtype, device)
// while keeping its identity: the same TensorImpl, autograd metadata
// (requires_grad) and version counter, so modules and optimizers holding `dst`
// see the change. Unlike Tensor::set_data it also takes a tensor off the meta
// device. Resets dst's cached AccumulateGrad.
void rebind_data(const at::Tensor& dst, const at::Tensor& src);

// Host memory for unsharded buffers: blocks straight from mmap — never from
// malloc, whose dynamic threshold would leave freed unit-sized blocks resident
// in a fragmented heap — with a bounded cache of released blocks reused by
// size. Units of equal size (every decoder layer) then reuse each other's
// pages instead of faulting in (and zeroing) fresh ones for every unit, twice a
// step; at most `max_cached_bytes` is kept beyond what is in use, the rest goes
// back to the system at once. Thread-safe: a block may be released on any
// thread (collective lanes drop their tensors there). Blocks hold the pool's
// state alive, so tensors may outlive the pool object.
class HostBufferPool {
 public:
  explicit HostBufferPool(size_t max_cached_bytes);
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // An empty 1-D tensor of `numel` elements on this pool's memory; its storage
  // allocates from the pool again after free_storage / alloc_storage.
  at::Tensor empty(int64_t numel, at::ScalarType dtype);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// ---- autograd internals ------------------------------------------------------
// The AccumulateGrad node of leaf `p` (created on first use). The tensor keeps
// only a weak reference: hold the returned pointer for as long as hooks on it
// must live.
std::shared_ptr<torch::autograd::Node> grad_accumulator(const at::Tensor& p);
// Forget a cached AccumulateGrad (after set_data changed the metadata).
void reset_grad_accumulator(const at::Tensor& p);
// Runs `hook` after the node ran (for AccumulateGrad: after the gradient was
// accumulated into .grad).
void add_post_hook(torch::autograd::Node& node, std::function<void()> hook);
// Runs `fn` once the current backward pass has finished. Only valid while a
// backward pass is running (from inside a backward function or hook).
void queue_backward_callback(std::function<void()> fn);

}  // namespace fsdp::internals

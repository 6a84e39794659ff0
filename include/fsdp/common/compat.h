// Every LibTorch-version-dependent call lives here (1.13 from Debian on CPU,
// 2.x from the PyTorch wheel on the GPU machine). Code elsewhere calls these
// functions and never tests TORCH_VERSION_* itself.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/version.h>

#include <functional>
#include <memory>

#define FSDP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace fsdp::compat {

// "1.13.1" etc., for logs and --version.
inline const char* torch_version() { return TORCH_VERSION; }

// Whether CPU kernels cover float16 matrix products (LibTorch 1.13's do not:
// "addmm_impl_cpu_ not implemented for 'Half'"; 2.x's do).
inline constexpr bool cpu_half_matmul() { return FSDP_TORCH_AT_LEAST(2, 1); }

// ---- storage release / refill (the FSDP1 trick; see DESIGN.md) -------------
// Releases the bytes of t's storage. Every view of that storage keeps its
// sizes and strides but has no data until alloc_storage.
void free_storage(const at::Tensor& t);
// Gives t's storage `nbytes` fresh, uninitialized bytes from its own
// allocator. Views made earlier (and tensors autograd saved) see the new bytes.
void alloc_storage(const at::Tensor& t, size_t nbytes);
// Whether t's storage currently holds bytes.
bool storage_allocated(const at::Tensor& t);

// Makes `dst` describe `src`'s data (storage, sizes, strides, dtype, device)
// while keeping its identity: the same TensorImpl, autograd metadata
// (requires_grad) and version counter, so modules and optimizers holding `dst`
// see the change. Unlike Tensor::set_data it also takes a tensor off the meta
// device. Resets dst's cached AccumulateGrad.
void rebind_data(const at::Tensor& dst, const at::Tensor& src);

// An empty 1-D tensor of `numel` elements whose storage allocates host memory
// straight from mmap and returns it with munmap — never from malloc, so a
// freed unsharded buffer always goes back to the system and the next unit's
// buffer never lands in a fragmented heap. alloc_storage on it allocates the
// same way. (The Allocator interface changed in LibTorch 2.x; see compat.cpp.)
at::Tensor empty_mmap(int64_t numel, at::ScalarType dtype);

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

}  // namespace fsdp::compat

// ---- models/: attention kernels (appended by models/) ------------------------
namespace fsdp::compat {

// Whether at::scaled_dot_product_attention exists (LibTorch >= 2.0). On 1.13
// models use their eager attention (matmul + masked softmax in fp32).
inline constexpr bool sdpa_available() { return FSDP_TORCH_AT_LEAST(2, 0); }

// Causal attention through at::scaled_dot_product_attention with the default
// scale 1/sqrt(Dh): q, k, v (B, H, T, Dh), same H (repeat kv heads first) ->
// (B, H, T, Dh). Requires: sdpa_available(); returns an undefined tensor otherwise.
inline at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if FSDP_TORCH_AT_LEAST(2, 0)
  // 2.0's signature (2.1 appended an optional scale): mask, dropout_p, is_causal.
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  (void)q;
  (void)k;
  (void)v;
  return at::Tensor();
#endif
}

}  // namespace fsdp::compat
// ---- end models/ block ---------------------------------------------------------

// ---- comm/: CUDA streams for the NCCL process group (appended by comm/) ------
// Compiled only where FSDP_WITH_NCCL is defined (the NCCL group's source).
#if defined(FSDP_WITH_NCCL)
#if defined(FSDP_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif
namespace fsdp::compat {
namespace {  // internal linkage: the body depends on FSDP_WITH_CUDA, set per target

// The caller's current CUDA stream on `device_index`, as an opaque
// cudaStream_t (so this header needs no CUDA headers). With a CUDA LibTorch:
// c10::cuda::getCurrentCUDAStream. With a CPU-only LibTorch (compile checks of
// the NCCL group): the legacy default stream, cudaStreamLegacy.
inline void* current_cuda_stream(int device_index) {
#if defined(FSDP_WITH_CUDA)
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream();
#else
  (void)device_index;
  return reinterpret_cast<void*>(0x1);  // cudaStreamLegacy
#endif
}

}  // namespace
}  // namespace fsdp::compat
#endif  // FSDP_WITH_NCCL
// ---- end comm/ block -----------------------------------------------------------

// Device queries the trainer and the benchmarks need, the same calls on a
// CPU-only build and a CUDA build (cmake -DFSDP_WITH_CUDA=ON against a CUDA
// LibTorch). On a CPU build every CUDA query answers "none" and every CUDA
// request throws fsdp::UsageError saying how to get a CUDA build.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace fsdp {

// Whether this build has the CUDA paths (FSDP_WITH_CUDA).
bool cuda_built();
// CUDA devices this process can see; 0 on a CPU build or without a driver.
int cuda_device_count();

// The device a worker trains on: CPU, or cuda:<local_rank>. Throws
// fsdp::UsageError when `kind` is "cuda" and the build or the machine has no
// CUDA device for that local rank (the message names the counts).
c10::Device worker_device(const std::string& kind, int local_rank);
// The device a worker trains on when the user named one: CPU; "cuda" without
// an index is cuda:<local_rank> (one GPU per local rank, as above); cuda:N is
// GPU N for every local rank — several ranks share it (Note [Several ranks on
// one GPU] in src/comm/launcher.cpp). Throws fsdp::UsageError when the build
// or the machine has no such device (the message names the counts).
c10::Device worker_device(const c10::Device& asked, int local_rank);
// Whether `asked` puts every local rank on one GPU (cuda:N, as above).
inline bool ranks_share_one_gpu(const c10::Device& asked) { return asked.is_cuda() && asked.has_index(); }

// Makes `d` the current CUDA device of this thread (kernels, the caching
// allocator, NCCL communicators all follow it). CPU: nothing.
void set_current_device(const c10::Device& d);

// Blocks the host until every kernel queued on `d` has finished, so host
// timers measure the device's work. CPU: nothing (work is already done).
void synchronize(const c10::Device& d);

// `t` (in host memory) on `d` without the host waiting for the device: on
// CUDA through page-locked memory and a non-blocking copy (a copy from
// pageable memory waits for the device); elsewhere t.to(d). The trainer's
// batches take this path; `t` may be reused once the copy's stream has passed
// it (the page-locked copy is the one read).
at::Tensor to_device_without_waiting(const at::Tensor& t, const c10::Device& d);

// Peak bytes held since start or the last reset_peak_memory: on CUDA the
// caching allocator's peak of allocated bytes on `d` (what the model, its
// activations and buffers used, without the allocator's cached slack); on CPU
// the process's peak resident set (VmHWM). -1 if unavailable.
int64_t peak_memory_bytes(const c10::Device& d);
// Bytes the CUDA caching allocator has handed out on `d` now (live tensors);
// -1 for the CPU (no allocator statistics there).
int64_t allocated_memory_bytes(const c10::Device& d);
// Bytes the live tensors on CUDA device `d` asked for now: allocated_memory_bytes
// before the allocator rounds each block up (to 512 B, and up to 2 MiB for large
// ones), so sums of exact sizes can be compared with it; -1 for the CPU.
int64_t requested_memory_bytes(const c10::Device& d);
// Bytes the CUDA caching allocator holds from the driver now (allocated plus
// cached); CPU: current resident set.
int64_t reserved_memory_bytes(const c10::Device& d);
// Bytes free on CUDA device `d` now (cudaMemGetInfo: what the driver can
// still give this process); CPU: available_host_memory_bytes(). -1 if unknown.
int64_t free_memory_bytes(const c10::Device& d);
// Starts a new peak window. Returns false where the platform cannot (CPU
// kernels that refuse /proc/self/clear_refs).
bool reset_peak_memory(const c10::Device& d);

// While alive, every LibTorch call that would make the host wait for the
// device — a copy to the host, .item(), a stream or device synchronize —
// throws instead (c10's CUDA sync debug mode "error", process-wide), so a test
// can show that a stretch of work has no host synchronization. Nothing on the
// CPU or in a CPU-only build. One at a time.
class ForbidHostSync {
 public:
  explicit ForbidHostSync(const c10::Device& d);
  ~ForbidHostSync();
  ForbidHostSync(const ForbidHostSync&) = delete;
  ForbidHostSync& operator=(const ForbidHostSync&) = delete;

 private:
  bool active_ = false;
  int previous_ = 0;
};

// The device's product name ("NVIDIA H100 80GB HBM3"); "" for the CPU.
std::string device_model(const c10::Device& d);
// Dense (no sparsity) peak FLOP/s of a device model for matrix products in
// `dtype` — the MFU denominator — from the vendor's data sheet, for the GPUs
// this project is run on (H100 SXM/PCIe/NVL, H200, GH200, A100); 0 when unknown
// (a CPU, another GPU, a dtype the table lacks). fp32 is the non-tensor-core
// rate: LibTorch does not use TF32 for fp32 matrix products by default.
double peak_flops(const std::string& model, c10::ScalarType dtype);

}  // namespace fsdp

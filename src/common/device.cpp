// Built with FSDP_WITH_CUDA=1 (a per-source definition, see CMakeLists.txt) in
// CUDA builds; the one place besides the NCCL group where CPU and CUDA builds differ.
#include "fsdp/common/device.h"

#include <ATen/ATen.h>

#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"

#if defined(FSDP_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fsdp {

namespace {
#if defined(FSDP_WITH_CUDA)
c10::DeviceIndex index_of(const c10::Device& d) {
  return d.has_index() ? d.index() : c10::cuda::current_device();
}
// Index 0 of every StatArray is the aggregate over the small and large pools
// (StatType::AGGREGATE in both LibTorch lines).
constexpr size_t kAggregate = 0;
#endif
}  // namespace

bool cuda_built() {
#if defined(FSDP_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if defined(FSDP_WITH_CUDA)
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

c10::Device worker_device(const std::string& kind, int local_rank) {
  FSDP_CHECK(kind == "cpu" || kind == "cuda", "worker_device: kind '", kind, "' is not one of: cpu, cuda");
  if (kind == "cpu") return c10::Device(c10::kCPU);
  FSDP_CHECK(cuda_built(), "worker_device: kind cuda needs a CUDA build of fsdp-cpp (scripts/gpu.sh, or cmake "
             "-DFSDP_WITH_CUDA=ON -DFSDP_WITH_NCCL=ON against a CUDA LibTorch); this build is CPU-only — "
             "use worker_device: kind cpu");
  const int n = cuda_device_count();
  FSDP_CHECK(local_rank < n, "worker_device: kind cuda: local rank ", local_rank, " needs CUDA device ", local_rank,
             " but this process sees ", n, " device", n == 1 ? "" : "s",
             " (CUDA_VISIBLE_DEVICES?); start at most ", n, " processes per node");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

c10::Device worker_device(const c10::Device& asked, int local_rank) {
  if (!ranks_share_one_gpu(asked)) return worker_device(asked.is_cuda() ? "cuda" : "cpu", local_rank);
  worker_device("cuda", /*local_rank=*/0);  // a CUDA build with at least one device, else it says how to get one
  const int n = cuda_device_count();
  FSDP_CHECK(asked.index() < n, "worker_device: kind ", asked.str(), " is not a device of this process: it sees ", n,
             " CUDA device", n == 1 ? "" : "s", " (cuda:0", n > 1 ? detail::cat("..cuda:", n - 1) : "",
             "; CUDA_VISIBLE_DEVICES?)");
  return asked;
}

void set_current_device(const c10::Device& d) {
  if (!d.is_cuda()) return;
#if defined(FSDP_WITH_CUDA)
  c10::cuda::set_device(index_of(d));
#endif
}

void synchronize(const c10::Device& d) {
  if (!d.is_cuda()) return;
#if defined(FSDP_WITH_CUDA)
  c10::cuda::CUDAGuard guard(index_of(d));
  c10::cuda::device_synchronize();
#endif
}

int64_t peak_memory_bytes(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(d)).allocated_bytes[kAggregate].peak;
  }
#endif
  return d.is_cpu() ? peak_rss_bytes() : -1;
}

namespace {
enum class Counted { kAllocated, kRequested };
// The CUDA caching allocator's current bytes on `d` as `what` counts them; -1 elsewhere.
int64_t current_cuda_bytes(const c10::Device& d, Counted what) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(d));
    return (what == Counted::kAllocated ? stats.allocated_bytes : stats.requested_bytes)[kAggregate].current;
  }
#endif
  (void)d;
  (void)what;
  return -1;
}
}  // namespace

int64_t allocated_memory_bytes(const c10::Device& d) { return current_cuda_bytes(d, Counted::kAllocated); }

int64_t requested_memory_bytes(const c10::Device& d) { return current_cuda_bytes(d, Counted::kRequested); }

at::Tensor to_device_without_waiting(const at::Tensor& t, const c10::Device& d) {
  return d.is_cuda() ? t.pin_memory().to(d, /*non_blocking=*/true) : t.to(d);
}

ForbidHostSync::ForbidHostSync(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    previous_ = static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    active_ = true;
  }
#endif
  (void)d;
}

ForbidHostSync::~ForbidHostSync() {
#if defined(FSDP_WITH_CUDA)
  if (active_) c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_));
#endif
}

int64_t reserved_memory_bytes(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(d)).reserved_bytes[kAggregate].current;
  }
#endif
  return d.is_cpu() ? current_rss_bytes() : -1;
}

int64_t free_memory_bytes(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    c10::cuda::CUDAGuard guard(index_of(d));
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error so later CUDA calls do not see it
      return -1;
    }
    return static_cast<int64_t>(free);
  }
#endif
  return d.is_cpu() ? available_host_memory_bytes() : -1;
}

bool reset_peak_memory(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(index_of(d));
    return true;
  }
#endif
  return d.is_cpu() && reset_peak_rss();
}

std::string device_model(const c10::Device& d) {
#if defined(FSDP_WITH_CUDA)
  if (d.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index_of(d)) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    return prop.name;
  }
#endif
  (void)d;
  return {};
}

double peak_flops(const std::string& model, c10::ScalarType dtype) {
  struct Row {
    const char* name_part;  // matched in order: the more specific names first
    double half_tflops;     // bf16 and fp16 tensor cores, dense
    double fp32_tflops;
    double fp8_tflops;      // e4m3 / e5m2 tensor cores, dense (half the data sheet's "with sparsity"); 0: none
  };
  static const Row kTable[] = {
      {"GH200", 989.4, 66.9, 1978.9},   {"H200", 989.4, 66.9, 1978.9},  {"H100 PCIe", 756.5, 51.2, 1513.0},
      {"H100 NVL", 835.5, 60.0, 1670.5}, {"H100", 989.4, 66.9, 1978.9}, {"A100", 312.0, 19.5, 0},
  };
  for (const Row& r : kTable) {
    if (model.find(r.name_part) == std::string::npos) continue;
    if (dtype == c10::kBFloat16 || dtype == c10::kHalf) return r.half_tflops * 1e12;
    if (dtype == c10::kFloat) return r.fp32_tflops * 1e12;
    if (dtype == c10::kFloat8_e4m3fn || dtype == c10::kFloat8_e5m2) return r.fp8_tflops * 1e12;
    return 0;
  }
  return 0;
}

}  // namespace fsdp

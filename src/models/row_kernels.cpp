#include "fsdp/models/row_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#if defined(FSDP_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "fsdp/models/nvrtc.h"
#include "loaded_symbols.h"
#endif

#include "fsdp/common/error.h"
#include "fsdp/models/fp8.h"
#include "twin.h"

namespace fsdp::models {

// Note [Row kernels]
// Two of the fused paths reduce along a row before they can write it: the
// cross-entropy of a chunk of logits (a row's log-sum-exp, then its gradient
// over the row) and the rowwise FP8 quantizer (a row's amax, then the scaled
// cast). LibTorch's operations take several passes over the row for each (the
// composites: logsumexp's max and sum, softmax's three, the scale's; abs,
// amax, the product, the clamp, the cast), and the jiterator cannot reduce.
// Here each is one kernel, one block of lanes per row:
//   1. every lane folds the row's elements lane, lane + L, lane + 2L, ... into
//      a partial (the cross-entropy: a running maximum and the sum of
//      exp(x - maximum), rescaled when the maximum grows — the online softmax;
//      the quantizer: the largest |x|);
//   2. the L partials are combined by a tree, lane i with lane i + s for
//      s = L/2, L/4, ..., 1;
//   3. every lane writes its elements from the row's result (the gradient
//      exp(x - maximum) / sum x scale, minus scale at the target; the e4m3
//      value of x x scale).
// Each row is read twice and written once. The per-lane arithmetic of steps
// 1-3 is written once (FSDP_TWIN): CUDA compiles its text with NVRTC at run
// time for the device's architecture, the CPU twin runs it compiled here over
// the same lanes, in the same order, with the same tree; the block around it
// (threads and __syncthreads on CUDA, loops over the lanes here) is each
// side's own. The twin's results differ from the GPU's only where the
// devices' expf and logf round differently; the quantizer uses no such
// function, so there both sides give the composite's bits exactly (tested on
// the CPU against it; a NaN's sign aside: fabsf clears it, LibTorch's abs
// keeps it). The e4m3 and bf16 roundings are written out in integer
// arithmetic (round to nearest even, as c10's conversions), tested against
// c10's over sweeps of fp32 values. The launch (NVRTC through
// include/fsdp/models/nvrtc.h, and the CUDA driver's cuModuleLoadData and
// cuLaunchKernel, both loaded at run time, on the tensors' current stream)
// compiles the program once per device; CI compiles it for sm_90
// (tests/models/test_kernels_nvrtc.cpp). The CPU twin of the cross-entropy
// runs for bf16 only (Note [Fused cross-entropy] in chunked_loss.cpp says why).
namespace twin {

// What the device's prelude does with __float_as_uint and __uint_as_float.
inline unsigned int fsdp_bits(float f) {
  unsigned int u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float fsdp_float(unsigned int u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Element types and their roundings; the lane counts.
FSDP_TWIN(rows_common,
struct Bf16 { unsigned short bits; };
constexpr int kCeLanes = 1024;
constexpr int kQuantLanes = 256;
inline float f32_of(float v) { return v; }
inline float f32_of(Bf16 v) { return fsdp_float(static_cast<unsigned int>(v.bits) << 16); }
inline unsigned short bf16_bits_of(float v) {
  const unsigned int u = fsdp_bits(v);
  return v != v ? static_cast<unsigned short>(0x7FC0u)
                : static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline void store_f32(float* p, float v) { *p = v; }
inline void store_f32(Bf16* p, float v) { p->bits = bf16_bits_of(v); }
)

// The cross-entropy's lanes. An empty partial (a lane past the row's end) has
// sum 0 and is skipped by the combine.
FSDP_TWIN(ce_rows,
struct MaxSum { float m; float s; };
inline MaxSum max_sum_combine(MaxSum a, MaxSum b) {
  if (a.s == 0.0f) return b;
  if (b.s == 0.0f) return a;
  const float m = a.m > b.m ? a.m : b.m;
  MaxSum r;
  r.m = m;
  r.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);
  return r;
}
template <typename E> MaxSum ce_lane_fold(const E* row, long long n, int lane, int lanes) {
  MaxSum acc;
  acc.m = -3.402823466e+38f;
  acc.s = 0.0f;
  for (long long j = lane; j < n; j += lanes) {
    const float x = f32_of(row[j]);
    if (x > acc.m) {
      acc.s = acc.s * expf(acc.m - x) + 1.0f;
      acc.m = x;
    } else {
      acc.s += expf(x - acc.m);
    }
  }
  return acc;
}
inline float max_sum_nll(MaxSum a, float target_logit) { return (a.m - target_logit) + logf(a.s); }
template <typename E> void ce_lane_grad(E* row, long long n, int lane, int lanes, MaxSum a, float scale, long long t) {
  const float inv_sum = 1.0f / a.s;
  for (long long j = lane; j < n; j += lanes) {
    const float p = expf(f32_of(row[j]) - a.m) * inv_sum;
    store_f32(&row[j], (j == t ? p - 1.0f : p) * scale);
  }
}
)

// The quantizer's lanes: NaN propagates through the amax and the clamp, as
// LibTorch's amax and clamp propagate it (then the row is e4m3's NaN).
FSDP_TWIN(quant_rows,
inline float amax_combine(float a, float b) { return (b > a || b != b) ? b : a; }
template <typename E> float amax_lane(const E* row, long long n, int lane, int lanes) {
  float a = 0.0f;
  for (long long j = lane; j < n; j += lanes) a = amax_combine(a, fabsf(f32_of(row[j])));
  return a;
}
inline float e4m3_scale(float amax) { return (1.0f / (amax < 1e-12f ? 1e-12f : amax)) * 448.0f; }
inline unsigned char e4m3_bits_of(float f) {
  unsigned int bits = fsdp_bits(f);
  const unsigned int sign = bits & 0x80000000u;
  bits ^= sign;
  unsigned char out;
  if (bits >= (1087u << 20)) {
    out = 0x7F;
  } else if (bits < (121u << 23)) {
    const unsigned int magic = 141u << 23;
    out = static_cast<unsigned char>(fsdp_bits(fsdp_float(bits) + fsdp_float(magic)) - magic);
  } else {
    bits += (static_cast<unsigned int>(7 - 127) << 23) + 0x7FFFFu + ((bits >> 20) & 1u);
    out = static_cast<unsigned char>(bits >> 20);
  }
  return static_cast<unsigned char>(out | (sign >> 24));
}
template <typename E>
void quant_lane_cast(const E* row, unsigned char* out, long long n, int lane, int lanes, float scale) {
  for (long long j = lane; j < n; j += lanes) {
    const float v = f32_of(row[j]) * scale;
    out[j] = e4m3_bits_of(v > 448.0f ? 448.0f : (v < -448.0f ? -448.0f : v));
  }
}
)

}  // namespace twin

static_assert(twin::kQuantLanes > 0 && (twin::kCeLanes & (twin::kCeLanes - 1)) == 0 &&
                  (twin::kQuantLanes & (twin::kQuantLanes - 1)) == 0,
              "the tree combines lane i with lane i + s for s = L/2, ..., 1: L a power of two");
static_assert(kFp8AmaxEps == 1e-12f && kE4m3Max == 448.0f, "e4m3_scale and quant_lane_cast spell these constants");

namespace {

// The device side: the bit moves, then the twins' texts, then the blocks.
constexpr const char* kDevicePrelude = R"(
__device__ inline unsigned int fsdp_bits(float f) { return __float_as_uint(f); }
__device__ inline float fsdp_float(unsigned int u) { return __uint_as_float(u); }
)";

constexpr const char* kDeviceBlocks = R"(
// The tree over the lanes' partials (after each lane wrote its own): lane i
// takes lane i + s for s = L/2, ..., 1; every lane gets lane 0's.
template <typename P, typename Combine>
__device__ P combine_lanes(P* part, int lane, int lanes, Combine combine) {
  __syncthreads();
  for (int s = lanes / 2; s > 0; s >>= 1) {
    if (lane < s) part[lane] = combine(part[lane], part[lane + s]);
    __syncthreads();
  }
  return part[0];
}

template <typename E>
__device__ void ce_rows(E* logits, const long long* target, const float* scale, float* nll, long long n) {
  __shared__ MaxSum part[kCeLanes];
  const long long r = blockIdx.x;
  const int lane = threadIdx.x;
  E* row = logits + r * n;
  part[lane] = ce_lane_fold(row, n, lane, kCeLanes);
  const MaxSum all = combine_lanes(part, lane, kCeLanes, max_sum_combine);
  const long long t = target[r];
  if (lane == 0) nll[r] = max_sum_nll(all, f32_of(row[t]));
  if (scale == nullptr) return;
  __syncthreads();  // the target's logit is read before a lane overwrites it
  ce_lane_grad(row, n, lane, kCeLanes, all, scale[r], t);
}

template <typename E>
__device__ void quant_rows(const E* x, unsigned char* out, float* inv_scale, long long n) {
  __shared__ float part[kQuantLanes];
  const long long r = blockIdx.x;
  const int lane = threadIdx.x;
  const E* row = x + r * n;
  part[lane] = amax_lane(row, n, lane, kQuantLanes);
  const float scale = e4m3_scale(combine_lanes(part, lane, kQuantLanes, amax_combine));
  if (lane == 0) inv_scale[r] = 1.0f / scale;
  quant_lane_cast(row, out + r * n, n, lane, kQuantLanes, scale);
}

extern "C" __global__ void __launch_bounds__(kCeLanes)
    fsdp_ce_rows_f32(float* l, const long long* t, const float* s, float* nll, long long n) {
  ce_rows(l, t, s, nll, n);
}
extern "C" __global__ void __launch_bounds__(kCeLanes)
    fsdp_ce_rows_bf16(Bf16* l, const long long* t, const float* s, float* nll, long long n) {
  ce_rows(l, t, s, nll, n);
}
extern "C" __global__ void __launch_bounds__(kQuantLanes)
    fsdp_quant_rows_f32(const float* x, unsigned char* o, float* inv, long long n) {
  quant_rows(x, o, inv, n);
}
extern "C" __global__ void __launch_bounds__(kQuantLanes)
    fsdp_quant_rows_bf16(const Bf16* x, unsigned char* o, float* inv, long long n) {
  quant_rows(x, o, inv, n);
}
)";

// The CPU twin's blocks: the lanes in turn, the same tree; rows in parallel.
template <typename P, typename Combine>
P combine_lanes(std::vector<P>& part, Combine combine) {
  for (size_t s = part.size() / 2; s > 0; s >>= 1) {
    for (size_t lane = 0; lane < s; ++lane) part[lane] = combine(part[lane], part[lane + s]);
  }
  return part[0];
}

template <typename E>
void ce_rows_host(E* logits, const int64_t* target, const float* scale, float* nll, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<twin::MaxSum> part(twin::kCeLanes);
    for (int64_t r = r0; r < r1; ++r) {
      E* row = logits + r * n;
      for (int lane = 0; lane < twin::kCeLanes; ++lane) part[lane] = twin::ce_lane_fold(row, n, lane, twin::kCeLanes);
      const twin::MaxSum all = combine_lanes(part, twin::max_sum_combine);
      nll[r] = twin::max_sum_nll(all, twin::f32_of(row[target[r]]));
      if (scale == nullptr) continue;
      for (int lane = 0; lane < twin::kCeLanes; ++lane) {
        twin::ce_lane_grad(row, n, lane, twin::kCeLanes, all, scale[r], target[r]);
      }
    }
  });
}

template <typename E>
void quant_rows_host(const E* x, unsigned char* out, float* inv_scale, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> part(twin::kQuantLanes);
    for (int64_t r = r0; r < r1; ++r) {
      const E* row = x + r * n;
      for (int lane = 0; lane < twin::kQuantLanes; ++lane) {
        part[lane] = twin::amax_lane(row, n, lane, twin::kQuantLanes);
      }
      const float scale = twin::e4m3_scale(combine_lanes(part, twin::amax_combine));
      inv_scale[r] = 1.0f / scale;
      for (int lane = 0; lane < twin::kQuantLanes; ++lane) {
        twin::quant_lane_cast(row, out + r * n, n, lane, twin::kQuantLanes, scale);
      }
    }
  });
}

// The kernel's element type for a dtype: its name suffix, and the call with
// E = float or twin::Bf16 (both the dtype's bits, read through E).
template <typename F>
void with_element(at::ScalarType dtype, const F& f) {
  if (dtype == at::kFloat) {
    f(float{}, "f32");
  } else {
    FSDP_ASSERT(dtype == at::kBFloat16, "row kernels on ", dtype);
    f(twin::Bf16{}, "bf16");
  }
}

#if defined(FSDP_WITH_CUDA)
// The CUDA driver's entry points used, declared from cuda.h's C API
// (CUresult an int; CUdevice an int; contexts, modules, functions and
// streams pointers), loaded from the libcuda LibTorch's CUDA build loads.
struct Driver {
  int (*device_get)(int*, int) = nullptr;
  int (*ctx_get_current)(void**) = nullptr;
  int (*primary_ctx_retain)(void**, int) = nullptr;
  int (*ctx_set_current)(void*) = nullptr;
  int (*module_load_data)(void**, const void*) = nullptr;
  int (*module_get_function)(void**, void*, const char*) = nullptr;
  int (*launch_kernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                       void**) = nullptr;
  int (*error_string)(int, const char**) = nullptr;

  std::string error(int rc) const {
    const char* text = nullptr;
    if (error_string != nullptr) error_string(rc, &text);
    return "CUDA driver error " + std::to_string(rc) + (text != nullptr ? std::string(" (") + text + ")" : "");
  }
};

const Driver& driver() {
  static const Driver d = [] {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    FSDP_CHECK(handle != nullptr, "cannot load the CUDA driver libcuda.so.1: ", dlerror());
    Driver out;
    const std::string library = "the CUDA driver (libcuda.so.1)";
    const std::string fix = "a driver for CUDA " + std::to_string(CUDART_VERSION / 1000) + " or later is needed";
    bind_symbol(handle, "cuDeviceGet", &out.device_get, library, fix);
    bind_symbol(handle, "cuCtxGetCurrent", &out.ctx_get_current, library, fix);
    bind_symbol(handle, "cuDevicePrimaryCtxRetain", &out.primary_ctx_retain, library, fix);
    bind_symbol(handle, "cuCtxSetCurrent", &out.ctx_set_current, library, fix);
    bind_symbol(handle, "cuModuleLoadData", &out.module_load_data, library, fix);
    bind_symbol(handle, "cuModuleGetFunction", &out.module_get_function, library, fix);
    bind_symbol(handle, "cuLaunchKernel", &out.launch_kernel, library, fix);
    bind_symbol(handle, "cuGetErrorString", &out.error_string, library, fix);
    return out;
  }();
  return d;
}

// The NVRTC of the CUDA LibTorch was built with (libnvrtc.so.<CUDA major>):
// where the library path finds it (as LibTorch's own lazy loader looks), else
// in the wheel's nvidia package beside LibTorch's directory (torch/lib ->
// nvidia/cu<major>/lib, or cuda_nvrtc/lib in CUDA 12's wheels).
std::string nvrtc_library() {
  const std::string major = std::to_string(CUDART_VERSION / 1000);
  const std::string soname = "libnvrtc.so." + major;
  if (dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return soname;
  Dl_info info{};
  std::string torch_lib = "(not found)";
  if (dladdr(reinterpret_cast<void*>(&c10::cuda::device_count), &info) != 0 && info.dli_fname != nullptr) {
    const std::filesystem::path lib = std::filesystem::path(info.dli_fname).parent_path();
    torch_lib = lib.string();
    for (const std::string& package : {"cu" + major, std::string("cuda_nvrtc")}) {
      const std::filesystem::path p = lib / ".." / ".." / "nvidia" / package / "lib" / soname;
      std::error_code ec;
      if (std::filesystem::exists(p, ec)) return p.string();
    }
  }
  FSDP_CHECK(false, "cannot find NVRTC (", soname, ") for the fused kernels: it is neither on the library path nor in "
             "the PyTorch wheel's nvidia packages beside LibTorch's ", torch_lib,
             "; add the wheel's nvidia/cu", major, "/lib to LD_LIBRARY_PATH, or run with StepOptions::kernels "
             "reference and StepOptions::fp8_linear off");
  return soname;
}

// The program's functions on one device, compiled and loaded once.
void* device_function(int device, const std::string& name) {
  static std::mutex mu;
  static std::map<int, std::map<std::string, void*>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto& functions = loaded[device];
  if (functions.empty()) {
    const Driver& d = driver();
    // The context LibTorch's runtime made current for the device (its primary one).
    void* ctx = nullptr;
    d.ctx_get_current(&ctx);
    if (ctx == nullptr) {
      int dev = 0;
      int rc = d.device_get(&dev, device);
      FSDP_ASSERT(rc == 0, "cuDeviceGet(", device, "): ", d.error(rc));
      rc = d.primary_ctx_retain(&ctx, dev);
      FSDP_ASSERT(rc == 0, "cuDevicePrimaryCtxRetain: ", d.error(rc));
      rc = d.ctx_set_current(ctx);
      FSDP_ASSERT(rc == 0, "cuCtxSetCurrent: ", d.error(rc));
    }
    const Nvrtc& nvrtc = Nvrtc::load(nvrtc_library());
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
    const int arch = prop->major * 10 + prop->minor;
    std::string error;
    const std::vector<char> cubin = nvrtc.cubin(row_kernels_program(), arch, &error);
    FSDP_CHECK(!cubin.empty(), "compiling the row kernels for sm_", arch, " with ", nvrtc.path(), " failed: ", error);
    void* module = nullptr;
    int rc = d.module_load_data(&module, cubin.data());
    FSDP_ASSERT(rc == 0, "cuModuleLoadData of the row kernels (sm_", arch, "): ", d.error(rc));
    for (const std::string& entry : row_kernel_entry_points()) {
      void* f = nullptr;
      rc = d.module_get_function(&f, module, entry.c_str());
      FSDP_ASSERT(rc == 0, "cuModuleGetFunction ", entry, ": ", d.error(rc));
      functions[entry] = f;
    }
  }
  auto it = functions.find(name);
  FSDP_ASSERT(it != functions.end(), "no row kernel ", name);
  return it->second;
}

void launch(const at::Tensor& on, const std::string& name, int64_t rows, int lanes, std::vector<void*> args) {
  const c10::cuda::CUDAGuard guard(on.device());
  void* f = device_function(on.get_device(), name);
  FSDP_ASSERT(rows <= 0x7FFFFFFF, "row kernel ", name, " over ", rows, " rows");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(on.get_device()).stream();
  const Driver& d = driver();
  const int rc = d.launch_kernel(f, static_cast<unsigned>(rows), 1, 1, static_cast<unsigned>(lanes), 1, 1, 0, stream,
                                 args.data(), nullptr);
  FSDP_ASSERT(rc == 0, "cuLaunchKernel ", name, " over ", rows, " rows: ", d.error(rc));
}
#endif

}  // namespace

bool row_kernels_take(const at::Tensor& t) {
  return t.defined() && t.dim() == 2 && t.is_contiguous() && t.layout() == at::kStrided &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && (t.is_cpu() || t.is_cuda());
}

at::Tensor online_softmax_cross_entropy(at::Tensor& logits, const at::Tensor& target, const at::Tensor& scale) {
  FSDP_ASSERT(row_kernels_take(logits), "online_softmax_cross_entropy of ", logits.sizes(), " ",
              logits.scalar_type());
  const int64_t rows = logits.size(0), n = logits.size(1);
  FSDP_ASSERT(target.dim() == 1 && target.size(0) == rows && target.scalar_type() == at::kLong &&
                  target.is_contiguous() && target.device() == logits.device(),
              "online_softmax_cross_entropy: target ", target.sizes(), " ", target.scalar_type());
  FSDP_ASSERT(!scale.defined() || (scale.dim() == 1 && scale.size(0) == rows && scale.scalar_type() == at::kFloat &&
                                   scale.is_contiguous() && scale.device() == logits.device()),
              "online_softmax_cross_entropy: scale ", scale.sizes(), " ", scale.scalar_type());
  at::Tensor nll = at::empty({rows}, logits.options().dtype(at::kFloat));
  if (rows == 0) return nll;
  with_element(logits.scalar_type(), [&](auto element, const char* suffix) {
    using E = decltype(element);
    E* data = static_cast<E*>(logits.data_ptr());
    const int64_t* t = target.data_ptr<int64_t>();
    const float* s = scale.defined() ? scale.data_ptr<float>() : nullptr;
    float* out = nll.data_ptr<float>();
    if (logits.is_cpu()) {
      ce_rows_host(data, t, s, out, rows, n);
      return;
    }
#if defined(FSDP_WITH_CUDA)
    long long width = n;
    launch(logits, std::string("fsdp_ce_rows_") + suffix, rows, twin::kCeLanes, {&data, &t, &s, &out, &width});
#else
    (void)suffix;
    FSDP_ASSERT(false, "a CUDA tensor in a build without CUDA");
#endif
  });
  return nll;
}

std::pair<at::Tensor, at::Tensor> quantize_rows_e4m3(const at::Tensor& x) {
  FSDP_ASSERT(row_kernels_take(x), "quantize_rows_e4m3 of ", x.sizes(), " ", x.scalar_type());
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor data = at::empty({rows, n}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor inv_scale = at::empty({rows, 1}, x.options().dtype(at::kFloat));
  if (rows == 0) return {data, inv_scale};
  with_element(x.scalar_type(), [&](auto element, const char* suffix) {
    using E = decltype(element);
    const E* in = static_cast<const E*>(x.const_data_ptr());
    auto* out = static_cast<unsigned char*>(data.data_ptr());
    float* inv = inv_scale.data_ptr<float>();
    if (x.is_cpu()) {
      quant_rows_host(in, out, inv, rows, n);
      return;
    }
#if defined(FSDP_WITH_CUDA)
    long long width = n;
    launch(x, std::string("fsdp_quant_rows_") + suffix, rows, twin::kQuantLanes, {&in, &out, &inv, &width});
#else
    (void)suffix;
    FSDP_ASSERT(false, "a CUDA tensor in a build without CUDA");
#endif
  });
  return {data, inv_scale};
}

const std::string& row_kernels_program() {
  static const std::string program = std::string(kDevicePrelude) + twin::rows_common_code + "\n" +
                                     twin::ce_rows_code + "\n" + twin::quant_rows_code + "\n" + kDeviceBlocks;
  return program;
}

const std::vector<std::string>& row_kernel_entry_points() {
  static const std::vector<std::string> names = {"fsdp_ce_rows_f32", "fsdp_ce_rows_bf16", "fsdp_quant_rows_f32",
                                                 "fsdp_quant_rows_bf16"};
  return names;
}

uint8_t row_kernels_e4m3_bits(float f) { return twin::e4m3_bits_of(f); }
uint16_t row_kernels_bf16_bits(float f) { return twin::bf16_bits_of(f); }

}  // namespace fsdp::models

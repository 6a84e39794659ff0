// Every fused kernel's functor (models::kernel_sources, Note [Kernels and
// their CPU twins]) compiles for sm_90 with NVRTC — the one of the pinned
// wheel's nvidia packages, loaded at run time; no GPU is needed to compile —
// instantiated for float and for a bf16-like type (a struct that converts to
// and from float, as the jiterator's BFloat16 does), so a kernel that does not
// compile fails here and not on the GPU. A broken functor must fail to
// compile, which shows the check can fail.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "fsdp/models/kernels.h"

namespace fsdp::models {
namespace {

// The few NVRTC entry points used (nvrtc.h's C API).
struct Nvrtc {
  using Create = int (*)(void**, const char*, const char*, int, const char* const*, const char* const*);
  using Compile = int (*)(void*, int, const char* const*);
  using Size = int (*)(void*, size_t*);
  using Log = int (*)(void*, char*);
  using Destroy = int (*)(void**);
  void* handle = nullptr;
  void* builtins = nullptr;  // libnvrtc-builtins beside it
  Create create = nullptr;
  Compile compile = nullptr;
  Size log_size = nullptr;
  Log log = nullptr;
  Size cubin_size = nullptr;
  Destroy destroy = nullptr;

  explicit Nvrtc(const std::string& path) {
    // NVRTC opens its builtins library by name at the first compile; the wheel
    // keeps it beside libnvrtc, which no search path of a fresh machine names
    // (a CUDA toolkit's ldconfig entry hid that). Loaded first by its path, it
    // is the library that name finds.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("libnvrtc-builtins.so.", 0) == 0) builtins = dlopen(e.path().c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return;
    create = reinterpret_cast<Create>(dlsym(handle, "nvrtcCreateProgram"));
    compile = reinterpret_cast<Compile>(dlsym(handle, "nvrtcCompileProgram"));
    log_size = reinterpret_cast<Size>(dlsym(handle, "nvrtcGetProgramLogSize"));
    log = reinterpret_cast<Log>(dlsym(handle, "nvrtcGetProgramLog"));
    cubin_size = reinterpret_cast<Size>(dlsym(handle, "nvrtcGetCUBINSize"));
    destroy = reinterpret_cast<Destroy>(dlsym(handle, "nvrtcDestroyProgram"));
  }
  bool ok() const { return create && compile && log_size && log && cubin_size && destroy; }

  // "" when `source` compiles for sm_90 into a non-empty cubin; else the log.
  std::string compile_sm90(const std::string& source) const {
    void* prog = nullptr;
    if (create(&prog, source.c_str(), "kernel.cu", 0, nullptr, nullptr) != 0) return "nvrtcCreateProgram failed";
    // The jiterator's own options (ATen's jit_utils), with sm_90 for the architecture.
    const char* options[] = {"--std=c++17", "-default-device", "--gpu-architecture=sm_90"};
    const int rc = compile(prog, 3, options);
    size_t n = 0, cubin = 0;
    log_size(prog, &n);
    std::string text(n, '\0');
    if (n > 0) log(prog, text.data());
    cubin_size(prog, &cubin);
    destroy(&prog);
    if (rc != 0) return "nvrtc error " + std::to_string(rc) + ": " + text;
    return cubin > 0 ? "" : "an empty cubin";
  }
};

// A kernel over `arity` arrays of T calling the functor `name`, and a bf16-like T.
std::string harness(const KernelSource& k) {
  std::string s = R"(
struct Bf16Like {
  unsigned short bits;
  __device__ Bf16Like(float f) : bits(static_cast<unsigned short>(__float_as_uint(f) >> 16)) {}
  __device__ operator float() const { return __uint_as_float(static_cast<unsigned int>(bits) << 16); }
};
)";
  for (const char* type : {"float", "Bf16Like"}) {
    std::string params, args;
    for (int i = 0; i < k.arity; ++i) {
      params += std::string("const ") + type + "* a" + std::to_string(i) + ", ";
      args += std::string(i ? ", " : "") + "a" + std::to_string(i) + "[i]";
    }
    s += std::string("extern \"C\" __global__ void check_") + k.name + "_" + type + "(" + params + type +
         "* out, long long n) {\n  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + "
         "threadIdx.x;\n  if (i < n) out[i] = " + k.name + "<" + type + ">(" + args + ");\n}\n";
  }
  return s;
}

TEST(KernelsNvrtc, EveryKernelCompilesForSm90) {
  const std::string path = FSDP_NVRTC_LIBRARY;
  ASSERT_FALSE(path.empty()) << "no libnvrtc.so in the Python environment's nvidia packages (configure found none): "
                                "install the pinned torch wheel with scripts/venv.sh";
  const Nvrtc nvrtc(path);
  ASSERT_TRUE(nvrtc.handle != nullptr) << "dlopen " << path << ": " << dlerror();
  ASSERT_TRUE(nvrtc.ok()) << path << " lacks an NVRTC entry point";
  ASSERT_FALSE(kernel_sources().empty());
  for (const KernelSource& k : kernel_sources()) {
    EXPECT_EQ(nvrtc.compile_sm90(std::string(k.code) + "\n" + harness(k)), "") << k.name << ":\n" << k.code;
  }
  const KernelSource broken{"broken", "template <typename T> T broken(T a, T b) { return a + ; }", 2};
  EXPECT_NE(nvrtc.compile_sm90(std::string(broken.code) + "\n" + harness(broken)), "")
      << "a functor with a syntax error compiled: the check cannot fail";
}

}  // namespace
}  // namespace fsdp::models

// Every fused kernel's functor (models::kernel_sources, Note [Kernels and
// their CPU twins]) compiles for sm_90 with NVRTC — the one of the pinned
// wheel's nvidia packages, loaded at run time; no GPU is needed to compile —
// instantiated for float and for a bf16-like type (a struct that converts to
// and from float, as the jiterator's BFloat16 does), so a kernel that does not
// compile fails here and not on the GPU. A broken functor must fail to
// compile, which shows the check can fail. The row kernels' program is
// compiled whole. NVRTC is loaded as the library loads it on a CUDA run
// (models/nvrtc.h), from the wheel's file found at configure time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdp/models/kernels.h"
#include "fsdp/models/nvrtc.h"
#include "fsdp/models/row_kernels.h"

namespace fsdp::models {
namespace {

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

const Nvrtc& wheel_nvrtc() {
  const std::string path = FSDP_NVRTC_LIBRARY;
  if (path.empty()) {
    ADD_FAILURE() << "no libnvrtc.so in the Python environment's nvidia packages (configure found none): install the "
                     "pinned torch wheel with scripts/venv.sh";
  }
  return Nvrtc::load(path);
}

std::string compile_sm90(const std::string& source) {
  std::string error;
  const std::vector<char> cubin = wheel_nvrtc().cubin(source, 90, &error);
  return cubin.empty() ? (error.empty() ? "an empty cubin" : error) : "";
}

TEST(KernelsNvrtc, EveryKernelCompilesForSm90) {
  ASSERT_FALSE(kernel_sources().empty());
  for (const KernelSource& k : kernel_sources()) {
    EXPECT_EQ(compile_sm90(std::string(k.code) + "\n" + harness(k)), "") << k.name << ":\n" << k.code;
  }
  const KernelSource broken{"broken", "template <typename T> T broken(T a, T b) { return a + ; }", 2};
  EXPECT_NE(compile_sm90(std::string(broken.code) + "\n" + harness(broken)), "")
      << "a functor with a syntax error compiled: the check cannot fail";
}

// The row kernels' program (Note [Row kernels]) is compiled whole, as a CUDA
// run compiles it, and every entry point the launcher asks for is in the
// CUBIN (its symbol table names them).
TEST(KernelsNvrtc, RowKernelsCompileForSm90WithEveryEntryPoint) {
  std::string error;
  const std::vector<char> cubin = wheel_nvrtc().cubin(row_kernels_program(), 90, &error);
  ASSERT_FALSE(cubin.empty()) << error << "\n" << row_kernels_program();
  const std::string bytes(cubin.begin(), cubin.end());
  ASSERT_EQ(row_kernel_entry_points().size(), 4u);
  for (const std::string& name : row_kernel_entry_points()) {
    EXPECT_NE(bytes.find(name + '\0'), std::string::npos) << name << " is not in the CUBIN";
  }
  EXPECT_EQ(bytes.find(std::string("fsdp_no_such_kernel") + '\0'), std::string::npos);
  // A program with an error must fail, naming it.
  std::string broken_error;
  EXPECT_TRUE(wheel_nvrtc().cubin(row_kernels_program() + "\nint broken( { }\n", 90, &broken_error).empty());
  EXPECT_NE(broken_error.find("error"), std::string::npos) << broken_error;
}

}  // namespace
}  // namespace fsdp::models

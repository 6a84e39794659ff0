#include "fsdp/models/nvrtc.h"

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "fsdp/common/error.h"
#include "loaded_symbols.h"

namespace fsdp::models {

// The entry points used, declared from nvrtc.h's C API (nvrtcResult is an
// int, nvrtcProgram a pointer), so that nothing here needs CUDA's headers.
struct Nvrtc::Api {
  using Program = void*;
  int (*create)(Program*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  int (*compile)(Program, int, const char* const*) = nullptr;
  int (*log_size)(Program, size_t*) = nullptr;
  int (*log)(Program, char*) = nullptr;
  int (*cubin_size)(Program, size_t*) = nullptr;
  int (*get_cubin)(Program, char*) = nullptr;
  int (*destroy)(Program*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

const Nvrtc& Nvrtc::load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Nvrtc>> opened;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = opened[path];
  if (slot) return *slot;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  FSDP_CHECK(handle != nullptr, "cannot load NVRTC from ", path, ": ", dlerror(),
             " (it comes with the PyTorch wheel's nvidia packages: scripts/venv.sh installs them)");
  auto api = std::make_unique<Api>();
  const std::string library = "NVRTC at " + path;
  const std::string fix = "use the NVRTC of the PyTorch wheel's nvidia packages (scripts/venv.sh installs it)";
  bind_symbol(handle, "nvrtcCreateProgram", &api->create, library, fix);
  bind_symbol(handle, "nvrtcCompileProgram", &api->compile, library, fix);
  bind_symbol(handle, "nvrtcGetProgramLogSize", &api->log_size, library, fix);
  bind_symbol(handle, "nvrtcGetProgramLog", &api->log, library, fix);
  bind_symbol(handle, "nvrtcGetCUBINSize", &api->cubin_size, library, fix);
  bind_symbol(handle, "nvrtcGetCUBIN", &api->get_cubin, library, fix);
  bind_symbol(handle, "nvrtcDestroyProgram", &api->destroy, library, fix);
  bind_symbol(handle, "nvrtcGetErrorString", &api->error_string, library, fix);
  Dl_info info{};
  std::string file = path;
  if (dladdr(reinterpret_cast<void*>(api->create), &info) != 0 && info.dli_fname != nullptr) file = info.dli_fname;
  // The builtins beside it, loaded by path before the first compile opens them by name.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(file).parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("libnvrtc-builtins.so.", 0) == 0) dlopen(e.path().c_str(), RTLD_NOW | RTLD_GLOBAL);
  }
  slot.reset(new Nvrtc());
  slot->api_ = api.release();  // kept for the process, as the library is
  slot->path_ = file;
  return *slot;
}

std::vector<char> Nvrtc::cubin(const std::string& source, int arch, std::string* error) const {
  Api::Program prog = nullptr;
  int rc = api_->create(&prog, source.c_str(), "fsdp_kernels.cu", 0, nullptr, nullptr);
  if (rc != 0) {
    *error = std::string("nvrtcCreateProgram: ") + api_->error_string(rc);
    return {};
  }
  const std::string gpu = "--gpu-architecture=sm_" + std::to_string(arch);
  const char* options[] = {"--std=c++17", "-default-device", gpu.c_str()};
  rc = api_->compile(prog, 3, options);
  size_t n = 0;
  api_->log_size(prog, &n);
  std::string log(n, '\0');
  if (n > 0) api_->log(prog, log.data());
  std::vector<char> out;
  if (rc == 0) {
    size_t size = 0;
    api_->cubin_size(prog, &size);
    out.resize(size);
    if (size > 0) api_->get_cubin(prog, out.data());
    if (size == 0) *error = "NVRTC gave an empty CUBIN for sm_" + std::to_string(arch);
  } else {
    *error = std::string("NVRTC (") + api_->error_string(rc) + ") for sm_" + std::to_string(arch) + ":\n" + log;
  }
  api_->destroy(&prog);
  return out;
}

}  // namespace fsdp::models

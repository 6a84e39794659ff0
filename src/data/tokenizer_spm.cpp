// SentencePiece through libsentencepiece, loaded in isolation.
//
// Note [SentencePiece isolation]. Debian's libsentencepiece.so.0 contains its own
// copy of protobuf-lite (3.14) and exports all of its symbols; LibTorch loads the
// system libprotobuf.so.32 (3.21). Linked into one program, whichever library comes
// first in the global symbol scope serves both: with libsentencepiece first,
// libprotobuf's static initializers run sentencepiece's MergeFromImpl and the
// program dies before main (SIGSEGV in ReflectionOps::FindInitializationErrors —
// google/sentencepiece#723, Lightning-AI/pytorch-lightning#11663); the other order
// would run sentencepiece's 3.14-generated code on the 3.21 runtime.
// So nothing links libsentencepiece. spm_shim.cpp, the only code that includes its
// header, is a separate module loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND):
// RTLD_LOCAL keeps its symbols out of the global scope (LibTorch never sees them)
// and RTLD_DEEPBIND makes libsentencepiece resolve protobuf symbols to its own copy
// first. The only shared state left is GNU-unique symbols (the ShutdownData list
// and constants), identical in layout in both protobuf versions.
// Caveat: sanitizer runtimes refuse RTLD_DEEPBIND; under ASan, SentencePiece
// models cannot be loaded (byte and tiktoken tokenizers are unaffected).
#include "fsdp/common/error.h"
#include "fsdp/data/tokenizer.h"
#include "spm_shim.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

// The build tree's module, defined only in programs built in the tree
// (src/data/CMakeLists.txt generates it); null in a program that links the
// installed library, which names no path of the tree it was built in.
extern "C" const char* fsdp_spm_shim_build_path() __attribute__((weak));

namespace fsdp::data {
namespace {

constexpr const char* kShimName = "libfsdp_spm_shim.so";

struct Shim {
  const FsdpSpmApi* api = nullptr;
  std::string error;  // why no module loaded, when api == nullptr
};

// In this order: the user's choice; the module beside the program or in its
// ../lib (an installed package's own); the build tree's (where the program
// runs from the build); the loader's search path. The build tree's comes
// after the package's own, so an installed program never loads a module of
// the tree it was built in (issue 39).
std::vector<std::string> shim_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("FSDP_SPM_SHIM"); env != nullptr && *env != '\0') out.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kShimName).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / kShimName).string());
  }
  if (fsdp_spm_shim_build_path != nullptr) out.emplace_back(fsdp_spm_shim_build_path());
  out.emplace_back(kShimName);  // the dynamic loader's search path
  return out;
}

Shim load_shim() {
  Shim shim;
  for (const auto& path : shim_candidates()) {
    const bool bare = path.find('/') == std::string::npos;
    if (!bare && !std::filesystem::exists(path)) {
      shim.error += "\n  " + path + ": no such file";
      continue;
    }
    // Never dlclose'd: the module lives as long as the process.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      shim.error += "\n  " + path + ": " + (why != nullptr ? why : "dlopen failed");
      continue;
    }
    auto fn = reinterpret_cast<FsdpSpmApiFn>(::dlsym(handle, "fsdp_spm_api"));
    const FsdpSpmApi* api = fn != nullptr ? fn() : nullptr;
    if (api == nullptr || api->version != kFsdpSpmApiVersion) {
      shim.error += "\n  " + path + ": not a matching fsdp_spm_shim (stale build?)";
      continue;
    }
    shim.api = api;
    return shim;
  }
  return shim;
}

// Loaded once per process, on first use; immutable afterwards.
const Shim& shim() {
  static const Shim instance = load_shim();
  return instance;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  const FsdpSpmApi* api = nullptr;
  void* handle = nullptr;
  ~Impl() {
    if (handle != nullptr) api->destroy(handle);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), impl_(std::make_unique<Impl>()) {
  const Shim& s = shim();
  if (s.api == nullptr)
    FSDP_FAIL("cannot load the SentencePiece module ", kShimName, " needed for tokenizer '", model_path,
              "'. Tried:", s.error, "\n— build the fsdp_spm_shim target (it is built with fsdp_data), or set ",
              "FSDP_SPM_SHIM to its path");
  impl_->api = s.api;
  std::string error;
  impl_->handle = s.api->load(model_path.c_str(), &error);
  FSDP_CHECK(impl_->handle != nullptr, "tokenizer '", model_path, "' is neither a tiktoken BPE file (lines ",
             "\"<base64 token> <rank>\") nor a SentencePiece model that loads (", error,
             ") — check the path and that the file is complete");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  std::string error;
  if (!impl_->api->encode(impl_->handle, text.data(), text.size(), &ids, &error))
    FSDP_FAIL("SentencePiece encode failed (", path_, "): ", error);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const int32_t v = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    FSDP_CHECK(ids[i] >= 0 && ids[i] < v, "SentencePiece tokenizer ", path_, ": cannot decode id ", ids[i],
               " at position ", i, ": ids must be in [0, ", v, ") — were these ids made by another tokenizer?");
  }
  const std::vector<int> in(ids.begin(), ids.end());
  std::string text, error;
  if (!impl_->api->decode(impl_->handle, in.data(), in.size(), &text, &error))
    FSDP_FAIL("SentencePiece decode failed (", path_, "): ", error);
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const { return impl_->api->piece_size(impl_->handle); }
int32_t SentencePieceTokenizer::bos_id() const { return impl_->api->bos_id(impl_->handle); }
int32_t SentencePieceTokenizer::eos_id() const { return impl_->api->eos_id(impl_->handle); }

}  // namespace fsdp::data

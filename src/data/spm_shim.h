// The interface between fsdp_data and the SentencePiece shim module (spm_shim.cpp).
// Both sides are built from this tree with the same compiler and share the
// process's libstdc++, so std::string and std::vector may cross it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

// Bumped whenever FsdpSpmApi changes, so a stale module is refused.
constexpr int kFsdpSpmApiVersion = 1;

extern "C" {
struct FsdpSpmApi {
  int version;
  // A processor handle, or nullptr with *error set.
  void* (*load)(const char* path, std::string* error);
  void (*destroy)(void* handle);
  bool (*encode)(void* handle, const char* text, size_t len, std::vector<int>* ids, std::string* error);
  bool (*decode)(void* handle, const int* ids, size_t n, std::string* text, std::string* error);
  int (*piece_size)(void* handle);
  int (*bos_id)(void* handle);
  int (*eos_id)(void* handle);
};
// The module's one exported symbol.
const FsdpSpmApi* fsdp_spm_api();
typedef const FsdpSpmApi* (*FsdpSpmApiFn)();
}

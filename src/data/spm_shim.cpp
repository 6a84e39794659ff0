// The only translation unit that touches libsentencepiece. Built as its own shared
// module and loaded at run time: see Note [SentencePiece isolation] in
// tokenizer_spm.cpp.
#include "spm_shim.h"

#include <sentencepiece_processor.h>

#include <memory>

namespace {

using sentencepiece::SentencePieceProcessor;

SentencePieceProcessor* cast(void* h) { return static_cast<SentencePieceProcessor*>(h); }

void* load(const char* path, std::string* error) {
  auto sp = std::make_unique<SentencePieceProcessor>();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return sp.release();
}

void destroy(void* h) { delete cast(h); }

bool encode(void* h, const char* text, size_t len, std::vector<int>* ids, std::string* error) {
  const auto status = cast(h)->Encode(std::string_view(text, len), ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool decode(void* h, const int* ids, size_t n, std::string* text, std::string* error) {
  const auto status = cast(h)->Decode(std::vector<int>(ids, ids + n), text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int piece_size(void* h) { return cast(h)->GetPieceSize(); }
int bos_id(void* h) { return cast(h)->bos_id(); }
int eos_id(void* h) { return cast(h)->eos_id(); }

const FsdpSpmApi kApi = {kFsdpSpmApiVersion, load, destroy, encode, decode, piece_size, bos_id, eos_id};

}  // namespace

extern "C" __attribute__((visibility("default"))) const FsdpSpmApi* fsdp_spm_api() { return &kApi; }

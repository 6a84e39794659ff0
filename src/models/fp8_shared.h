// One quantization of an input that several FP8 linears read (Note [One
// quantization of a shared input] in fp8.cpp). Internal to the models.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "fsdp/models/fp8.h"

namespace fsdp::models {

// While it lives, on this thread, the FP8 linears whose input is `x`'s
// values (the same storage, offset, rows and version, whatever the view)
// quantize it once: the first computes its rows' quantization, the others
// reuse it. Scopes nest; the innermost one is asked.
class SharedFp8Input {
 public:
  explicit SharedFp8Input(const at::Tensor& x);
  ~SharedFp8Input();
  SharedFp8Input(const SharedFp8Input&) = delete;
  SharedFp8Input& operator=(const SharedFp8Input&) = delete;

  // quantize_rowwise(rows), once per scope for rows over the scope's input;
  // for another tensor, quantize_rowwise(rows) itself.
  static Fp8Rows quantize(const at::Tensor& rows);
  // How many quantizations the scopes on this thread have saved (for tests).
  static int64_t reused();

 private:
  at::Tensor rows_;  // x folded to (N, in)
  uint32_t version_ = 0;
  std::optional<Fp8Rows> q_;
  SharedFp8Input* outer_ = nullptr;
};

}  // namespace fsdp::models

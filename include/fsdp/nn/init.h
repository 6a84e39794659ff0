// Name-keyed, counter-based parameter initialization.
//
// Element i of parameter `name` is a pure function of (seed, name, i). Any
// slice of any parameter can therefore be initialized on its own — a rank
// materializing only its shard from the meta device gets exactly the values an
// unsharded run gets, whatever the world size.
//
// The stream: a 64-bit key from (seed, FNV-1a of the name); for element i,
// SplitMix64(key ^ mix(i)) gives two 32-bit halves -> uniforms in (0,1) ->
// Box–Muller (cosine branch) for normals. Values are computed in double and
// rounded once to the tensor's dtype.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>

namespace torch::nn {
class Module;
}

namespace fsdp::nn {

struct InitRule {
  enum class Kind { kNormal, kUniform, kZeros, kOnes, kConstant };
  Kind kind = Kind::kNormal;
  double a = 0.02;  // kNormal: std (mean 0); kUniform: bound (U(-a, a)); kConstant: value
  // Flattened elements [zero_begin, zero_end) are zero whatever the kind (an
  // embedding's padding row, as torch.nn.Embedding(padding_idx) initializes it).
  int64_t zero_begin = 0;
  int64_t zero_end = 0;
  static InitRule normal(double std) { return {Kind::kNormal, std}; }
  static InitRule uniform(double bound) { return {Kind::kUniform, bound}; }
  static InitRule zeros() { return {Kind::kZeros, 0.0}; }
  static InitRule ones() { return {Kind::kOnes, 0.0}; }
  static InitRule constant(double v) { return {Kind::kConstant, v}; }
  InitRule with_zeros(int64_t begin, int64_t end) const {
    InitRule r = *this;
    r.zero_begin = begin;
    r.zero_end = end;
    return r;
  }
};

// Maps a fully qualified parameter name to its rule.
using InitRuleFn = std::function<InitRule(const std::string& name)>;

// Fills `out` (any dtype, contiguous, CPU or CUDA) with elements
// [first, first + out.numel()) of parameter `name`'s flattened value.
void init_slice(const at::Tensor& out, const InitRule& rule, uint64_t seed, const std::string& name,
                int64_t first);

// Initializes every parameter of `module` in place (unsharded runs and the
// reference of parity tests). Names are those of module.named_parameters().
void init_module(torch::nn::Module& module, const InitRuleFn& rules, uint64_t seed);

}  // namespace fsdp::nn

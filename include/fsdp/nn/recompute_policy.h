// What activation checkpointing recomputes (Note [Recompute policy] in
// src/nn/recompute.cpp; the marks that act on it are in recompute.h). Apart
// from recompute.h so that what only names a policy — the step-time model's
// counted work (models/op_work.h), configs read without LibTorch — needs no
// ATen.
#pragma once

#include <optional>
#include <string_view>

namespace fsdp::nn {

enum class RecomputePolicy {
  kFull,       // backward re-runs the whole forward, every product
  kTail,       // ... except the products marked kTail (their outputs are not read by backward)
  kSelective,  // kTail, and keeps the outputs marked kKept (and attention's) from forward instead of recomputing them
};
const char* to_string(RecomputePolicy policy);  // "full" | "tail" | "selective"
// nullopt for any other name.
std::optional<RecomputePolicy> parse_recompute_policy(std::string_view name);

}  // namespace fsdp::nn

// LoRA: low-rank adapters on chosen projections (Hu et al. 2021,
// arXiv:2106.09685), with the semantics, names and initialization of peft's
// LoraConfig / LoraLayer (vanilla LoRA: no rslora, no DoRA, no bias).
//
// apply_lora gives every targeted Linear (models/layers.h) an adapter
//   <linear>.lora_A.weight   (r, in)    kaiming_uniform(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
//   <linear>.lora_B.weight   (out, r)   zeros
// so the adapted model computes what the base model computes until B moves,
// and freezes every other parameter (requires_grad false). The names are
// peft's saved names without its "base_model.model." prefix
// (checkpoint/peft.h writes and reads that form).
//
// Order: apply_lora runs after the model is built and BEFORE fully_shard (the
// engine lays out the parameters registered when it runs, and takes which are
// frozen from requires_grad then). It walks named_modules(), so any model
// built from models::Linear works (Llama's q/k/v/o and gate/up/down
// projections, an MoE's expert w1/w2/w3).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/nn/init.h"

namespace torch::nn {
class Module;
}

namespace fsdp::models {

struct LoraConfig {
  int64_t rank = 8;     // r >= 1
  double alpha = 16;    // > 0; the adapter's output is scaled by alpha / r
  double dropout = 0;   // [0, 1): on the adapter's input, in training mode only
  // Linear layers whose last name component is one of these get an adapter
  // (peft's target_modules as a list of names).
  std::vector<std::string> targets = default_lora_targets();

  // The attention projections, as most Llama LoRA recipes.
  static std::vector<std::string> default_lora_targets() { return {"q_proj", "k_proj", "v_proj", "o_proj"}; }
};

// --lora-targets' spelling (fsdp-train's and fsdp-inspect's): "q_proj,v_proj"
// -> {"q_proj", "v_proj"} (spaces around names ignored). UsageError for an
// empty name; check_lora_config and apply_lora check the names.
std::vector<std::string> parse_lora_targets(const std::string& s);

// UsageError naming the value and the fix: rank < 1, alpha not finite, <= 0
// or beyond a 32-bit float (alpha / rank scales float outputs), dropout outside [0, 1), no targets, an empty or repeated target.
void check_lora_config(const LoraConfig& cfg);

// UsageError naming `dir` and LoraConfig::alpha when `adapter` (its
// adapter_config.json) has another alpha than the run's `run_alpha`: loading
// it would silently rescale its output from adapter.alpha / r to run_alpha / r.
// fsdp-train takes the adapter's alpha when --lora-alpha is not given, so
// only an explicit, different --lora-alpha is refused.
void check_adapter_alpha(const std::string& dir, const LoraConfig& adapter, double run_alpha);

// Adds an adapter to every Linear of `module` whose last name component is in
// cfg.targets, then sets requires_grad false on every parameter that is not
// an adapter's. Parameters on a real device are initialized at once (the
// values lora_init_rule gives, keyed by name and `seed`); on kMeta the
// engine's init rule must be lora_init_rule. Dropout masks are keyed by
// `seed` and each layer's name (set_lora_dropout_key adds the micro-batch).
// Returns the qualified names of the adapted Linear layers, in
// named_modules() order.
// Throws UsageError: check_lora_config's refusals; a target that matches no
// Linear (naming the Linear names the model has); a Linear that already has
// an adapter (apply_lora called twice).
std::vector<std::string> apply_lora(torch::nn::Module& module, const LoraConfig& cfg, uint64_t seed);

// True for "<linear>.lora_A.weight" and "<linear>.lora_B.weight".
bool is_lora_parameter(const std::string& name);

// The init rule of a model with adapters: kaiming_uniform(a = sqrt(5)) for
// each lora_A (its bound 1/sqrt(in) read from `module`), zeros for each
// lora_B, `base` for everything else. Requires: apply_lora done on `module`.
nn::InitRuleFn lora_init_rule(torch::nn::Module& module, nn::InitRuleFn base);

// Sets the key of the dropout masks of every adapter of `module` for the next
// forwards (e.g. a hash of the step and micro-batch). A forward run again with
// the same key (activation checkpointing's recompute) draws the same masks.
void set_lora_dropout_key(torch::nn::Module& module, uint64_t key);

// W + (B A) * scaling, as peft's merge (get_delta_weight), computed in fp32:
// W (out, in), A (r, in), B (out, r) of any float dtypes -> (out, in) fp32.
at::Tensor merge_lora_weight(const at::Tensor& weight, const at::Tensor& lora_A, const at::Tensor& lora_B,
                             double scaling);

}  // namespace fsdp::models

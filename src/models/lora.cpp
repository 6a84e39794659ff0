#include "fsdp/models/lora.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/unit.h"
#include "models/module_names.h"

namespace fsdp::models {

namespace {

constexpr const char* kLoraA = ".lora_A.weight";
constexpr const char* kLoraB = ".lora_B.weight";

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The Linear layers of `module` that are not themselves a part of an adapter,
// also one that is the inner module of a unit boundary (nn::Unit: Llama's
// lm_head), with that unit.
struct BaseLinear {
  std::string name;
  std::shared_ptr<LinearImpl> linear;
  std::shared_ptr<nn::UnitBase> unit;  // null: a plain module
};
std::vector<BaseLinear> base_linears(torch::nn::Module& module) {
  std::vector<BaseLinear> out;
  for (const auto& m : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    auto unit = std::dynamic_pointer_cast<nn::UnitBase>(m.value());
    auto linear = std::dynamic_pointer_cast<LinearImpl>(unit ? unit->inner_ptr() : m.value());
    const std::string last = last_component(m.key());
    if (linear && last != "lora_A" && last != "lora_B") out.push_back({m.key(), linear, unit});
  }
  return out;
}

}  // namespace

std::vector<std::string> parse_lora_targets(const std::string& s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    std::string name = s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    FSDP_CHECK(!name.empty(), "LoraConfig::targets '", s, "' has an empty name; give comma-separated names of Linear "
               "layers, e.g. ", join(LoraConfig::default_lora_targets()));
    out.push_back(name);
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

void check_adapter_alpha(const std::string& dir, const LoraConfig& adapter, double run_alpha) {
  FSDP_CHECK(adapter.alpha == run_alpha, "check_adapter_alpha: dir ", dir, " has lora_alpha ", adapter.alpha,
             " (scale alpha / r = ", adapter.alpha / static_cast<double>(adapter.rank),
             ") but the run has LoraConfig::alpha ", run_alpha, " (scale ",
             run_alpha / static_cast<double>(adapter.rank), "); its outputs would change: give LoraConfig::alpha ",
             adapter.alpha, " or leave LoraConfig::alpha out to train at the adapter's own alpha");
}

void check_lora_config(const LoraConfig& cfg) {
  FSDP_CHECK(cfg.rank >= 1, "LoraConfig::rank ", cfg.rank, " must be >= 1 (e.g. 8 or 16; 0 turns LoRA off)");
  FSDP_CHECK(std::isfinite(cfg.alpha) && cfg.alpha > 0 && cfg.alpha <= std::numeric_limits<float>::max(),
             "LoraConfig::alpha ", cfg.alpha, " must be a number > 0 within a 32-bit float (<= 3.4e38; the adapter is "
             "scaled by alpha / rank; e.g. 2 x rank)");
  FSDP_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "LoraConfig::dropout ", cfg.dropout,
             " must lie in [0, 1) (e.g. 0.05; 0 for none)");
  FSDP_CHECK(!cfg.targets.empty(), "LoraConfig::targets is empty; name the projections to adapt, e.g. ",
             join(LoraConfig::default_lora_targets()));
  std::set<std::string> seen;
  for (const auto& t : cfg.targets) {
    FSDP_CHECK(!t.empty() && t.find('.') == std::string::npos, "LoraConfig::targets '", join(cfg.targets),
               "': '", t, "' is not a module name; give the last components of Linear names, e.g. ",
               join(LoraConfig::default_lora_targets()));
    FSDP_CHECK(seen.insert(t).second, "LoraConfig::targets '", join(cfg.targets), "' names '", t, "' twice");
  }
}

std::vector<std::string> apply_lora(torch::nn::Module& module, const LoraConfig& cfg, uint64_t seed) {
  check_lora_config(cfg);
  const auto linears = base_linears(module);
  std::set<std::string> available;
  for (const auto& l : linears) available.insert(last_component(l.name));
  for (const auto& t : cfg.targets) {
    FSDP_CHECK(available.count(t), "LoraConfig::targets: '", t, "' matches no Linear layer of the model; its Linear "
               "layers are named ", join(std::vector<std::string>(available.begin(), available.end())),
               " (give those names)");
  }
  const std::set<std::string> targets(cfg.targets.begin(), cfg.targets.end());
  std::vector<std::string> adapted;
  for (const auto& l : linears) {
    if (!targets.count(last_component(l.name))) continue;
    FSDP_CHECK(!l.linear->has_lora(), "'", l.name, "' already has a LoRA adapter; apply_lora applies once per model");
    l.linear->add_lora(cfg.rank, cfg.alpha, cfg.dropout, splitmix64(seed ^ fnv1a64(l.name)));
    if (l.unit) l.unit->adopt_new_members();  // the adapter's parameters under the unit's name
    adapted.push_back(l.name);
  }
  // Frozen base: only the adapters train (peft's mark_only_lora_as_trainable, bias "none").
  for (auto& p : module.named_parameters(/*recurse=*/true)) p.value().set_requires_grad(is_lora_parameter(p.key()));
  // Materialized adapters get their values now: the same as the engine gives
  // them from the meta device with lora_init_rule.
  at::NoGradGuard no_grad;
  const nn::InitRuleFn rule = lora_init_rule(module, [](const std::string& n) -> nn::InitRule {
    FSDP_ASSERT(false, "apply_lora: no rule for '", n, "'");
    return nn::InitRule::zeros();
  });
  for (const auto& name : adapted) {
    for (const char* suffix : {kLoraA, kLoraB}) {
      const std::string full = name + suffix;
      at::Tensor t = module.named_parameters(/*recurse=*/true)[full];
      if (!t.is_meta()) nn::init_slice(t, rule(full), seed, full, 0);
    }
  }
  return adapted;
}

bool is_lora_parameter(const std::string& name) { return ends_with(name, kLoraA) || ends_with(name, kLoraB); }

nn::InitRuleFn lora_init_rule(torch::nn::Module& module, nn::InitRuleFn base) {
  // kaiming_uniform_(a=sqrt(5)) on (r, in): gain sqrt(2 / (1 + 5)), bound
  // gain * sqrt(3 / fan_in) = 1 / sqrt(in) (torch.nn.init, peft's default init).
  std::map<std::string, double> bounds;
  for (const auto& l : base_linears(module)) {
    if (l.linear->has_lora()) bounds[l.name + kLoraA] = 1.0 / std::sqrt(static_cast<double>(l.linear->in_features()));
  }
  return [bounds = std::move(bounds), base = std::move(base)](const std::string& name) -> nn::InitRule {
    if (ends_with(name, kLoraB)) return nn::InitRule::zeros();
    if (ends_with(name, kLoraA)) {
      // Names under an extra prefix (a wrapping module) end with the model's own name.
      for (const auto& [n, bound] : bounds) {
        if (ends_with(name, n) && (name.size() == n.size() || name[name.size() - n.size() - 1] == '.')) {
          return nn::InitRule::uniform(bound);
        }
      }
      FSDP_ASSERT(false, "lora_init_rule: no adapter named '", name, "'");
    }
    return base(name);
  };
}

void set_lora_dropout_key(torch::nn::Module& module, uint64_t key) {
  for (const auto& l : base_linears(module)) {
    if (l.linear->has_lora()) l.linear->set_lora_dropout_key(key);
  }
}

at::Tensor merge_lora_weight(const at::Tensor& weight, const at::Tensor& lora_A, const at::Tensor& lora_B,
                             double scaling) {
  FSDP_ASSERT(weight.dim() == 2 && lora_A.dim() == 2 && lora_B.dim() == 2 && lora_A.size(1) == weight.size(1) &&
                  lora_B.size(0) == weight.size(0) && lora_B.size(1) == lora_A.size(0),
              "merge_lora_weight: W ", weight.sizes(), ", A ", lora_A.sizes(), ", B ", lora_B.sizes());
  return weight.to(at::kFloat) + at::matmul(lora_B.to(at::kFloat), lora_A.to(at::kFloat)) * scaling;
}

}  // namespace fsdp::models

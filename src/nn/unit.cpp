#include "fsdp/nn/unit.h"

namespace fsdp::nn {

UnitBase::UnitBase(std::shared_ptr<torch::nn::Module> inner, std::type_index type)
    : torch::nn::Module(inner->name()), inner_(std::move(inner)), inner_type_(type) {
  // Adopt the inner module's members under the same names, so the unit adds
  // no level to parameter names. The inner module itself is not a child:
  // every parameter is reachable exactly once from the root.
  adopt_new_members();
}

void UnitBase::adopt_new_members() {
  for (auto& p : inner_->named_parameters(/*recurse=*/false)) {
    if (named_parameters(/*recurse=*/false).find(p.key()) == nullptr) {
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    }
  }
  for (auto& b : inner_->named_buffers(/*recurse=*/false)) {
    if (named_buffers(/*recurse=*/false).find(b.key()) == nullptr) register_buffer(b.key(), b.value());
  }
  for (auto& c : inner_->named_children()) {
    if (named_children().find(c.key()) == nullptr) register_module(c.key(), c.value());
  }
}

std::vector<std::pair<std::string, std::shared_ptr<UnitBase>>> find_units(
    const std::shared_ptr<torch::nn::Module>& root) {
  std::vector<std::pair<std::string, std::shared_ptr<UnitBase>>> units;
  for (auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    if (auto u = std::dynamic_pointer_cast<UnitBase>(item.value())) {
      units.emplace_back(item.key(), std::move(u));
    }
  }
  return units;
}

}  // namespace fsdp::nn

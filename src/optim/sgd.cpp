#include "fsdp/optim/sgd.h"

#include <nlohmann/json.hpp>

#include "fsdp/common/error.h"

namespace fsdp::optim {

SgdMomentum::SgdMomentum(SgdOptions options) : options_(options) {
  FSDP_CHECK(options_.lr >= 0, "SGD: lr must be >= 0, got ", options_.lr);
  FSDP_CHECK(options_.momentum >= 0 && options_.momentum < 1, "SGD: momentum must be in [0, 1), got ",
             options_.momentum);
  FSDP_CHECK(options_.weight_decay >= 0, "SGD: weight_decay must be >= 0, got ", options_.weight_decay);
}

void SgdMomentum::add_shards(const std::vector<ShardRef>& shards) {
  for (const auto& r : shards) {
    if (!r.trainable) continue;
    slots_.push_back({r.param, r.grad, at::zeros_like(r.param)});
  }
}

void SgdMomentum::step() {
  ++step_;
  at::NoGradGuard no_grad;
  for (auto& s : slots_) {
    at::Tensor g = s.grad.defined() ? s.grad.clone() : at::zeros_like(s.param);
    if (options_.weight_decay != 0) g.add_(s.param, options_.weight_decay);
    if (step_ == 1) {
      s.momentum_buffer.copy_(g);
    } else {
      s.momentum_buffer.mul_(options_.momentum).add_(g);
    }
    s.param.add_(s.momentum_buffer, -options_.lr);
  }
}

std::vector<StateSlot> SgdMomentum::state_slots() {
  std::vector<StateSlot> out;
  for (auto& s : slots_) out.push_back({"momentum_buffer", s.param, s.momentum_buffer, true});
  return out;
}

nlohmann::json SgdMomentum::state_metadata() const {
  return {{"type", "SGD"},
          {"step", step_},
          {"options", {{"lr", options_.lr}, {"momentum", options_.momentum}, {"weight_decay", options_.weight_decay}}},
          {"torch",  // torch.optim.SGD's parameter group (checkpoint/dcp.h)
           {{"lr", options_.lr}, {"momentum", options_.momentum}, {"dampening", 0.0},
            {"weight_decay", options_.weight_decay}, {"nesterov", false}, {"maximize", false}, {"foreach", nullptr},
            {"differentiable", false}, {"fused", nullptr}}}};
}

void SgdMomentum::load_state_metadata(const nlohmann::json& saved) { step_ = saved_optimizer_step(saved, "SGD"); }

}  // namespace fsdp::optim

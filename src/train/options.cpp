// The trainer's option types: their defaults where a member initializer
// cannot say them, and the words of their enums (the command line's table
// reads these; apps/train_options_table.cpp).
#include "fsdp/train/options.h"

#include "fsdp/common/error.h"

namespace fsdp::train {

FsdpOptions trainer_fsdp_defaults() {
  FsdpOptions o;
  o.wrap = WrapPolicy::by_type({});  // the model's blocks (engine_options fills in their types)
  return o;
}

const char* to_string(LossScaling s) {
  switch (s) {
    case LossScaling::kAuto: return "auto";
    case LossScaling::kOn: return "on";
    case LossScaling::kOff: return "off";
  }
  return "?";
}

LossScaling parse_loss_scaling(const std::string& s) {
  for (LossScaling l : {LossScaling::kAuto, LossScaling::kOn, LossScaling::kOff}) {
    if (s == to_string(l)) return l;
  }
  FSDP_CHECK(false, "StepOptions::loss_scaling '", s, "' is not one of: auto, on, off");
  return LossScaling::kAuto;
}

}  // namespace fsdp::train

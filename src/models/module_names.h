// Names of modules inside a model, shared by the code that picks layers by
// name (models/lora.cpp's targets, models/layers.cpp's FP8 linears).
#pragma once

#include <string>

namespace fsdp::models {

// The last component of a qualified module name: "layers.0.self_attn.q_proj"
// -> "q_proj"; a name without a dot is its own last component.
inline std::string last_component(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace fsdp::models

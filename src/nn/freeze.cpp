#include "fsdp/nn/freeze.h"

#include <torch/nn/module.h>

#include "fsdp/common/error.h"
#include "fsdp/common/name_pattern.h"

namespace fsdp::nn {

int64_t freeze_matching(torch::nn::Module& module, const std::string& pattern) {
  // Note [User patterns]: linear time, bounded compilation.
  const NamePattern re(pattern, "freeze_matching: pattern");
  int64_t frozen = 0, trainable = 0;
  std::string example;  // a decoder layer's parameter where there is one: names the user can pattern on
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    if (example.empty() || p.key().find("layers.0.") != std::string::npos) example = p.key();
    if (re.found_in(p.key())) {
      if (p.value().requires_grad()) ++frozen;
      p.value().set_requires_grad(false);
    } else if (p.value().requires_grad()) {
      ++trainable;
    }
  }
  FSDP_CHECK(frozen > 0, "freeze_matching: pattern '", pattern, "' freezes no trainable parameter; parameter names "
             "look like '", example, "'");
  FSDP_CHECK(trainable > 0, "freeze_matching: pattern '", pattern,
             "' freezes every trainable parameter: nothing is left to train; narrow the pattern");
  return frozen;
}

}  // namespace fsdp::nn

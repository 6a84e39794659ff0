// Freezing parameters by name: fsdp-train's and fsdp-inspect's --freeze REGEX.
//
// Order: freeze after the model is built (and after models::apply_lora) and
// BEFORE fully_shard, which takes which parameters are frozen from
// requires_grad when it lays the units out (Note [Frozen parameters] in the
// engine).
#pragma once

#include <cstdint>
#include <string>

namespace torch::nn {
class Module;
}

namespace fsdp::nn {

// Sets requires_grad false on every parameter of `module` whose qualified
// name `pattern` finds (NamePattern: RE2 syntax, searched anywhere in the
// name, Note [User patterns]). Returns how many of them were trainable before.
// Throws UsageError naming "freeze_matching: pattern" and the pattern: not a
// valid pattern; it freezes no trainable parameter (naming an example
// parameter name); it
// leaves no parameter trainable. `module` may be changed when it throws for
// the last two.
int64_t freeze_matching(torch::nn::Module& module, const std::string& pattern);

}  // namespace fsdp::nn

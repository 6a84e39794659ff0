// The one place exceptions become exit codes (STYLE.md: only main does this):
//   fsdp::UsageError  -> "<program>: error: <message>", exit 2 (bad usage)
//   anything else     -> "<program>: failed: <message>", exit 1
// Programs write `int main(int argc, char** argv) { return fsdp::run_main("x", [&] { ... }); }`.
#pragma once

#include <functional>

namespace fsdp {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int run_main(const char* program, const std::function<int()>& body);

}  // namespace fsdp

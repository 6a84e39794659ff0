// The one place exceptions become exit codes (only main does this):
//   fsdp::UsageError          -> "<program>: error: <message>", exit 2 (bad usage)
//   out of memory             -> "<program>: failed: out of memory (<what>) — <what to reduce>", exit 1
//   anything else             -> "<program>: failed: <message>", exit 1
// Every message is one line: LibTorch's c10::Error carries a C++ backtrace in
// what() ("Exception raised from ...", "frame #0: ..."), which users never see;
// FSDP_DEBUG=1 in the environment prints the full text instead. An exception
// that escapes another thread (std::terminate) is reported the same way, exit 1.
// Programs write `int main(int argc, char** argv) { return fsdp::run_main("x", [&] { ... }); }`.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace fsdp {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

int run_main(const char* program, const std::function<int()>& body);

// The line run_main prints for `e` (without "<program>: ..."): c10::Error's
// message without its source location and backtrace, the lines of any
// message joined with "; ". debug: the full text, backtrace included.
std::string one_line_message(const std::exception& e, bool debug = false);

// Whether FSDP_DEBUG=1 (or any value but "" and "0") is set.
bool debug_enabled();

}  // namespace fsdp

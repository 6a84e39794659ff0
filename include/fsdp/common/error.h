// Errors and checks.
//
// Two families:
//  - FSDP_CHECK(cond, ...)  : a user error (bad flag, bad file, bad shape). Throws
//    fsdp::UsageError; `main` turns it into exit code 2. The message says what was
//    wrong, the values involved and how to fix it.
//  - FSDP_ASSERT(cond, ...) : an internal invariant. Throws fsdp::InternalError with
//    file:line; it means a bug in fsdp-cpp, never in the user's input.
// Runtime failures that are nobody's input (I/O, a collective timing out) throw
// fsdp::Failure (exit code 1).
// Every message is prefixed with the process's "[rank r/W] " once a process group
// exists, so interleaved logs from several workers stay readable.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp {

class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Failure {
 public:
  using Failure::Failure;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// The process's identity in the job. Set once by comm::init_process_group (or a
// launcher); read by every error message. Thread-safe.
void set_rank_tag(int rank, int world_size);
// "[rank r/W] " or "" before any process group exists.
std::string rank_tag();

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_usage(const std::string& msg);
[[noreturn]] void throw_failure(const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace fsdp

#define FSDP_CHECK(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) ::fsdp::detail::throw_usage(::fsdp::detail::cat(__VA_ARGS__)); \
  } while (0)

#define FSDP_FAIL(...) ::fsdp::detail::throw_failure(::fsdp::detail::cat(__VA_ARGS__))

#define FSDP_ASSERT(cond, ...)                                                        \
  do {                                                                                \
    if (!(cond))                                                                      \
      ::fsdp::detail::throw_internal(__FILE__, __LINE__, #cond, ::fsdp::detail::cat(__VA_ARGS__)); \
  } while (0)

#include "fsdp/common/main.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <stdexcept>

#include "fsdp/common/error.h"

namespace fsdp {
namespace {

// What a user can change when memory runs out (fsdp-train's flags).
constexpr const char* kMemoryHint =
    "reduce --batch-size or --seq-len, add --activation-checkpointing or --cpu-offload, use a smaller model or "
    "shard over more processes";

// The program name run_main was given, for the terminate handler.
const char* g_program = "fsdp";

// The message lines without a C++ backtrace, joined with "; ". c10::Error
// appends "Exception raised from <function> at <file>:<line> (most recent
// call first):" and "frame #N: ..." lines; our own errors can wrap such a
// text (a Failure made from a caught c10::Error's what()), so the backtrace is
// cut from the text itself, not only from c10::Error.
std::string strip_backtrace(const std::string& text) {
  std::string kept = text.substr(0, text.find("Exception raised from "));
  std::string out;
  size_t begin = 0;
  while (begin <= kept.size()) {
    size_t end = kept.find('\n', begin);
    if (end == std::string::npos) end = kept.size();
    std::string line = kept.substr(begin, end - begin);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t')) line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    line = first == std::string::npos ? "" : line.substr(first);
    if (!line.empty() && line.rfind("frame #", 0) != 0) out += (out.empty() ? "" : "; ") + line;
    begin = end + 1;
  }
  return out.empty() ? "unknown error" : out;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr || dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
      dynamic_cast<const std::length_error*>(&e) != nullptr) {  // vector::reserve of an impossible size
    return true;
  }
  // LibTorch's CPU allocator throws a plain c10::Error (CAFFE_ENFORCE in alloc_cpu.cpp).
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  return c10 != nullptr && c10->msg().find("DefaultCPUAllocator: can't allocate memory") != std::string::npos;
}

// "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: ..." -> "DefaultCPUAllocator: ...":
// CAFFE_ENFORCE's prefix names LibTorch's source, not anything a user can act on.
std::string without_enforce_prefix(const std::string& msg) {
  if (msg.rfind("[enforce fail at ", 0) != 0) return msg;
  const size_t close = msg.find("] ");
  const size_t condition_end = close == std::string::npos ? close : msg.find(". ", close);
  return condition_end == std::string::npos ? msg : msg.substr(condition_end + 2);
}

// The one line for an exception, with its exit code.
int report(const char* program, const std::exception& e, const char* where) {
  const bool debug = debug_enabled();
  const std::string msg = one_line_message(e, debug);
  if (dynamic_cast<const UsageError*>(&e) != nullptr) {
    std::cerr << program << ": error: " << msg << where << "\n";
    return kExitUsage;
  }
  if (is_out_of_memory(e)) {
    std::cerr << program << ": failed: out of memory (" << msg << ")" << where << " — " << kMemoryHint << "\n";
    return kExitFailure;
  }
  std::cerr << program << ": failed: " << msg << where << "\n";
  return kExitFailure;
}

// An exception that escaped a thread (or a noexcept function) ends here
// instead of in the runtime's "terminate called after throwing ..." with
// LibTorch's backtrace.
[[noreturn]] void on_terminate() {
  int code = kExitFailure;
  try {
    if (const std::exception_ptr p = std::current_exception()) std::rethrow_exception(p);
    std::cerr << g_program << ": failed: terminated without an exception (this is a bug in fsdp-cpp)\n";
  } catch (const std::exception& e) {
    code = report(g_program, e, " (on a background thread)");
  } catch (...) {
    std::cerr << g_program << ": failed: an unknown exception on a background thread\n";
  }
  std::cerr.flush();
  std::_Exit(code);
}

}  // namespace

bool debug_enabled() {
  const char* v = std::getenv("FSDP_DEBUG");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

std::string one_line_message(const std::exception& e, bool debug) {
  if (debug) return e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return strip_backtrace(without_enforce_prefix(c10->msg()));
  return strip_backtrace(e.what());
}

int run_main(const char* program, const std::function<int()>& body) {
  g_program = program;
  std::set_terminate(on_terminate);
  // LibTorch's own log lines (c10d's connection retries, each with a stack
  // trace) say again what our one-line error says: kept for FSDP_DEBUG=1 or a
  // TORCH_CPP_LOG_LEVEL the user set.
  if (!debug_enabled() && std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = c10::GLOG_FATAL;
  try {
    return body();
  } catch (const std::exception& e) {
    return report(program, e, "");
  } catch (...) {
    std::cerr << program << ": failed: an unknown exception\n";
    return kExitFailure;
  }
}

}  // namespace fsdp

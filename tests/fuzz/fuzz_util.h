// Shared by the libFuzzer targets in this directory (docs/testing.md, "Fuzzing").
//
// What counts as a finding: the parsers read files a user hands us, so for any
// bytes they may return or throw the project's documented errors
// (fsdp::UsageError: the user's file is bad; a target may accept more, e.g.
// DamagedCheckpoint). Anything else is reported and aborts the run, which
// libFuzzer records as a crash with the input that caused it: another
// exception type (an InternalError, nlohmann::json's, std::out_of_range,
// c10::Error...), a sanitizer report (AddressSanitizer, UndefinedBehavior-
// Sanitizer: -fno-sanitize-recover), an allocation above -malloc_limit_mb, a
// run past -timeout, or a broken promise the target checks (fuzz_require).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "fsdp/common/error.h"

namespace fsdp::fuzz {

// A directory of this process for the files a target hands to a path-taking
// parser: $FSDP_FUZZ_DIR/<pid> (the suite sets it inside the build tree), else
// under the system's temporary directory. Removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const char* base = std::getenv("FSDP_FUZZ_DIR");
    fs::path d = (base != nullptr && *base != '\0') ? fs::path(base) : fs::temp_directory_path() / "fsdp-fuzz";
    d /= std::to_string(::getpid());
    fs::create_directories(d);
    static const std::string keep = d.string();
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(keep, ec);
    });
    return d.string();
  }();
  return dir;
}

// scratch_dir()/name with exactly `bytes` in it (a previous file of that name is replaced).
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\nfuzz finding: %s\n", what.c_str());
  std::abort();
}

// A promise of the parser that the target checks on what it returned.
inline void fuzz_require(bool ok, const std::string& what) {
  if (!ok) finding("broken promise: " + what);
}

// Runs `body`; the documented UsageError (and the types in Accepted...) are fine,
// anything else is a finding.
template <class... Accepted, class Body>
void expect_documented_errors(Body&& body) {
  try {
    body();
  } catch (const UsageError&) {
  } catch (const InternalError& e) {
    finding(std::string("InternalError (a bug by its own account): ") + e.what());
  } catch (const std::exception& e) {
    if (((dynamic_cast<const Accepted*>(&e) != nullptr) || ...)) return;
    finding(std::string("undocumented exception ") + typeid(e).name() + ": " + e.what());
  }
}

}  // namespace fsdp::fuzz

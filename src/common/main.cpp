#include "fsdp/common/main.h"

#include <exception>
#include <iostream>

#include "fsdp/common/error.h"

namespace fsdp {

int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << program << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << program << ": failed: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace fsdp

// Reads a PyTorch distributed checkpoint's .metadata as fsdp-cpp's loaders
// do (dcp::parse_metadata over the restricted pickle machine) and prints what
// it holds as one JSON line: tensors, chunks, storage entries, non-tensor
// values, and the seconds the read and the parse took (the best of --repeat).
// Driven by test_dcp_metadata_scale.py and bench/checkpoint/dcp_metadata.py.
//
//   dcp_metadata_probe FILE [--repeat N]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include "dcp_format.h"
#include "fsdp/common/files.h"
#include "fsdp/common/main.h"

int main(int argc, char** argv) {
  return fsdp::run_main("dcp_metadata_probe", [&] {
    if (argc != 2 && !(argc == 4 && std::string(argv[2]) == "--repeat")) {
      std::cerr << "usage: dcp_metadata_probe FILE [--repeat N]\n";
      return 2;
    }
    const int repeat = argc == 4 ? std::max(1, std::atoi(argv[3])) : 1;
    double best = 1e30;
    nlohmann::json out;
    for (int i = 0; i < repeat; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string bytes = fsdp::read_input_file(argv[1], ".metadata", int64_t{1} << 30, "give a .metadata file");
      const fsdp::checkpoint::dcp::Metadata m = fsdp::checkpoint::dcp::parse_metadata(bytes, argv[1]);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      int64_t chunks = 0;
      for (const auto& [fqn, t] : m.tensors) chunks += static_cast<int64_t>(t.chunks.size());
      out = {{"bytes", bytes.size()}, {"tensors", m.tensors.size()}, {"chunks", chunks},
             {"storage", m.storage.size()}, {"values", m.bytes.size()}, {"planner_data", m.planner_data.size()}};
    }
    out["seconds"] = best;
    std::cout << out.dump() << "\n";
    return 0;
  });
}

// Comparing directories in tests: two checkpoints written by different paths
// (a synchronous and an asynchronous save) must hold the same bytes.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

namespace fsdp::testing {

inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Records a failure for each file of `a` or `b` that is not in both with the
// same bytes; the names in `by_size` are compared by size only (DCP's
// .metadata carries a random id). Returns how many files `a` holds.
inline int expect_same_files(const std::filesystem::path& a, const std::filesystem::path& b,
                             const std::set<std::string>& by_size = {".metadata"}) {
  std::set<std::string> names_a, names_b;
  for (const auto& e : std::filesystem::directory_iterator(a)) names_a.insert(e.path().filename().string());
  for (const auto& e : std::filesystem::directory_iterator(b)) names_b.insert(e.path().filename().string());
  EXPECT_EQ(names_a, names_b) << a << " and " << b << " hold other files";
  for (const auto& name : names_a) {
    if (names_b.count(name) == 0) continue;
    if (by_size.count(name) == 1) {
      EXPECT_EQ(std::filesystem::file_size(a / name), std::filesystem::file_size(b / name)) << name;
    } else {
      EXPECT_TRUE(file_bytes(a / name) == file_bytes(b / name)) << name << " differs between " << a << " and " << b;
    }
  }
  return static_cast<int>(names_a.size());
}

}  // namespace fsdp::testing

// The one remover (Note [Removing without following links], common/remove.h):
// a link met anywhere — the path itself, an entry, a directory swapped for a
// link — goes as a link; what it points to stays, byte for byte. The marker
// named `last` goes after everything else; a directory is never followed out
// of the tree.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/common/remove.h"
#include "support/multiproc.h"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The user's directory a link points at: three files, one below.
fs::path users(const fs::path& root) {
  const fs::path u = root / "users";
  write(u / "a.txt", "a");
  write(u / "sub" / "b.txt", "b");
  write(u / ".hidden", "h");
  return u;
}

void expect_intact(const fs::path& u) {
  EXPECT_EQ(read(u / "a.txt"), "a");
  EXPECT_EQ(read(u / "sub" / "b.txt"), "b");
  EXPECT_EQ(read(u / ".hidden"), "h");
}

}  // namespace

TEST(Remove, ALinkGoesAsALinkWhereverItIs) {
  const fs::path root = fsdp::testing::temp_dir("remove-links");
  const fs::path u = users(root);
  // The path itself a link to the user's directory (a linked-in step_N).
  fs::create_directory_symlink(u, root / "step_00000001");
  EXPECT_EQ(fsdp::entry_kind((root / "step_00000001").string()), fsdp::EntryKind::kLink);
  EXPECT_EQ(fsdp::remove_tree((root / "step_00000001").string(), ".fsdp-cpp-owned"), "");
  EXPECT_FALSE(fs::exists(fs::symlink_status(root / "step_00000001")));
  expect_intact(u);
  // Links inside a directory of ours: to the user's directory and to one of its files.
  const fs::path ours = root / ".del-step_00000002";
  write(ours / "shard.bin", "x");
  write(ours / ".fsdp-cpp-owned", "marker");
  fs::create_directory_symlink(u, ours / "dir-link");
  fs::create_symlink(u / "a.txt", ours / "file-link");
  fs::create_directories(ours / "deeper" / "x");
  fs::create_directory_symlink(u, ours / "deeper" / "x" / "link");
  EXPECT_EQ(fsdp::remove_tree(ours.string(), ".fsdp-cpp-owned"), "");
  EXPECT_FALSE(fs::exists(ours));
  expect_intact(u);
  // remove_contents refuses a link instead of emptying what it names.
  fs::create_directory_symlink(u, root / "linked");
  EXPECT_NE(fsdp::remove_contents((root / "linked").string(), "").find("symbolic link"), std::string::npos);
  expect_intact(u);
}

TEST(Remove, TheMarkerGoesLastAndMissingIsSuccess) {
  const fs::path root = fsdp::testing::temp_dir("remove-marker");
  write(root / "d" / "one", "1");
  write(root / "d" / ".fsdp-cpp-owned", "m");
  EXPECT_EQ(fsdp::remove_contents((root / "d").string(), ".fsdp-cpp-owned"), "");
  EXPECT_TRUE(fs::exists(root / "d" / ".fsdp-cpp-owned"));
  EXPECT_FALSE(fs::exists(root / "d" / "one"));
  EXPECT_EQ(fsdp::remove_tree((root / "d").string(), ".fsdp-cpp-owned"), "");
  EXPECT_FALSE(fs::exists(root / "d"));
  EXPECT_EQ(fsdp::remove_tree((root / "never-there").string()), "");
  // rename_entry moves a link as a link.
  write(root / "target.txt", "t");
  fs::create_symlink(root / "target.txt", root / "l1");
  EXPECT_EQ(fsdp::rename_entry((root / "l1").string(), (root / "l2").string()), 0);
  EXPECT_EQ(fsdp::entry_kind((root / "l2").string()), fsdp::EntryKind::kLink);
  EXPECT_EQ(read(root / "target.txt"), "t");
}

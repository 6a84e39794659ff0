#include "carried.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "file_io.h"
#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/common/files.h"
#include "manifest.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

bool is_entry_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool is_carried_name(const std::string& name) { return is_entry_name(name) && name[0] != '.'; }

nlohmann::json write_carried_files(const std::string& dir, const std::vector<CarriedFile>& files) {
  nlohmann::json listed = nlohmann::json::array();
  if (files.empty()) return listed;
  const fs::path into = fs::path(dir) / kCarriedDir;
  std::error_code ec;
  fs::create_directory(into, ec);
  if (ec) FSDP_FAIL("cannot create ", into.string(), ": ", ec.message());
  std::set<std::string> seen;
  for (const CarriedFile& f : files) {
    FSDP_ASSERT(is_carried_name(f.name) && seen.insert(f.name).second, "carried file name '", f.name, "'");
    const std::string content = f.content ? *f.content
                                          : read_input_file(f.path, "the run's " + f.name, kMaxTokenizerBytes,
                                                            "the checkpoint carries a copy of it; keep it in place "
                                                            "while the run saves checkpoints");
    io::write_text_file((into / f.name).string(), content);
    listed.push_back({{"name", f.name},
                      {"size", static_cast<int64_t>(content.size())},
                      {"crc32c", hex32(crc32c(content.data(), content.size()))}});
  }
  io::fsync_dir(into.string());
  return listed;
}

std::vector<CarriedFile> read_carried_files(const fs::path& dir, const nlohmann::json* listed,
                                            const std::string& checkpoint) {
  const fs::path from = dir / kCarriedDir;
  auto damaged = [&](const std::string& file, const auto&... why) {
    throw DamagedCheckpoint(checkpoint, file, detail::cat(why...));
  };
  std::vector<CarriedFile> out;
  if (listed == nullptr) {  // a DCP directory: what carried/ holds
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0) return out;
    if (!S_ISDIR(st.st_mode)) damaged(kCarriedDir, "is not a directory (a link or a file)");
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(from, ec)) {
      const std::string name = e.path().filename().string();
      if (!is_carried_name(name)) damaged(std::string(kCarriedDir) + "/" + name, "is not a name a checkpoint carries");
      if (!e.is_symlink(ec) && e.is_regular_file(ec)) {
        out.push_back({e.path().string(), name});
      } else {
        damaged(std::string(kCarriedDir) + "/" + name, "is not a regular file (a link, a directory or a device)");
      }
    }
    std::sort(out.begin(), out.end(), [](const CarriedFile& a, const CarriedFile& b) { return a.name < b.name; });
    return out;
  }
  if (!listed->is_array()) damaged(kManifest, "\"carried\" is not a list");
  std::set<std::string> seen;
  for (const nlohmann::json& e : *listed) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("size") ||
        !e["size"].is_number_unsigned() || !e.contains("crc32c") || !e["crc32c"].is_string()) {
      damaged(kManifest, "a \"carried\" entry is not {\"name\", \"size\", \"crc32c\"}: ", e.dump());
    }
    const std::string name = e["name"].get<std::string>();
    if (!is_carried_name(name) || !seen.insert(name).second) {
      damaged(kManifest, "\"carried\" names '", name, "', which is not a file name in ", kCarriedDir, "/ (or twice)");
    }
    const std::string rel = std::string(kCarriedDir) + "/" + name;
    std::string content;
    try {
      content = io::read_text_file((from / name).string(), io::File::Links::kRefuse);
    } catch (const std::exception& x) {
      damaged(rel, "cannot be read: ", x.what());
    }
    if (content.size() != e["size"].get<uint64_t>()) {
      damaged(rel, "has ", content.size(), " bytes, the manifest says ", e["size"].dump());
    }
    const std::string crc = hex32(crc32c(content.data(), content.size()));
    if (crc != e["crc32c"].get<std::string>()) {
      damaged(rel, "checksum mismatch: CRC-32C ", crc, ", the manifest says ", e["crc32c"].get<std::string>());
    }
    out.push_back({(from / name).string(), name});
  }
  return out;
}

}  // namespace fsdp::checkpoint

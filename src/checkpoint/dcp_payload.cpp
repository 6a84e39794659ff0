// PyTorch's distributed checkpoint as a step_N payload (Note [Checkpoint
// payloads], payload.h): the DCP files torch.distributed.checkpoint.load reads
// as they are (dcp.h writes and reads them), beside our manifest.json, which
// records the step, the owners' metadata, the units and each DCP file's size,
// under the same commit protocol, keep_last and damage fallback.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "carried.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/ownership.h"
#include "manifest.h"
#include "payload.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

class DcpPayload final : public Payload {
 public:
  explicit DcpPayload(const DcpSaveOptions& options) : options_(options) {}

  std::function<RankStatus()> prepare(const std::string& tmp, ShardedModel& model,
                                      const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                      const std::shared_ptr<Stager>& stager) override {
    return prepare_dcp_write(tmp, model, owners, group, options_, stager);
  }

  // Rank 0 writes .metadata and lists the DCP files with their sizes; the
  // bytes are counted there only.
  int64_t finish(const std::string& tmp, const Agreement& records, nlohmann::json* manifest) override {
    if (manifest == nullptr) return 0;
    finish_dcp_write(tmp, records, options_, /*lead=*/true);  // .metadata, fsync
    int64_t bytes = 0;
    nlohmann::json dcp_files = nlohmann::json::array();
    for (const auto& e : fs::directory_iterator(tmp)) {
      const std::string n = e.path().filename().string();
      if (n == kOwnedMarker || n == kCarriedDir) continue;
      dcp_files.push_back({{"name", n}, {"size", static_cast<int64_t>(e.file_size())}});
      bytes += static_cast<int64_t>(e.file_size());
    }
    std::sort(dcp_files.begin(), dcp_files.end(),
              [](const nlohmann::json& a, const nlohmann::json& b) { return a.at("name") < b.at("name"); });
    (*manifest)["files"] = nlohmann::json::array();  // none of our shard files
    (*manifest)["dcp"] = {{"layout", options_.layout == DcpLayout::kTorch ? "torch" : "torchtitan"},
                          {"format", options_.format == DcpFormat::kTorchSave ? "torch_save" : "safetensors"},
                          {"files", dcp_files}};
    return bytes;
  }

  LoadResult load(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                  comm::ProcessGroup& group, const LoadOptions& options) override;

 private:
  DcpSaveOptions options_;
};

// The manifest is checked as any checkpoint's (the model, each DCP file's
// size), the rest is the DCP reader's.
LoadResult DcpPayload::load(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                            comm::ProcessGroup& group, const LoadOptions& options) {
  const fs::path dir(path);
  const std::string name = dir.filename().string();
  Manifest m;
  std::vector<CarriedFile> carried;
  const RankStatus status = RankStatus::capture([&] {
    m = read_manifest(dir);
    check_compatible(m, model.units(), name);
    if (!m.json.contains("dcp")) throw DamagedCheckpoint(name, kManifest, "names no DCP files, but the directory holds some");
    const nlohmann::json& dcp = m.json["dcp"];
    if (!dcp.is_object() || !dcp.contains("files") || !dcp["files"].is_array()) {
      throw DamagedCheckpoint(name, kManifest, "\"dcp\" does not list the DCP files");
    }
    for (const auto& f : dcp["files"]) {
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !is_entry_name(f["name"].get<std::string>()) ||
          !f.contains("size") || !f["size"].is_number_unsigned()) {
        throw DamagedCheckpoint(name, kManifest, "a DCP file entry is not {\"name\", \"size\"}: " + f.dump());
      }
      const std::string file = f["name"].get<std::string>();
      std::error_code ec;
      if (fs::is_symlink(dir / file, ec)) throw DamagedCheckpoint(name, file, "is a symbolic link, not a file of its own");
      const auto size = fs::file_size(dir / file, ec);
      if (ec) throw DamagedCheckpoint(name, file, "cannot be read: " + ec.message());
      if (size != f["size"].get<uint64_t>()) {
        throw DamagedCheckpoint(name, file, detail::cat("has ", size, " bytes, the manifest says ", f["size"].dump()));
      }
    }
    carried = read_carried_files(dir, carried_list(m), name);
  });
  raise_agreed(agree(group, status), name, path);
  DcpLoadOptions dl;
  if (m.json["dcp"].contains("layout") && m.json["dcp"]["layout"] == "torchtitan") {
    FSDP_CHECK(options.dcp_names != nullptr, "checkpoint ", path, " was saved with torchtitan's names; loading it "
               "needs the model family's torchtitan names (LoadOptions::dcp_names)");
    dl.names = *options.dcp_names;
  }
  const DcpLoadResult d = load_dcp(path, model, owners, group, dl);
  LoadResult result = loaded_from(m, path);
  result.io = d.io;
  result.carried = std::move(carried);
  return result;
}

}  // namespace

std::shared_ptr<Payload> make_dcp_payload(const DcpSaveOptions& options) {
  return std::make_shared<DcpPayload>(options);
}

}  // namespace fsdp::checkpoint

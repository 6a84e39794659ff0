#include "manifest.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstring>

#include "file_io.h"
#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/checkpoint/types.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/json_input.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

// Returns false on malformed input.
bool decode_words(const std::string& s, std::vector<uint32_t>* words) {
  const std::optional<std::string> bytes = base64_decode(s);
  if (!bytes || bytes->size() % 4 != 0) return false;
  words->resize(bytes->size() / 4);
  if (!bytes->empty()) std::memcpy(words->data(), bytes->data(), bytes->size());
  return true;
}

// An integer field; nlohmann's get<int64_t>() would convert a float such as 1e300
// with undefined behaviour (tests/fuzz found it). Throws, which reads as malformed.
int64_t integer(const nlohmann::json& v) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
    throw std::invalid_argument("expected a 64-bit integer, got " + v.dump());
  }
  return v.get<int64_t>();
}

at::ScalarType dtype_of(const std::string& s) {
  if (s == "F32") return at::kFloat;
  if (s == "BF16") return at::kBFloat16;
  if (s == "F16") return at::kHalf;
  if (s == "F64") return at::kDouble;
  return at::ScalarType::Undefined;
}

}  // namespace

DamagedCheckpoint::DamagedCheckpoint(const std::string& checkpoint, const std::string& file, const std::string& why)
    : Failure(detail::cat("checkpoint ", checkpoint, " is damaged: file ", file, ": ", why)),
      checkpoint_(checkpoint),
      file_(file) {}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

std::string encode_words(const std::vector<uint32_t>& words) {
  std::string bytes(words.size() * 4, '\0');
  if (!words.empty()) std::memcpy(bytes.data(), words.data(), bytes.size());  // little-endian host
  return base64_encode(bytes);
}

void hand_saved_state(StateOwner& owner, const nlohmann::json& saved, const std::string& checkpoint,
                      const std::string& file) {
  try {
    owner.load_state_metadata(saved);
  } catch (const MalformedState& e) {
    throw DamagedCheckpoint(checkpoint, file, detail::cat("the saved state \"", owner.state_key(), "\": ", e.what()));
  }
}

Manifest read_manifest(const fs::path& dir) {
  const std::string name = dir.filename().string();
  auto damaged = [&](const std::string& file, const auto&... why) {
    throw DamagedCheckpoint(name, file, detail::cat(why...));
  };
  std::string text;
  std::string crc_text;
  try {
    text = io::read_text_file((dir / kManifest).string(), io::File::Links::kRefuse);
  } catch (const std::exception& e) {
    damaged(kManifest, "cannot be read (", e.what(), ")");
  }
  try {
    crc_text = io::read_text_file((dir / kManifestCrc).string(), io::File::Links::kRefuse);
  } catch (const std::exception& e) {
    damaged(kManifestCrc, "cannot be read (", e.what(), ")");
  }
  while (!crc_text.empty() && std::isspace(static_cast<unsigned char>(crc_text.back()))) crc_text.pop_back();
  const std::string actual = hex32(crc32c(text.data(), text.size()));
  if (crc_text != actual) damaged(kManifest, "checksum mismatch: CRC-32C ", actual, ", manifest.crc32c says ", crc_text);
  return parse_manifest(text, dir);
}

Manifest parse_manifest(const std::string& text, const fs::path& dir) {
  const std::string name = dir.filename().string();
  auto damaged = [&](const std::string& file, const auto&... why) {
    throw DamagedCheckpoint(name, file, detail::cat(why...));
  };
  Manifest m;
  std::string why;
  std::optional<nlohmann::json> parsed = parse_json_input(text, why);
  if (!parsed) damaged(kManifest, "not valid JSON: ", why);
  try {
    m.json = std::move(*parsed);
    const auto& j = m.json;
    if (j.at("format").get<std::string>() != kFormat) damaged(kManifest, "format is not ", kFormat);
    const int64_t version = integer(j.at("version"));
    if (version != kVersion && version != 1) {
      damaged(kManifest, "version ", version, " is not supported (this build reads 1 and ", kVersion, ")");
    }
    if (version == 1) {
      // Before the state seam (sharded.h): the same sections, the metadata at the top level.
      m.state = nlohmann::json::object();
      m.state["model"] = {{"family", "llama"}, {"config", j.at("model_config")}};
      if (j.contains("optimizer") && !j["optimizer"].is_null()) m.state["optimizer"] = j["optimizer"];
      if (j.contains("trainer_state")) m.state["trainer"] = j["trainer_state"];
    } else {
      m.state = j.at("state");
      if (!m.state.is_object()) damaged(kManifest, "\"state\" is not an object");
    }
    m.step = integer(j.at("step"));
    m.block_size = integer(j.at("checksum").at("block_size"));
    if (j.at("checksum").at("algorithm").get<std::string>() != "crc32c" || m.block_size <= 0) {
      damaged(kManifest, "unsupported checksum ", j.at("checksum").dump());
    }
    const nlohmann::json& saved_units = j.at("units");
    for (size_t ui = 0; ui < saved_units.size(); ++ui) {
      for (const auto& p : saved_units[ui].at("params")) {
        SavedParam sp;
        sp.unit = static_cast<int64_t>(ui);
        for (const auto& x : p.at("shape")) sp.shape.push_back(integer(x));
        sp.flat_offset = integer(p.at("flat_offset"));
        sp.numel = integer(p.at("numel"));
        m.params[p.at("name").get<std::string>()] = sp;
      }
    }
    for (const auto& f : j.at("files")) {
      SavedFile sf;
      sf.name = f.at("name").get<std::string>();
      if (sf.name.find('/') != std::string::npos || sf.name.empty() || sf.name[0] == '.') {
        damaged(kManifest, "bad file name '", sf.name, "'");
      }
      sf.path = (dir / sf.name).string();
      sf.size = integer(f.at("size"));
      if (!decode_words(f.at("block_crc32c").get<std::string>(), &sf.blocks) ||
          sf.size < 0 ||
          static_cast<int64_t>(sf.blocks.size()) != sf.size / m.block_size + (sf.size % m.block_size != 0)) {
        damaged(kManifest, "block checksums of ", sf.name, " are malformed");
      }
      for (const auto& s : f.at("sections")) {
        SavedSection ss;
        ss.unit = integer(s.at("unit"));
        ss.kind = s.at("kind").get<std::string>();
        ss.dtype = dtype_of(s.at("dtype").get<std::string>());
        if (ss.dtype == at::ScalarType::Undefined) damaged(kManifest, "unknown dtype in ", s.dump());
        ss.elem_size = static_cast<int64_t>(c10::elementSize(ss.dtype));
        ss.flat_begin = integer(s.at("flat_begin"));
        ss.numel = integer(s.at("numel"));
        ss.offset = integer(s.at("offset"));
        if (ss.offset < 0 || ss.numel < 0 || ss.offset > sf.size || ss.numel > (sf.size - ss.offset) / ss.elem_size) {
          damaged(kManifest, "section ", s.dump(), " lies outside ", sf.name, " (", sf.size, " bytes)");
        }
        m.kinds.insert(ss.kind);
        sf.sections.push_back(ss);
      }
      m.files.push_back(std::move(sf));
    }
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const std::exception& e) {
    damaged(kManifest, "is malformed (", e.what(), ")");
  }
  return m;
}

}  // namespace fsdp::checkpoint

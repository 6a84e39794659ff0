#include "payload.h"

#include <nlohmann/json.hpp>

#include <set>

namespace fsdp::checkpoint {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

}  // namespace

void check_compatible(const Manifest& m, const std::vector<UnitInfo>& units, const std::string& name) {
  std::set<std::string> seen;
  for (const auto& u : units) {
    for (const auto& p : u.params) {
      seen.insert(p.name);
      auto it = m.params.find(p.name);
      FSDP_CHECK(it != m.params.end(), "checkpoint ", name, " holds a different model: it has no parameter '", p.name,
                 "' ", shape_str(p.shape), "; resume with the model it was saved with (its config is in ", name, "/",
                 kManifest, ") or use another load_latest_checkpoint: dir");
      FSDP_CHECK(it->second.shape == p.shape, "checkpoint ", name, " holds a different model: parameter '", p.name,
                 "' has shape ", shape_str(it->second.shape), " there but ", shape_str(p.shape),
                 " in this model; resume with the model it was saved with (its config is in ", name, "/", kManifest,
                 ") or use another load_latest_checkpoint: dir");
    }
  }
  for (const auto& [pname, sp] : m.params) {
    FSDP_CHECK(seen.count(pname) == 1, "checkpoint ", name, " holds a different model: its parameter '", pname, "' ",
               shape_str(sp.shape), " is not in this model; resume with the model it was saved with or use another "
               "load_latest_checkpoint: dir");
  }
}

void raise_agreed(const Agreement& all, const std::string& name, const std::string& path) {
  if (all.ok()) return;
  const RankStatus& d = all.decision();
  const int r = all.deciding_rank();
  switch (d.kind) {
    case RankStatus::Kind::kUsage: detail::throw_usage(d.message);  // the same on every rank
    case RankStatus::Kind::kDamaged: {
      const std::string prefix = detail::cat("checkpoint ", name, " is damaged: file ", d.file, ": ");
      const std::string why = d.message.rfind(prefix, 0) == 0 ? d.message.substr(prefix.size()) : d.message;
      throw DamagedCheckpoint(name, d.file, detail::cat(why, " (found by rank ", r, ")"));
    }
    default: FSDP_FAIL("loading checkpoint ", path, " failed on rank ", r, ": ", d.message);
  }
}

const nlohmann::json* carried_list(const Manifest& m) {
  static const nlohmann::json kNone = nlohmann::json::array();
  return m.json.contains("carried") ? &m.json.at("carried") : &kNone;
}

LoadResult loaded_from(const Manifest& m, const std::string& path) {
  LoadResult result;
  result.loaded = true;
  result.step = m.step;
  result.path = path;
  result.manifest = m.json;
  result.state = m.state;
  const nlohmann::json ts = result.saved(kTrainerKey);
  result.trainer_state = ts.is_object() ? ts : nlohmann::json::object();
  return result;
}

}  // namespace fsdp::checkpoint

// The step_N directory protocol (Note [Checkpoint payloads], payload.h):
// naming, stale temporaries, ownership (Note [Ownership of what we delete]),
// the hold on --checkpoint-dir, the commit (Note [Checkpoint commit]),
// keep_last and the fallback past damaged checkpoints. What a step_N holds is
// its payload's: our shard files (shard_files.cpp) or DCP (dcp_payload.cpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "carried.h"
#include "file_io.h"
#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/remove.h"
#include "manifest.h"
#include "payload.h"
#include "save_job.h"
#include "shard_position.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".lock";

// N of "step_N" (8 or more digits), else nothing.
std::optional<int64_t> step_of(const std::string& name) {
  const std::string prefix = "step_";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() < 8 || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

// What interrupted saves leave: .tmp-step_N, .old-step_N and .del-step_N directories.
std::vector<fs::path> stale_temporaries(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* prefix : {".tmp-step_", ".old-step_", ".del-step_"}) {
      if (name.rfind(prefix, 0) == 0) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A save of step_N may replace an existing checkpoint step_N, never anything else of that name.
void check_checkpoint_name_free(const fs::path& final) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final, ec))) return;
  // A checkpoint linked in from elsewhere counts as one: a save replaces the link, never what it names.
  FSDP_CHECK(fs::is_directory(final, ec) && fs::exists(final / kManifest, ec), "cannot save ",
             final.string(), ": it exists and is not a checkpoint (no ", kManifest, "), and this program never "
             "overwrites what it did not write; move it out of save_checkpoint: dir ", final.parent_path().string(),
             " and resume");
}

// Rank 0's manifest.json of a save as it is now (the owners' metadata change
// with every step), but the payload's fields (Payload::finish adds them).
nlohmann::json manifest_base(int64_t step, ShardedModel& model, const std::vector<StateOwner*>& owners,
                             comm::ProcessGroup& group, const SaveOptions& options) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : model.units()) {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : u.params) {
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"flat_offset", p.flat_offset}, {"numel", p.numel}});
    }
    units.push_back({{"name", u.name},
                     {"numel", u.numel},
                     {"padded_numel", u.padded_numel},
                     {"shard_numel", u.shard_numel},
                     {"params", params}});
  }
  nlohmann::json saved_state = nlohmann::json::object();
  for (StateOwner* owner : owners) saved_state[owner->state_key()] = owner->state_metadata();
  const ShardPosition p0 = shard_position(model, group);
  const int64_t replicas = model.replicate_group() ? model.replicate_group()->size()
                                                   : (p0.count == 1 ? group.size() : 1);
  return {{"format", kFormat},
          {"version", kVersion},
          {"step", step},
          {"world_size", group.size()},
          {"shard_group_size", p0.count},
          {"replicate_group_size", replicas},
          {"strategy", to_string(model.options().strategy)},
          {"state", saved_state},
          {"units", units},
          {"checksum", {{"algorithm", "crc32c"}, {"block_size", options.block_size}}}};
}

// keep_last: deletes the oldest complete checkpoints, only once the new one is
// complete. Only checkpoints older than this one count: newer ones can only be
// leftovers of a run this one fell back from (damaged); they are left alone.
// Returns the names deleted.
std::vector<std::string> prune_older(const SaveJob& job) {
  const fs::path root(job.dir);
  std::vector<std::string> pruned;
  std::vector<CheckpointInfo> all;
  for (const auto& c : list_checkpoints(job.dir)) {
    if (c.step <= job.step) all.push_back(c);
  }
  for (size_t i = static_cast<size_t>(job.options.keep_last); i < all.size(); ++i) {
    const fs::path doomed(all[i].path);
    if (entry_kind(doomed.string()) == EntryKind::kLink) {
      // A checkpoint linked in from elsewhere: the link goes, what it points
      // to stays (Note [Removing without following links]).
      if (const std::string why = remove_tree(doomed.string()); !why.empty()) {
        FSDP_FAIL("cannot remove the link ", doomed.string(), ": ", why);
      }
      io::fsync_dir(root.string());
      pruned.push_back(doomed.filename().string());
      continue;
    }
    const fs::path del = root / (".del-" + doomed.filename().string());
    remove_owned_directory(del.string());
    if (!is_owned_directory(doomed.string())) mark_owned(doomed.string());  // saved by an older version
    io::rename_path(doomed.string(), del.string());
    io::fsync_dir(root.string());
    discard_owned_directory(del.string());  // the marker last: a kill leaves a removable .del-
    pruned.push_back(doomed.filename().string());
  }
  return pruned;
}

// What a committed step_N holds picks the payload that loads it: DCP files,
// else our shard files.
std::shared_ptr<Payload> payload_in(const std::string& path) {
  if (is_dcp_dir(path)) return make_dcp_payload(DcpSaveOptions{});
  return make_shard_file_payload(SaveOptions{}, fs::path(path).filename().string());
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored) {
  std::vector<CheckpointInfo> out;
  std::vector<std::string> skipped;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::optional<int64_t> step = step_of(name);
    if (!step) continue;
    if (!e.is_directory(ec)) {
      skipped.push_back(name + " (not a directory)");
    } else if (!fs::exists(e.path() / kManifest, ec)) {
      skipped.push_back(detail::cat(name, " (no ", kManifest, ")"));
    } else {
      out.push_back({*step, e.path().string()});
    }
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
  std::sort(skipped.begin(), skipped.end());
  if (ignored != nullptr) *ignored = std::move(skipped);
  return out;
}

void check_checkpoint_dir(const std::string& dir) {
  std::vector<std::string> foreign;
  list_checkpoints(dir, &foreign);
  if (!foreign.empty()) {
    std::string names;
    for (const auto& f : foreign) names += (names.empty() ? "" : ", ") + f;
    FSDP_CHECK(false, "check_checkpoint_dir: dir ", dir, " holds ", names, ": named like a checkpoint but not one (a "
               "partial copy, a checkpoint whose ", kManifest, " was lost, or other files). A save could need that "
               "name, and this program never overwrites or deletes what it did not write: move ",
               foreign.size() == 1 ? "it" : "them", " out of ", dir, " (or restore the ", kManifest, ") and run again");
  }
  for (const auto& p : stale_temporaries(dir)) check_removable(p.string());
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  const std::vector<fs::path> doomed = stale_temporaries(dir);
  for (const auto& p : doomed) check_removable(p.string());  // all or nothing
  std::vector<std::string> removed;
  for (const auto& p : doomed) {
    remove_owned_directory(p.string());
    removed.push_back(p.filename().string());
  }
  return removed;
}

CheckpointDirHold open_checkpoint_dir(const std::string& dir, comm::ProcessGroup& group) {
  CheckpointDirHold hold;
  RankStatus refused;
  if (group.rank() == 0) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) FSDP_FAIL("cannot create open_checkpoint_dir: dir ", dir, ": ", ec.message());
      hold.lock = std::make_unique<DirectoryLock>((fs::path(dir) / kLockFile).string(),
                                                  "open_checkpoint_dir: dir " + dir);
      check_checkpoint_dir(dir);
      hold.removed = remove_stale_temporaries(dir);
    } catch (const std::exception& e) {
      refused = RankStatus::of(e);
      hold.lock.reset();
    }
  }
  agree(group, refused).raise_if_failed("opening open_checkpoint_dir: dir " + dir + " failed");
  return hold;
}

SaveJob begin_save(const std::string& dir, int64_t step, ShardedModel& model, const std::vector<StateOwner*>& owners,
                   comm::ProcessGroup& group, const SaveOptions& options) {
  FSDP_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  FSDP_CHECK(options.block_size >= 64 && options.block_size % 64 == 0,
             "checkpoint block size must be a positive multiple of 64 bytes, got ", options.block_size);
  SaveJob job;
  job.t0 = io::now_seconds();
  job.dir = dir;
  job.step = step;
  job.name = checkpoint_name(step);
  const fs::path root(dir);
  job.tmp = (root / (".tmp-" + job.name)).string();
  job.final = (root / job.name).string();
  job.rank = group.rank();
  job.lead = group.rank() == 0;
  job.options = options;
  // The payload holds its own copy of the DCP options: the caller's may go before commit_save.
  job.options.dcp = nullptr;
  job.payload = options.dcp != nullptr ? make_dcp_payload(*options.dcp) : make_shard_file_payload(options, job.name);
  job.stager = std::make_shared<Stager>();

  // 1. Rank 0 prepares an empty temporary directory (Note [Ownership of what
  // we delete]: a step_N that is not a checkpoint is never replaced).
  RankStatus prepared;
  if (job.lead) {
    prepared = RankStatus::capture([&] {
      fs::create_directories(root);
      check_checkpoint_name_free(job.final);
      remove_owned_directory(job.tmp);  // left by a crashed save of the same step
      create_owned_directory(job.tmp);
    });
  }
  agree(group, prepared).raise_if_failed("saving checkpoint " + job.final + ": creating " + job.tmp + " failed");

  // 2. What this rank writes (Note [Save phases]), and the manifest as it is
  // now: the owners' metadata changes with every step.
  const RankStatus collected = RankStatus::capture([&] {
    job.write = job.payload->prepare(job.tmp, model, owners, group, job.stager);
    if (job.lead) job.manifest = manifest_base(step, model, owners, group, options);
  });
  const Agreement all = agree(group, collected);
  if (!all.ok()) {
    if (job.lead && is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // the marker last
    all.raise_if_failed("saving checkpoint " + job.final + " failed (the previous checkpoints are untouched)");
  }
  return job;
}

SaveResult commit_save(SaveJob& job, const RankStatus& written, comm::ProcessGroup& group) {
  const Agreement records = agree(group, written);
  if (!records.ok()) {
    if (job.lead && is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // the marker last
    records.raise_if_failed("saving checkpoint " + job.final + " failed (the previous checkpoints are untouched)");
  }

  // Note [Checkpoint commit]. A checkpoint becomes visible by one rename of its
  // directory, after (a) every writer wrote and fsynced its file inside
  // .tmp-step_N, (b) the ranks exchanged sizes and checksums (all_gather: no
  // rank reaches the commit before every file is durable), (c) rank 0 wrote and
  // fsynced manifest.json and manifest.crc32c and fsynced the directory. The
  // parent is fsynced after the rename, so a power loss after save_checkpoint
  // returns cannot undo it. A crash before the rename leaves only .tmp-step_N,
  // which no reader takes for a checkpoint (list_checkpoints wants step_N with
  // a manifest) and remove_stale_temporaries deletes; a crash after it leaves a
  // complete checkpoint. An existing step_N (a run that fell back to an older
  // step and reached N again) is swapped out atomically (replace_directory).
  // An asynchronous save (async_save.h) commits the same way, later.
  int64_t bytes = 0;
  SaveResult result;
  result.path = job.final;
  RankStatus committed;
  if (!job.lead) bytes = job.payload->finish(job.tmp, records, nullptr);
  if (job.lead) {
    try {
      nlohmann::json m = job.manifest;
      bytes += job.payload->finish(job.tmp, records, &m);
      if (!job.options.carried.empty()) m["carried"] = write_carried_files(job.tmp, job.options.carried);
      const std::string text = m.dump(1) + "\n";
      io::write_text_file((fs::path(job.tmp) / kManifest).string(), text);
      io::write_text_file((fs::path(job.tmp) / kManifestCrc).string(), hex32(crc32c(text.data(), text.size())) + "\n");
      bytes += static_cast<int64_t>(text.size()) + 9;
      io::fsync_dir(job.tmp);
      io::replace_directory(job.tmp, job.final);
      if (job.options.keep_last > 0) result.pruned = prune_older(job);
    } catch (const std::exception& e) {
      committed = RankStatus::of(e);
      if (is_owned_directory(job.tmp)) discard_owned_directory(job.tmp);  // not committed: nothing to keep
    }
  }
  agree(group, committed).raise_if_failed("saving checkpoint " + job.final + " failed");
  result.io.bytes = bytes;  // rank 0's count is the whole (the DCP files and the manifest are counted there)
  result.io.seconds = io::now_seconds() - job.t0;
  return result;
}

SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model,
                           const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                           const SaveOptions& options) {
  SaveJob job = begin_save(dir, step, model, owners, group, options);
  const RankStatus written = job.write();
  return commit_save(job, written, group);
}

LoadResult load_checkpoint(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                           comm::ProcessGroup& group, const LoadOptions& options) {
  return payload_in(path)->load(path, model, owners, group, options);
}

LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model,
                                  const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                  const LoadOptions& options) {
  // Rank 0's view of the directory decides, so every rank tries the same ones.
  nlohmann::json mine = nlohmann::json::array();
  const RankStatus listed = RankStatus::capture([&] {
    if (group.rank() == 0) {
      for (const auto& c : list_checkpoints(dir)) mine.push_back(c.path);
    }
  });
  const Agreement all = agree(group, listed.ok() ? RankStatus::success(mine.dump()) : listed);
  all.raise_if_failed("listing the checkpoints in " + dir + " failed");
  const std::vector<std::string> candidates =
      all.ranks()[0].payload_json().get<std::vector<std::string>>();
  std::vector<std::string> rejected;
  for (const auto& c : candidates) {
    try {
      LoadResult r = load_checkpoint(c, model, owners, group, options);
      r.rejected = rejected;
      return r;
    } catch (const DamagedCheckpoint& e) {
      rejected.push_back(e.what());
    }
  }
  LoadResult none;
  if (!rejected.empty()) {
    std::string msg;
    for (const auto& r : rejected) msg += "\n  " + r;
    FSDP_FAIL("every checkpoint in ", dir, " is damaged:", msg,
              "\nmove the damaged checkpoints out of the directory to start from scratch");
  }
  return none;
}

namespace {
// The owners of the convenience overloads: the optimizer (may be null), the
// model's configuration and the trainer's state as metadata.
std::vector<StateOwner*> owners_of(StateOwner* optimizer, MetadataState* model, MetadataState* trainer) {
  std::vector<StateOwner*> out = {model, trainer};
  if (optimizer != nullptr) out.push_back(optimizer);
  return out;
}
}  // namespace

SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model, StateOwner* optimizer,
                           const nlohmann::json& model_config, const nlohmann::json& trainer_state,
                           comm::ProcessGroup& group, const SaveOptions& options) {
  MetadataState m(kModelKey, {{"config", model_config}});
  MetadataState t(kTrainerKey, trainer_state);
  return save_checkpoint(dir, step, model, owners_of(optimizer, &m, &t), group, options);
}

LoadResult load_checkpoint(const std::string& path, ShardedModel& model, StateOwner* optimizer,
                           comm::ProcessGroup& group, const LoadOptions& options) {
  MetadataState m(kModelKey, nullptr);
  MetadataState t(kTrainerKey, nullptr);
  return load_checkpoint(path, model, owners_of(optimizer, &m, &t), group, options);
}

LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model, StateOwner* optimizer,
                                  comm::ProcessGroup& group, const LoadOptions& options) {
  MetadataState m(kModelKey, nullptr);
  MetadataState t(kTrainerKey, nullptr);
  return load_latest_checkpoint(dir, model, owners_of(optimizer, &m, &t), group, options);
}

nlohmann::json LoadResult::saved(const std::string& key) const {
  return state->is_object() && state->contains(key) ? state->at(key) : nlohmann::json();
}

JsonValue read_checkpoint_state(const std::string& path) { return read_manifest(fs::path(path)).state; }

}  // namespace fsdp::checkpoint

// Sharded checkpoints: every rank writes its own shards, in parallel, into one
// directory per checkpoint; loading re-cuts the shards for any world size,
// sharding strategy or wrap policy.
// Inside (Note [Checkpoint payloads], src/checkpoint/payload.h): the step_N
// directory protocol below is src/checkpoint/step_dir.cpp; what a step_N holds
// is a payload behind one seam, our shard files (the format below,
// src/checkpoint/shard_files.cpp) or a DCP directory (SaveOptions::dcp, dcp.h).
//
// Layout of --checkpoint-dir:
//   step_00000100/                      a complete checkpoint: the state after 100 optimizer steps
//     manifest.json                     the layout (below); written last, by rank 0
//     manifest.crc32c                   CRC-32C of manifest.json, 8 hex digits
//     shard-00000-of-00002.bin          shard 0's sections (raw little-endian, back to back)
//     shard-00001-of-00002.bin
//     carried/                          copies of the run's tokenizer files (SaveOptions::carried)
//     .fsdp-cpp-owned                   the marker of a directory this program created (below)
//   .tmp-step_00000200/                 a save in progress (or left by a crash): never a checkpoint
//   .old-step_*, .del-step_*            a checkpoint being replaced or deleted (crash leftovers)
//   .lock                               held (flock) by the run that writes here; removed when it ends
// Only `step_<8+ digits>` directories holding manifest.json are checkpoints.
// Temporary directories from crashed saves are removed by
// remove_stale_temporaries() (the trainer calls it at start-up).
//
// Ownership (Note [Ownership of what we delete], checkpoint/ownership.h):
// every .tmp-/.old-/.del- directory holds the marker file .fsdp-cpp-owned from
// right after its creation, and one without it is never removed (a
// UsageError names it). A step_N directory without manifest.json is never
// overwritten or deleted: a run refuses to start on a directory holding one
// (check_checkpoint_dir), and a save of step N refuses to replace it. One run
// at a time writes a directory: open_checkpoint_dir locks it.
//
// Atomicity (Note [Checkpoint commit]): every rank writes and fsyncs its file
// inside .tmp-step_N; the ranks exchange their files' sizes and checksums;
// rank 0 writes and fsyncs manifest.json, fsyncs the directory, renames it to
// step_N (atomically replacing an older step_N, if any, with renameat2's
// RENAME_EXCHANGE) and fsyncs --checkpoint-dir. A crash at any point leaves the
// previous checkpoints untouched and at most a temporary directory. With
// keep_last K, older complete checkpoints are deleted only after the new one
// was renamed into place (each is first renamed to .del-step_N, so a crash
// never leaves a half-deleted step_N).
//
// What is saved (Note [State seam], common/state.h): the model's shards and
// the state slots and metadata of the StateOwners the caller passes (the
// optimizer, the model family's configuration, the trainer's counters). This
// file names no optimizer class and no model family: every owner's slots are
// sections of the shard files, named by their kind, and its metadata is
// manifest.json's "state"[key].
//
// Who writes: one file per shard of the padded flat parameters. Shard groups
// of size S give S files; HYBRID_SHARD's replicas hold identical shards, so
// only replicate rank 0 (the first shard group) writes; NO_SHARD writes one
// file, from rank 0. A file holds, for each unit in order, the sections
//   param       the unit's local shard (shard dtype: F32, or BF16 with bf16 master weights)
//   exp_avg     AdamW first moment (state dtype)
//   exp_avg_sq  AdamW second moment
//   compensation  Kahan compensation buffer (only when the optimizer has one)
// each `shard_numel` elements of the padded flat index space, starting at
// flat index shard_index * shard_numel (padding included; it is zero).
//
// manifest.json (format "fsdp-cpp/sharded-checkpoint", version 2):
//   { "format", "version", "step",
//     "world_size", "shard_group_size", "replicate_group_size", "strategy",
//     "state": {owner key: its state_metadata(), e.g.
//               "model": {"family": "llama", "config": {Hugging Face config.json fields}},
//               "optimizer": {"type": "AdamW", "step": t, "options": {...}},
//               "trainer": {step, seed, data position, schedule, ...}},
//     "units": [ {"name", "numel", "padded_numel", "shard_numel",
//                 "params": [ {"name", "shape", "flat_offset", "numel"} ]} ],
//     "checksum": {"algorithm": "crc32c", "block_size": 1048576},
//     "carried": [ {"name", "size", "crc32c"} ]   (files in carried/: Note [Carried files]; absent: none)
//     "files": [ {"name", "size", "crc32c": "8 hex digits", "shard_index",
//                 "block_crc32c": base64 of the little-endian uint32 CRC-32C of
//                                 each block_size bytes of the file (the last may be short),
//                 "sections": [ {"unit", "kind", "dtype", "flat_begin", "numel", "offset"} ]} ] }
//
// Version 1 (written before the state seam) is read as version 2: its
// "model_config" is state "model" {"family": "llama", "config": ...}, its
// "optimizer" state "optimizer", its "trainer_state" state "trainer"; its
// sections (param, exp_avg, exp_avg_sq, compensation) are those of version 2.
//
// Loading (Note [Resharding on load]): for every parameter, the part that
// falls in this rank's new shard range is one contiguous element range; in the
// saved layout it is one contiguous range of the same parameter, spread over
// the saved shard files in at most a few contiguous byte ranges. Each rank
// reads only those byte ranges (widened to whole checksum blocks, which it
// verifies), converting dtypes if the saved and current dtypes differ.
// Parameters are matched by name and shape, so the wrap policy, the strategy
// and the world size may all change between save and load.
//
// Damage (a missing or truncated file, a checksum mismatch, an unreadable
// manifest) throws DamagedCheckpoint naming the checkpoint and the file on
// every rank (the ranks agree before returning); load_latest_checkpoint then
// falls back to the next older checkpoint. A checkpoint of another model
// (parameter names or shapes differ) is a UsageError naming the parameter and
// both shapes.
//
// Every function that takes a ProcessGroup is collective over it: call it on
// every rank of the job (all ranks of the model's world), in the same order.
// --checkpoint-dir must be one directory visible to every rank (a shared file
// system on several nodes), like PyTorch's distributed checkpoint.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/types.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_value.h"
#include "fsdp/common/state.h"
#include "fsdp/fsdp.h"

namespace fsdp::checkpoint {

// "step_00000100"
std::string checkpoint_name(int64_t step);

// One complete checkpoint found in a directory.
struct CheckpointInfo {
  int64_t step = 0;  // optimizer steps it holds the state after
  std::string path;  // its step_N directory
};
// Complete checkpoints in `dir` (step_N directories holding manifest.json),
// newest first; empty if `dir` does not exist. `ignored` (when given)
// receives each entry named like a checkpoint that is not one, with the
// reason: "step_00000002 (no manifest.json)".
std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored = nullptr);

// UsageError unless everything in `dir` that is named like ours is ours:
// every step_N is a checkpoint (holds manifest.json) and every .tmp-/.old-/
// .del-step_N directory holds the ownership marker. The message names the
// entries and says to move them out.
void check_checkpoint_dir(const std::string& dir);

// Removes what interrupted saves left in `dir` (.tmp-*, .old-*, .del-*
// directories holding the ownership marker); never a complete checkpoint.
// Returns the names removed. UsageError (removing nothing) when one lacks the
// marker. Call on one rank while no save is running.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

// What open_checkpoint_dir returns: keep it as long as the run writes the directory.
struct CheckpointDirHold {
  std::unique_ptr<DirectoryLock> lock;  // rank 0's lock on the directory; null on the other ranks
  std::vector<std::string> removed;     // stale temporaries rank 0 removed (empty on the other ranks)
};
// Opens `dir` for a training run. Collective over `group`: rank 0 creates
// `dir` if missing, locks it (DIR/.lock, held as long as the returned lock
// lives), checks it (check_checkpoint_dir) and removes stale temporaries.
// A refusal (another run holds the lock, an entry that is not ours) is a
// UsageError on every rank.
CheckpointDirHold open_checkpoint_dir(const std::string& dir, comm::ProcessGroup& group);

// Declared, not included: dcp.h is a payload below this protocol and includes
// only types.h, so no checkpoint header includes its way back here.
struct DcpSaveOptions;  // how a DCP directory is written (checkpoint/dcp.h)
struct DcpNames;        // another program's parameter names (checkpoint/dcp.h)

// How save_checkpoint saves.
struct SaveOptions {
  // > 0: afterwards keep only the newest K complete checkpoints up to this
  // step (this one included); checkpoints of later steps are not touched.
  int keep_last = 0;
  bool progress = false;          // progress bar on stderr for long saves (the caller checks isatty, rank 0)
  int64_t block_size = 1 << 20;   // checksum granularity, bytes
  // Non-null: step_N is a PyTorch distributed checkpoint (dcp.h) that
  // torch.distributed.checkpoint.load reads as it is, beside manifest.json
  // (the step, the owners' metadata, the units, each DCP file's size), under
  // the same commit protocol, keep_last and damage fallback.
  const DcpSaveOptions* dcp = nullptr;
  // Copied by rank 0 into the checkpoint (Note [Carried files]).
  std::vector<CarriedFile> carried;
};

// What save_checkpoint did.
struct SaveResult {
  std::string path;                 // the complete checkpoint
  IoStats io;                       // bytes written by all ranks, and the time
  std::vector<std::string> pruned;  // checkpoints deleted by keep_last
};

// The key of the model family's metadata ({"family", "config"}) in a checkpoint.
inline constexpr const char* kModelKey = "model";
// The key of the trainer's metadata (its counters and data position); the optimizer's is "optimizer".
inline constexpr const char* kTrainerKey = "trainer";

// Saves the model's shards and the owners' slots and metadata as checkpoint
// `step` in `dir` (created if missing). Owners' keys and slot kinds must
// differ (UsageError). Collective over `group`, whose rank 0 commits; group
// must span the model's world. Requires: no forward/backward in progress.
// Throws Failure (on every rank) if any rank fails; the previous checkpoints
// are then untouched.
SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model,
                           const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                           const SaveOptions& options = {});
// The same with three owners: `optimizer` (may be null: parameters only),
// "model" {"config": model_config} and "trainer" `trainer_state`.
SaveResult save_checkpoint(const std::string& dir, int64_t step, ShardedModel& model, StateOwner* optimizer,
                           const nlohmann::json& model_config, const nlohmann::json& trainer_state,
                           comm::ProcessGroup& group, const SaveOptions& options = {});

// How load_checkpoint loads.
struct LoadOptions {
  bool progress = false;  // progress bar on stderr for long loads
  // The torchtitan names of the model (dcp.h), for a DCP-format checkpoint
  // saved with that layout (its manifest says which); null: none at hand.
  const DcpNames* dcp_names = nullptr;
};

// What load_checkpoint or load_latest_checkpoint loaded.
struct LoadResult {
  bool loaded = false;      // false: nothing was loaded (load_latest_checkpoint found no checkpoint)
  int64_t step = -1;        // the checkpoint's step (optimizer steps done)
  std::string path;         // its directory
  JsonValue manifest;       // manifest.json as saved (any version)
  JsonValue state;          // every owner's saved metadata by key (version 1 translated), {} when none
  JsonValue trainer_state;  // state "trainer"; {} when the checkpoint has none
  // state[key], or null when the checkpoint has none for `key`.
  nlohmann::json saved(const std::string& key) const;
  IoStats io;               // bytes read by all ranks, and the time
  std::vector<CarriedFile> carried;  // the checkpoint's carried files, checked (Note [Carried files])
  // Newer checkpoints skipped as damaged, one line each ("step_00000020: file
  // shard-00001-of-00002.bin: ..."), the same on every rank.
  std::vector<std::string> rejected;
};

// Loads checkpoint directory `path` into the model's shards (every element,
// padding zeroed) and the owners' slots (required kinds must be in the
// checkpoint for every parameter, others it lacks are zeroed), then hands
// each owner its saved metadata (load_state_metadata; null when absent), which
// may refuse it (UsageError). Collective. DamagedCheckpoint / UsageError as
// described above.
LoadResult load_checkpoint(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                           comm::ProcessGroup& group, const LoadOptions& options = {});
// With the optimizer (may be null) as the only owner with slots.
LoadResult load_checkpoint(const std::string& path, ShardedModel& model, StateOwner* optimizer,
                           comm::ProcessGroup& group, const LoadOptions& options = {});

// The newest complete checkpoint in `dir` that loads without damage; damaged
// ones are skipped (listed in `rejected`). loaded == false when `dir` holds no
// checkpoint. Throws Failure when there are checkpoints but every one is damaged
// (the model's state is then unspecified). Collective.
LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model,
                                  const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                  const LoadOptions& options = {});
// With the optimizer (may be null) as the only owner with slots.
LoadResult load_latest_checkpoint(const std::string& dir, ShardedModel& model, StateOwner* optimizer,
                                  comm::ProcessGroup& group, const LoadOptions& options = {});

// The owners' metadata saved in checkpoint directory `path` (state, as in
// LoadResult), read from its manifest without loading anything else. Throws
// DamagedCheckpoint for an unreadable or damaged manifest.
JsonValue read_checkpoint_state(const std::string& path);

}  // namespace fsdp::checkpoint

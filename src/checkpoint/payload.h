// What a step_N checkpoint holds, behind one seam (internal to the checkpoint
// layer).
//
// Note [Checkpoint payloads]. A checkpoint is a protocol and a payload. The
// protocol (step_dir.cpp) owns the directory: step_N naming, the .tmp-/.old-/
// .del- temporaries and their ownership marker, the hold on the directory, the
// commit (manifest.json, its checksum, the rename, keep_last) and the fallback
// past damaged checkpoints. A payload owns the files inside one step_N and
// nothing about their directory:
//   prepare  begin_save, every rank: registers with the Stager what this rank
//            writes into .tmp-step_N and returns the write (Note [Save phases]);
//   finish   commit_save, once every rank's write succeeded: rank 0 completes
//            the files (DCP's .metadata) and puts the payload's own fields into
//            the manifest ("files"; "dcp");
//   load     reads a committed step_N into the model and the owners.
// Two payloads stand behind it: our shard files (shard_files.cpp, the format
// sharded.h describes) and PyTorch's distributed checkpoint (dcp_payload.cpp
// over dcp.h). SaveOptions::dcp picks the payload of a save, what a step_N
// holds picks the payload of a load; no other place asks which one it is.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/sharded.h"
#include "manifest.h"
#include "stager.h"

namespace fsdp::checkpoint {

class Payload {
 public:
  virtual ~Payload() = default;
  // Every rank, collective over `group` only in what it reads of the model:
  // registers the tensors the write reads with `stager` and returns the write
  // into `tmp` (records of this rank's files as its payload; empty or none:
  // this rank writes nothing). Snapshots whatever changes with training.
  virtual std::function<RankStatus()> prepare(const std::string& tmp, ShardedModel& model,
                                              const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                              const std::shared_ptr<Stager>& stager) = 0;
  // Every rank, after every rank's write succeeded (`records`); `manifest` is
  // non-null on rank 0 only, which completes `tmp` and adds the payload's
  // fields to it. Returns the bytes of the payload's files, all ranks
  // together, as far as this rank knows them (rank 0 knows them all).
  virtual int64_t finish(const std::string& tmp, const Agreement& records, nlohmann::json* manifest) = 0;
  // Loads step_N directory `path`. Collective; DamagedCheckpoint / UsageError
  // the same on every rank (sharded.h, load_checkpoint).
  virtual LoadResult load(const std::string& path, ShardedModel& model, const std::vector<StateOwner*>& owners,
                          comm::ProcessGroup& group, const LoadOptions& options) = 0;
};

// Our shard files (the format of sharded.h): the save's block size and progress bar.
std::shared_ptr<Payload> make_shard_file_payload(const SaveOptions& options, const std::string& name);
// A DCP directory under our manifest (dcp.h); `options` is copied.
std::shared_ptr<Payload> make_dcp_payload(const DcpSaveOptions& options);

// ---- what both payloads' loads share (payload.cpp) --------------------------------------

// Every parameter of the model must be in the checkpoint named `name` with the
// same shape, and the checkpoint must hold no other parameters: UsageError.
void check_compatible(const Manifest& m, const std::vector<UnitInfo>& units, const std::string& name);
// When the ranks' reports of loading checkpoint `name` (at `path`) are not
// all ok: the deciding usage error, else the damage (as this checkpoint's, so
// load_latest_checkpoint falls back on every rank), else the failure.
void raise_agreed(const Agreement& all, const std::string& name, const std::string& path);
// The manifest's carried files (an empty list when it names none).
const nlohmann::json* carried_list(const Manifest& m);
// A loaded step_N's result as its manifest says: loaded, step, path, manifest,
// state, trainer_state (io, carried and rejected are the caller's).
LoadResult loaded_from(const Manifest& m, const std::string& path);

// ---- the DCP format's write, in the payload's halves (dcp.cpp) --------------------------

// The write phase of a DCP save into `dir`: registers what this rank writes
// with `stager` and returns the write (records of its items as the payload,
// {"records", "bytes"}). Snapshots the owners' metadata now.
std::function<RankStatus()> prepare_dcp_write(const std::string& dir, ShardedModel& model,
                                              const std::vector<StateOwner*>& owners, comm::ProcessGroup& group,
                                              const DcpSaveOptions& options, std::shared_ptr<Stager> stager);
// Rank 0, after every rank's write succeeded (`all`): writes .metadata (the
// torch_save format) and fsyncs `dir`. Returns the bytes all ranks wrote.
int64_t finish_dcp_write(const std::string& dir, const Agreement& all, const DcpSaveOptions& options, bool lead);

}  // namespace fsdp::checkpoint

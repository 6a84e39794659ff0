// The phases of one checkpoint save (internal to the checkpoint layer; the
// step_N protocol, step_dir.cpp): save_checkpoint runs them back to back on the caller's
// thread; async_save.cpp (checkpoint/async_save.h) runs the write on its
// writer thread while training goes on.
//
// Note [Save phases]
//   begin_save   collective: rank 0 creates .tmp-step_N; every rank's payload
//                collects what it writes (the model's shards, the owners' slots) and
//                snapshots everything that changes with training (the owners'
//                metadata, the manifest's fields); with Staging::kCopy it
//                copies the tensors into host buffers (a Stager).
//   write        local, any thread, no collective: writes and fsyncs this
//                rank's files into .tmp-step_N, reading only the Stager's
//                tensors and the snapshot; returns this rank's record (or
//                what went wrong) as a RankStatus.
//   commit_save  collective: the ranks agree on every write's status; rank 0
//                finishes the payload (its files' records; DCP's .metadata), writes manifest.json and its
//                checksum, renames .tmp-step_N to step_N and prunes
//                (keep_last), exactly as Note [Checkpoint commit] says. A
//                failed write on any rank discards .tmp-step_N and raises on
//                every rank.
// Between begin_save and commit_save the job holds no reference to the
// model or the owners: with kCopy, training may change them freely.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/sharded.h"
#include "payload.h"
#include "stager.h"

namespace fsdp::checkpoint {

// One save between begin_save and commit_save.
struct SaveJob {
  std::string dir;
  int64_t step = 0;
  std::string name;   // step_N
  std::string tmp;    // DIR/.tmp-step_N
  std::string final;  // DIR/step_N
  int rank = 0;
  bool lead = false;  // rank 0 of the group: commits
  SaveOptions options;                     // options.dcp is null: `payload` holds its own copy
  std::shared_ptr<Payload> payload;        // what step_N holds (Note [Checkpoint payloads])
  nlohmann::json manifest;                 // rank 0: manifest.json but the payload's fields
  std::shared_ptr<Stager> stager;          // what `write` reads
  // This rank's files: their records as the payload (empty: not a writer).
  // Runs once, on any thread; reads only `stager` and what begin_save snapshotted.
  std::function<RankStatus()> write;
  double t0 = 0;      // when begin_save began
};

// Collective over `group`. Requires: no forward/backward in progress; with
// Staging::kLive, the model and the owners unchanged until `write` returned.
// Failure (on every rank) when .tmp-step_N cannot be created.
SaveJob begin_save(const std::string& dir, int64_t step, ShardedModel& model, const std::vector<StateOwner*>& owners,
                   comm::ProcessGroup& group, const SaveOptions& options);

// Collective over `group` (the one begin_save had). `written`: this rank's
// result of job.write(). Throws on every rank when any rank's write failed
// (.tmp-step_N discarded, the previous checkpoints untouched).
SaveResult commit_save(SaveJob& job, const RankStatus& written, comm::ProcessGroup& group);

}  // namespace fsdp::checkpoint

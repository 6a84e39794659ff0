// Asynchronous checkpoint saves: training goes on while a writer thread
// persists a copy of the state staged in host memory.
//
// Note [Asynchronous save]
// A save is the phases of Note [Save phases] (src/checkpoint/save_job.h):
// begin (collective), write (local), commit (collective). start() runs the
// begin on the caller's thread and copies this rank's shards and optimizer
// slots into host buffers (page-locked where a tensor is on a GPU, then one
// wait for the copies: the step's kernels that follow are queued behind them
// on the same stream); the owners' metadata (step counts, the data position)
// are snapshotted at the same moment. A writer thread then writes and fsyncs
// this rank's files into .tmp-step_N from the copies alone, so the model and
// the optimizer may change at once. The commit is collective and runs on the
// caller's thread, in poll() after a later step once every rank's writer has
// ended (one all-reduce of two numbers per step while a save is in flight),
// or in finish(). It is commit_save, the synchronous save's own: the same
// agreement, manifest, checksums, atomic rename and keep_last; so a crash
// (even SIGKILL) before it leaves .tmp-step_N, never a checkpoint, and the
// previous checkpoint stays the newest good one.
//
// At most one save is in flight: start() while one is first waits for it and
// commits it (AsyncStart::waited_for says so). A writer's error is kept
// until the commit, where the ranks agree on it and every rank raises it
// (Failure naming the checkpoint and the rank) from poll(), start() or
// finish(): at the next step or at the end of the run, never lost. Host
// memory: the staging buffers (this rank's state bytes) are kept between
// saves and reused, so a save copies into memory already touched; a state
// larger than AsyncSaveOptions::staging_limit (or than half the host memory
// available, Note [Host memory limits]) is not staged but written before
// start() returns, as a synchronous save would (AsyncStart::staged false).
//
// Every method is called on one thread (the training loop's); only the
// writer thread runs beside it, and it touches only the staged copies and
// files in .tmp-step_N.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/checkpoint/sharded.h"

namespace fsdp::checkpoint {

// Where this rank's asynchronous save is (the same on every rank between calls).
enum class AsyncSaveState {
  kIdle,        // no save in flight; the staging buffers of the last one may stay (reused by the next)
  kWriting,     // the writer thread writes the staged copy into .tmp-step_N; the copy is held
  kWritten,     // this rank's writer ended (files fsynced, or it failed); the copy is held until the commit
  kCommitting,  // commit_save runs on the caller's thread (collective)
};
const char* to_string(AsyncSaveState s);
bool legal(AsyncSaveState from, AsyncSaveState to);

struct AsyncSaveOptions {
  // The most host memory one rank stages for a save, bytes (--checkpoint-staging-limit).
  int64_t staging_limit = int64_t{16} << 30;
};

// A save committed by poll(), finish() or start().
struct AsyncCommit {
  int64_t step = 0;
  SaveResult result;    // result.io.seconds: from start() to the end of the commit
  double commit_s = 0;  // how long the commit held the caller (finish(): the wait for the writers included)
};

// What start() did.
struct AsyncStart {
  std::string path;           // the checkpoint's directory once committed
  bool staged = false;        // true: the writer thread writes it; false: written before start() returned
  std::string not_staged;     // why not staged ("" when staged): the limit it exceeded, with the numbers
  int64_t state_bytes = 0;    // this rank's bytes to write (0 on a rank that writes nothing)
  int64_t staging_bytes = 0;  // host memory this rank's staging buffers hold now
  double stage_s = 0;         // of stall_s: copying into the staging buffers
  double stall_s = 0;         // how long start() held the caller (waited_for's wait and commit included)
  // The save that was in flight when start() was called, committed while
  // waiting (its commit_s counts the wait for its writers).
  std::optional<AsyncCommit> waited_for;
};

class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(AsyncSaveOptions options = {});
  // Waits for the writer thread; commits nothing: a save in flight leaves its
  // .tmp-step_N, which the next run removes (a run that unwinds through an
  // error does not make a checkpoint visible).
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective over `group`, as save_checkpoint. Starts saving checkpoint
  // `step` of the model and the owners into `dir`: commits the save in
  // flight first (waiting for it), begins the new one and stages this rank's
  // state; returns while the writer thread writes it. options.progress is
  // ignored (no progress bar from the writer thread). Throws as
  // save_checkpoint, and the waited-for save's error.
  // Requires: no forward/backward in progress.
  AsyncStart start(const std::string& dir, int64_t step, ShardedModel& model, const std::vector<StateOwner*>& owners,
                   comm::ProcessGroup& group, const SaveOptions& options);
  // Collective over start()'s group; call it on every rank at the same points
  // (after each step). Nothing while no save is in flight; else one
  // all-reduce, and when every rank's writer has ended (or one failed) the
  // commit: returns it, or throws the writer's error on every rank.
  std::optional<AsyncCommit> poll(comm::ProcessGroup& group);
  // Collective: waits for the save in flight, if any, and commits it.
  std::optional<AsyncCommit> finish(comm::ProcessGroup& group);

  AsyncSaveState state() const { return state_; }
  // The step of the save in flight, -1 when none.
  int64_t in_flight_step() const;
  // Host memory the staging buffers hold now, bytes.
  int64_t staging_bytes() const;

 private:
  struct InFlight;
  void transition_to(AsyncSaveState to, const char* what);
  bool writer_ended();  // kWriting -> kWritten once the writer's result is in
  AsyncCommit commit(comm::ProcessGroup& group);

  AsyncSaveOptions options_;
  AsyncSaveState state_ = AsyncSaveState::kIdle;
  std::unique_ptr<InFlight> in_flight_;  // non-null unless kIdle
  struct Pool;
  std::unique_ptr<Pool> pool_;
};

}  // namespace fsdp::checkpoint

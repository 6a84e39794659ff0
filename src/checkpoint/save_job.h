// The phases of one checkpoint save (internal to the checkpoint layer):
// sharded.cpp's save_checkpoint runs them back to back on the caller's
// thread; async_save.cpp (checkpoint/async_save.h) runs the write on its
// writer thread while training goes on.
//
// Note [Save phases]
//   begin_save   collective: rank 0 creates .tmp-step_N; every rank collects
//                what it writes (the model's shards, the owners' slots) and
//                snapshots everything that changes with training (the owners'
//                metadata, the manifest's fields); with Staging::kCopy it
//                copies the tensors into host buffers (a Stager).
//   write        local, any thread, no collective: writes and fsyncs this
//                rank's files into .tmp-step_N, reading only the Stager's
//                tensors and the snapshot; returns this rank's record (or
//                what went wrong) as a RankStatus.
//   commit_save  collective: the ranks agree on every write's status; rank 0
//                writes the DCP .metadata (DCP format), manifest.json and its
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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/checkpoint/agreement.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/sharded.h"

namespace fsdp::checkpoint {

// Where a save's tensors are read from while its files are written.
enum class Staging {
  kLive,  // the model's and the owners' own tensors: they must not change until the write is done
  kCopy,  // copies in host memory (page-locked when the tensor is on a GPU), made by begin_save
};

// Host buffers that can hold one save's copies, kept between saves so that a
// save copies into memory already touched (no page faults on the step's
// time). Index i holds the i-th tensor registered with a Stager.
struct StagingPool {
  std::vector<at::Tensor> buffers;
  int64_t bytes() const;
};

// The tensors one save reads, and their staged copies.
class Stager {
 public:
  // Registers `t` (once per tensor; a repeat is ignored); returns it.
  const at::Tensor& add(const at::Tensor& t);
  // Bytes of every registered tensor: the host memory a copy takes.
  int64_t bytes() const { return bytes_; }
  // Copies every registered tensor into `pool`'s buffers (reused where their
  // size, dtype and pinning fit; allocated otherwise), waits until copies from
  // a GPU are complete, and from then on maps each tensor to its copy.
  void copy(StagingPool& pool);
  bool copied() const { return copied_; }
  // What the writer reads for `t`: its copy after copy(), else t itself.
  // Thread-safe after copy() (read-only).
  at::Tensor operator()(const at::Tensor& t) const;

 private:
  using Key = std::tuple<const void*, int64_t, int>;  // data, elements, dtype
  static Key key_of(const at::Tensor& t);
  std::vector<at::Tensor> tensors_;
  std::map<Key, size_t> index_;
  std::vector<at::Tensor> copies_;
  int64_t bytes_ = 0;
  bool copied_ = false;
};

// One save between begin_save and commit_save.
struct SaveJob {
  std::string dir;
  int64_t step = 0;
  std::string name;   // step_N
  std::string tmp;    // DIR/.tmp-step_N
  std::string final;  // DIR/step_N
  int rank = 0;
  bool lead = false;  // rank 0 of the group: commits
  SaveOptions options;                     // options.dcp points at `dcp` (or is null)
  std::shared_ptr<DcpSaveOptions> dcp;
  nlohmann::json manifest;                 // rank 0: manifest.json but "files" (and "dcp"'s "files")
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

// ---- the DCP format's part (dcp.cpp) ---------------------------------------------------

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

// The trainer's checkpointer: --checkpoint-dir held for the run, the saves
// (synchronous, or in the background with checkpoint.async: Note
// [Asynchronous save] in checkpoint/async_save.h) with their records and log
// lines, keep-last, and the resume from the newest valid checkpoint (ours or
// a PyTorch distributed checkpoint) with its checks (run_state.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/checkpoint/dcp.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/train/model_family.h"
#include "fsdp/train/options.h"
#include "fsdp/train/records.h"
#include "train/console.h"
#include "train/export.h"
#include "train/reporter.h"

namespace fsdp::train {

// What a save or a resume reads and writes of the step loop's state: given
// on each call, so that the checkpointer holds no pointer into it.
struct SaveTarget {
  ShardedModel& model;
  optim::AdamW& optimizer;
  comm::ProcessGroup& group;           // the trainer's scalars group: the saves' collectives
  optim::ShardedGradScaler* scaler;    // null without loss scaling
  const optim::LrSchedule& schedule;
  TrainSummary& summary;               // checkpoints, last_checkpoint, resumed_from
};

class Checkpointer {
 public:
  // Collective over dir_group when options.dir is set: rank 0 locks the
  // directory until the Checkpointer is destroyed and removes what
  // interrupted saves left (Note [Ownership of what we delete]). The run's
  // data and step options are recorded into every checkpoint and checked on
  // a resume (run_state.h); init_from is where a run without a checkpoint
  // starts (said in the log). The options must outlive the Checkpointer.
  Checkpointer(const CheckpointOptions& options, const DataOptions& data, const StepOptions& step,
               const std::string& init_from, ModelConfigPtr cfg, comm::ProcessGroup& dir_group,
               const Reporter& reporter);
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  bool enabled() const { return !o_.dir.empty(); }
  // Note [Export extras]: what --export-hf adds, recorded (and its files
  // carried) in every checkpoint.
  // The files are read here, once: every checkpoint carries these copies
  // (Note [Carried files]), whatever becomes of the files during the run.
  void set_export_extras(ExportExtras extras);
  const ExportExtras& export_extras() const { return hf_extras_; }

  // checkpoint.resume: loads the newest valid checkpoint of checkpoint.dir
  // (else a PyTorch distributed checkpoint at its top) into `t`, logging
  // what was removed, rejected and loaded; returns its step, nullopt when
  // there was none (or no checkpoint.resume).
  std::optional<int64_t> resume(const SaveTarget& t, int64_t global_batch);
  // This model's names of a DCP layout (checkpoint/dcp.h): ours, or torchtitan's.
  checkpoint::DcpNames dcp_names(checkpoint::DcpLayout layout) const;

  // Starts the save of checkpoint `completed` (with checkpoint.async it
  // returns once staged; else it is written); returns its path.
  std::string start_save(const SaveTarget& t, int64_t completed, int64_t global_batch, double epochs);
  // After each step: commits a background save whose writers all ended.
  void poll(const SaveTarget& t);
  // Waits for a save in flight and commits it.
  void finish(const SaveTarget& t);
  // The step of the newest checkpoint in checkpoint.dir of this run, -1: none.
  int64_t saved_at() const { return saved_at_; }
  void set_saved_at(int64_t step) { saved_at_ = step; }
  // The saves since the previous logged step into `rec`: how long they held
  // training, of which waiting, and the staging buffers' bytes now.
  void take_stalls(StepRecord& rec);

 private:
  void resume_from_dcp(const SaveTarget& t, int64_t& step);
  void report_saved(TrainSummary& summary, int64_t step, const checkpoint::SaveResult& r, const std::string& how,
                    double held_s);
  void report_commit(TrainSummary& summary, const std::optional<checkpoint::AsyncCommit>& c);

  const CheckpointOptions& o_;
  const DataOptions& data_;
  const StepOptions& step_;
  const std::string& init_from_;
  const ModelConfigPtr cfg_;
  const LogLine say_;
  const LogLine warn_;
  const bool progress_;
  const nlohmann::json model_state_;  // the model family's checkpoint metadata (model_family.h model_state)
  ExportExtras hf_extras_;
  std::vector<checkpoint::CarriedFile> carried_;  // hf_extras_.files with their bytes (checkpoints only)
  nlohmann::json hf_record_ = export_record(ExportExtras{});
  int64_t saved_at_ = -1;
  double stall_ = 0;
  double wait_ = 0;
  // Declared in the order of teardown's needs: the directory's lock goes
  // after the writer thread (which writes into the directory) has ended.
  checkpoint::CheckpointDirHold dir_;
  std::unique_ptr<checkpoint::AsyncCheckpointer> async_;  // checkpoint.async; null otherwise
};

}  // namespace fsdp::train

// The training loop for Llama-family language models on top of fully_shard.
//
// One step, on every rank (docs/design.md "One training step"):
//   for each of grad_accum micro-batches: forward + backward of loss/grad_accum
//   (gradient synchronization only on the last one), then clip the global
//   gradient norm, AdamW on the local shards, learning rate from the schedule.
// Rank 0 logs
//   Batch 90 Loss: 7.24291, Speed: 9.41 samples/sec, lr: 0.000010 | step 91/500,
//     1204 tokens/s, grad norm 0.8123, peak mem 281 MiB, unsharded 1.2 MiB (plan 1.5 MiB), ETA 3m12s
// (one line) where Loss is the mean over the whole global batch (all ranks),
// Speed counts global samples per second over the steps since the previous log
// line, the ETA extrapolates that interval, and the same step's metrics
// (train/metrics.h: one table of names and meanings) go to the metrics file,
// TensorBoard and the Prometheus endpoint when asked for; on a terminal a
// progress bar stays below the log lines; at the end one "Run summary: ..."
// line says what was trained and where its checkpoints, export, metrics,
// TensorBoard files and trace went.
//
// Three modes (TrainOptions::mode): training; evaluation only (the starting
// weights on every validation window); conversion of a checkpoint to Hugging
// Face files (convert_checkpoint, no data and no training).
#pragma once

#include <functional>
#include <memory>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/train/options.h"
#include "fsdp/train/records.h"

namespace fsdp::train {

// One training run on this rank (docs/design.md "One training step"). Every rank
// of runtime.world_group constructs a Trainer with the same options and then
// calls the same methods in the same order: the constructor and every method
// marked "Collective" run collectives over the world group (or the trainer's
// own group for scalars), and a rank that leaves one out makes the others wait
// until the collective timeout names it.
//
// run() is the whole run (see train() below). A caller with its own loop:
//   Trainer t(options, runtime);
//   t.restore();
//   while (t.step() < options.step.max_steps && !t.stop_requested()) {
//     t.train_step();
//     if (t.step() % 100 == 0) t.save();
//   }
//   t.export_hf();
// --profile-steps tracing is run()'s; such a loop traces nothing.
//
// Errors: UsageError for bad input (options, files), Failure for runtime
// failures (I/O, a non-finite evaluation loss, a collective that times out).
// A method whose "Requires" is not met throws UsageError before doing
// anything, on every rank alike, and the Trainer stays as it was. After any
// other exception the ranks may be at different points of a collective: the
// Trainer can only be destroyed (which stops the data loader and releases
// checkpoint.dir); any method called is refused (UsageError). The order of
// calls is a table of phases (src/train/trainer_phase.h: Constructed,
// Restored, Training, Stopping, Finished, Failed; evaluate, save and
// export_hf return to the phase they were called in); a call out of order
// is refused with the phase and what to call instead.
class Trainer {
 public:
  // Collective. Checks the options (validate_options; UsageError; Mode::kConvert
  // is refused: convert_checkpoint converts). Starts the Prometheus endpoint
  // (log.metrics_port; UsageError when its port is in use), makes
  // cuda:<local rank> current (device kCUDA), checks this
  // rank's memory (check_memory), opens checkpoint.dir (rank 0 locks it until
  // the Trainer is destroyed), loads the tokenizer and the data, builds the
  // model sharded over the world group with the seeded initialization (with
  // fsdp.sync_module_states: rank 0's parameters, read from hf.init_from
  // when given) and the optimizer, and logs the model, data, plan and memory
  // lines. The world group's device must be `options.device`'s.
  Trainer(TrainOptions options, comm::Runtime runtime);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Collective. Puts the starting weights in place: with checkpoint.resume the
  // newest valid checkpoint of checkpoint.dir (parameters, optimizer state,
  // loss scale, step); else, or when it holds none, hf.init_from's weights
  // when given; else the seeded initialization stays. Then rank 0 opens the
  // metrics file (dropping the records of the steps trained again, Note
  // [Metrics after a resume] in src/train/run_state.cpp) and the TensorBoard directory.
  // Requires: once, before any other method. With Mode::kEvaluate and neither
  // a checkpoint found nor hf.init_from: UsageError (nothing to evaluate).
  void restore();

  // Collective. One optimizer step, step() -> step() + 1: grad_accum
  // micro-batches of forward and backward (gradients synchronized on the last
  // one), the loss scaler's check and skip, clipping to step.clip_grad, AdamW
  // at the schedule's learning rate for this step, and one all-reduce agreeing
  // on the loss (the global mean) and on stop_requested (see stop_requested()).
  // On a logged step (every log_every, the last, a stopping one) rank 0 logs
  // the step line and writes its metrics and TensorBoard records. The record
  // is returned and appended to summary().steps.
  // Requires: restore() done; no stop agreed (stop_requested() is false);
  // Mode::kTrain; step() < step.max_steps.
  // Throws UsageError when the loss is not finite.
  StepRecord train_step();

  // Collective. The exact mean next-token loss of the weights now, at step(),
  // over the first max_windows windows of eval.val_data (0: all); logged,
  // recorded (metrics, TensorBoard) and appended to summary().evals.
  // Requires: restore() done; eval.val_data set.
  EvalRecord evaluate(int64_t max_windows = 0);

  // Collective. Saves the checkpoint of step() into checkpoint.dir (sharded
  // parameters and optimizer state, loss scale, data position), deletes those
  // beyond checkpoint.keep_last once it is complete, logs it and returns its
  // path; the checkpoint is complete on return (with checkpoint.async too:
  // run()'s saves are the ones that overlap the steps).
  // Requires: restore() done; checkpoint.dir set.
  std::string save();

  // Collective. Writes the weights now as Hugging Face safetensors and
  // config.json into hf.export_dir (hf.export_dtype, files of at most
  // hf.export_shard_bytes; the special token ids and tokenizer files of Note
  // [Export extras] in src/train/export.cpp) and logs it. With LoRA: the PEFT adapter
  // directory (checkpoint/peft.h; with the tokenizer files), or with
  // lora.merge the merged model.
  // Requires: restore() done; hf.export_dir set.
  void export_hf();

  // Collective. The whole run, as train() describes it, built from the methods
  // above; returns what it did. Requires: no other method called before
  // (run() included: afterwards every method is refused).
  TrainSummary run();

  // Completed steps: restore()'s starting step plus the train_step() calls since.
  int64_t step() const;
  // Whether the last train_step() agreed to stop: some rank's
  // options.stop_requested returned non-zero (the same answer on every rank).
  bool stop_requested() const;
  // What this Trainer has done so far.
  const TrainSummary& summary() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs options.mode on the given runtime (every rank calls it):
// Trainer(options, runtime).run(), or convert_checkpoint for Mode::kConvert.
// Throws UsageError for bad input, Failure for runtime failures.
//
// Order of events: resume from checkpoint.dir (if asked and one exists), else
// initialize from hf.init_from (if given), else the seeded initialization;
// with Mode::kEvaluate, evaluate and skip training; otherwise steps start_step ..
// max_steps-1, with evaluation and checkpoints after every N completed steps,
// a final checkpoint (when checkpoint.dir is set) and finally the export
// (hf.export_dir) — not when stopped early. Rank 0 logs (besides the step lines)
//   Eval Loss: 5.12345 (step 100, 40960 tokens)
//   Saved checkpoint step_00000100 in 0.04 s: 3.2 MB, 0.08 GB/s (<dir>)
//   Resumed from <dir>/step_00000100: 3.2 MB in 0.02 s, 0.16 GB/s
// and appends {"step", "eval_loss", "eval_tokens"} records to the metrics file.
TrainSummary train(const TrainOptions& options, const comm::Runtime& runtime);

// Mode::kConvert (with checkpoint.dir and hf.export_dir; Note [Checkpoint
// conversion] in src/train/validate.cpp), collective: checks the options, loads the
// parameters of checkpoint.dir's newest valid checkpoint into the model its
// manifest describes (options.model, when non-empty, must describe the same
// model), exports them to hf.export_dir as that run's --export-hf would have
// (the same special token ids and carried tokenizer/generation files, recorded
// in the checkpoint), and returns: no data, tokenizer or optimizer state is
// read. Any world size and sharding give the same files.
TrainSummary convert_checkpoint(const TrainOptions& options, const comm::Runtime& runtime);

}  // namespace fsdp::train

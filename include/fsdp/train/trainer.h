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

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/rendezvous.h"
#include "fsdp/data/dataset.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/layers.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"

namespace fsdp::train {

struct DataOptions {
  // Required: text, JSON lines (either possibly gzip-compressed), binary tokens;
  // a file, a directory of shards, or a pattern in the last component.
  std::string path;
  // "byte", a SentencePiece .model, a tiktoken BPE file, a Hugging Face
  // tokenizer.json, or a directory holding tokenizer.json or tokenizer.model.
  std::string tokenizer = "byte";
  data::DataFormat format = data::DataFormat::kAuto;
  std::string text_field = "text";
  // Encoder-decoder models (T5) read (input, target) pairs (data/pairs.h):
  // the JSON-lines fields, and the decoder's width Tt (0: seq_len); seq_len
  // is then the encoder's width Ts.
  std::string input_field = "input";
  std::string target_field = "target";
  int64_t target_len = 0;
  data::TokenDtype token_dtype = data::TokenDtype::kUint16;
  int64_t seq_len = 256;           // T
  bool shuffle = true;
  int64_t prefetch = 2;            // batches the background loader prepares ahead
};

struct StepOptions {
  int64_t batch_size = 8;  // B, per rank and micro-step
  int64_t grad_accum = 1;
  // 0: the global batch is batch_size x grad_accum x world size, so a run
  // resumed at another world size keeps the per-rank batch and changes the
  // global one. > 0: the rows of every optimizer step at any world size;
  // grad_accum becomes global_batch_size / (batch_size x world size), which
  // must divide (Note [Global batch across world sizes], at_world_size).
  int64_t global_batch_size = 0;
  // Rows (of B x T) per chunk of the loss's logits; 0: chosen from the
  // vocabulary (models::default_loss_chunk_rows).
  int64_t loss_chunk_rows = 0;
  // The layers' elementwise work: Hugging Face's operations, or LibTorch's
  // fused kernels where it has them (models::set_layer_kernels).
  models::LayerKernels kernels = models::LayerKernels::kReference;
  int64_t max_steps = 500;  // >= 1 when training
  // 0: train to max_steps. Else run() stops once this many steps are done,
  // saves a checkpoint (checkpoint.dir is required) and exports nothing; the
  // schedule still ends at max_steps, so a later resume continues the same
  // run (an allocation shorter than the run, a world-size change on purpose).
  int64_t stop_at_step = 0;
  double clip_grad = 1.0;  // 0: no clipping
  uint64_t seed = 1337;
};

struct LogOptions {
  int64_t log_every = 10;
  // "": none; else JSON lines appended by rank 0. With checkpoint.resume, the
  // records of steps at or after the resumed step (left by the interrupted
  // run, trained again now) are dropped first, so each step appears once.
  std::string metrics_file;
  bool quiet = false;        // no log lines (tests)
  // "": none; else TensorBoard event files written by rank 0 into this
  // directory (train/tensorboard.h): the logged steps' scalars and eval/loss.
  std::string tensorboard_dir;
  // The run's effective configuration (TOML, as the command line resolved it);
  // "" for none. Rank 0 writes it beside the metrics file
  // (<metrics name without extension>.config.toml) and into the TensorBoard
  // directory (config.toml), each only where nothing is yet or an earlier
  // copy is (it starts with kEffectiveConfigMarker, common/config_file.h), and
  // never over config_file (Note [Output targets], derived names).
  std::string config_text;
  // The file the options were read from (fsdp-train --config), "" for none.
  std::string config_file;
  // Steps [profile_begin, profile_end) are traced (common/trace.h): every
  // rank's spans are merged into one Chrome/Perfetto trace file written by
  // rank 0 to profile_file, and one summary line per traced step is logged.
  // profile_end <= profile_begin: no tracing.
  int64_t profile_begin = 0;
  int64_t profile_end = 0;
  std::string profile_file = "fsdp-trace.json";
  // Prometheus (train/prometheus.h): -1 off; else rank 0 serves its metrics
  // on metrics_host:metrics_port (0: any free port, logged) at /metrics, and
  // with metrics_every_rank every process on metrics_port + its local rank.
  int metrics_port = -1;
  std::string metrics_host = "0.0.0.0";
  bool metrics_every_rank = false;
};

// Which modules of the Llama model become FSDP units: the engine's
// WrapPolicy with the decoder layer as the block.
struct WrapChoice {
  enum class Kind {
    kBlock,  // one unit per decoder layer, the embedding and the head (by_type of models::llama_unit_types())
    kSize,   // a block becomes a unit once it holds min_num_params parameters not yet wrapped
    kRoot,   // the whole model as one unit
    kAll,    // every marked boundary
  };
  Kind kind = Kind::kBlock;
  int64_t min_num_params = 0;  // kSize only: >= 1
};

// Dynamic loss scaling (optim/grad_scaler.h).
enum class LossScaling {
  kAuto,  // on exactly when the parameters are fp16 (mixed_precision.param_dtype == kHalf)
  kOn,
  kOff,
};

// FSDP choices: the engine's FsdpOptions for this model and runtime.
struct ShardingOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  WrapChoice wrap;
  int hybrid_shard_size = 0;      // 0: LOCAL_WORLD_SIZE
  // After each unit's forward, the root's aside (FsdpOptions::reshard_after_forward):
  // unset follows the strategy; to_group(N) keeps a shard over N ranks (hpZ).
  std::optional<ReshardAfterForward> reshard_after_forward;
  bool sync_module_states = false;
  // Memory and precision (FsdpOptions). Pure bf16 (master_dtype kBFloat16)
  // also switches AdamW to bf16 moments with Kahan-compensated updates.
  MixedPrecision mixed_precision;        // fp32 everywhere
  CommCompression compression;           // what the collectives send (FsdpOptions::compression)
  bool activation_checkpointing = false; // every decoder layer
  nn::RecomputePolicy ac_policy = nn::RecomputePolicy::kTail;  // what it recomputes (FsdpOptions::checkpoint_policy)
  bool offload_activations = false;      // checkpointed layers' saved inputs in host memory
  bool cpu_offload = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  int limit_all_gathers = 2;
  LossScaling loss_scaling = LossScaling::kAuto;
  double initial_loss_scale = 65536.0;
};

// Sharded checkpoints (checkpoint/sharded.h) in one directory that serves for
// saving and resuming.
struct CheckpointOptions {
  std::string dir;        // "": no checkpoints
  int64_t every = 0;      // save after every N completed steps (0: only at the end and when stopped)
  int keep_last = 0;      // keep only the newest K complete checkpoints (0: all)
  bool resume = false;    // start from the newest complete, valid checkpoint in `dir` (none: from scratch)
  // "sharded" (ours, checkpoint/sharded.h) | "dcp": each step_N is a PyTorch
  // distributed checkpoint (checkpoint/dcp.h) that torch.distributed.checkpoint.load reads.
  std::string format = "sharded";
  std::string dcp_layout = "torch";       // DCP keys written: "torch" (FSDP2's get_state_dict) | "torchtitan"
  std::string dcp_format = "torch_save";  // DCP items: "torch_save" (DCP's default) | "safetensors"
  // Save in the background (checkpoint/async_save.h, Note [Asynchronous
  // save]): the step goes on while a writer thread persists a copy of the
  // state staged in host memory; at most one save in flight.
  bool async = false;
  // With `async`: the most host memory one rank stages for a save, bytes; a
  // larger state is saved synchronously (said in the log).
  int64_t staging_limit = int64_t{16} << 30;
  // fsdp-train convert's other targets (besides hf.export_dir): a PyTorch distributed
  // checkpoint directory, and a directory of checkpoints of ours (step_N); "": none.
  std::string export_dcp;
  std::string export_checkpoint;
};

// Hugging Face interchange (checkpoint/hf.h).
struct HfOptions {
  std::string init_from;                  // "": no; else a HF model directory to start from (when not resuming)
  std::string export_dir;                 // "": no export; else the final weights go here
  at::ScalarType export_dtype = at::kFloat;  // kFloat (exact) | kBFloat16 | kHalf
  // Split the weights into files of at most this many bytes (transformers'
  // default 5GB); <= 0: one file.
  int64_t export_shard_bytes = 5'000'000'000;
};

// LoRA fine-tuning (models/lora.h): adapters on the chosen projections, the
// rest of the model frozen (no gradients, no optimizer state).
struct LoraOptions {
  int64_t rank = 0;      // r; 0: no LoRA
  double alpha = 0;      // the adapters are scaled by alpha / r; 0: 2 x rank (a scale of 2)
  double dropout = 0;    // on the adapters' input while training; [0, 1)
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  // hf.export_dir receives the merged model (W + (B A) alpha / r, a plain
  // Hugging Face model) instead of the PEFT adapter directory.
  bool merge = false;
  // "": adapters start as peft starts them (A random, B = 0); else a PEFT
  // adapter directory (adapter_config.json + adapter_model.safetensors) of
  // the same rank and targets to start from (when not resuming).
  std::string init_adapter;
  bool enabled() const { return rank != 0; }
  double effective_alpha() const { return alpha > 0 ? alpha : 2.0 * static_cast<double>(rank); }
};

// Evaluation on held-out data: consecutive windows from its start
// (data::EvalWindows), the exact mean next-token loss over every target.
struct EvalOptions {
  std::string val_data;     // "": no evaluation; same formats and tokenizer as DataOptions
  int64_t every = 0;        // evaluate after every N completed steps (and after the last)
  int64_t max_windows = 0;  // periodic evaluation: only the first N windows (0: all)
};

// What a run does.
enum class Mode {
  kTrain,     // step.max_steps steps, with evaluation, checkpoints and the export as asked
  kEvaluate,  // the starting weights (hf.init_from or checkpoint.resume) on ALL eval windows, then the export if asked
  kConvert,   // checkpoint.dir's newest checkpoint to hf.export_dir (convert_checkpoint): no data, no training
};

struct TrainOptions {
  Mode mode = Mode::kTrain;
  // Preset name, HF config.json, or a directory holding one. Converting a
  // checkpoint (Mode::kConvert): "" takes the checkpoint's model.
  std::string model = "tiny";
  // kCPU, or kCUDA: each worker trains on cuda:<its local rank>.
  at::DeviceType device = at::kCPU;
  DataOptions data;
  StepOptions step;
  optim::AdamWOptions adamw;
  optim::LrSchedule schedule;  // max_steps is taken from step.max_steps
  LogOptions log;
  ShardingOptions sharding;
  CheckpointOptions checkpoint;
  HfOptions hf;
  LoraOptions lora;
  // --freeze REGEX: parameters whose name it finds (NamePattern: RE2, e.g.
  // "embed_tokens|layers\.[0-7]\.") are frozen: gathered for compute, no
  // gradients, no optimizer state (besides LoRA's own freezing). "": none.
  std::string freeze;
  // Weight decay and learning-rate scale per parameter (optim::param_rule):
  // by default no decay on norms, biases and embeddings.
  optim::ParamGroupOptions param_groups;
  EvalOptions eval;
  // Polled once per step on every rank, after the update; non-zero (e.g. the
  // number of a signal received) asks to stop. The ranks agree (maximum over
  // ranks), so all stop after the same step; then a checkpoint is saved when
  // checkpoint.dir is set. Null: never stop early.
  std::function<int()> stop_requested;
};

struct EvalRecord {
  int64_t step = 0;         // completed steps when evaluated
  double loss = 0;          // mean over every target token of the windows evaluated
  int64_t targets = 0;      // target tokens evaluated (all ranks)
  double seconds = 0;       // wall time of the evaluation
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double loss_scale = 0;  // fp16: the dynamic loss scale used this step (0 otherwise)
  bool skipped = false;   // fp16: inf/nan gradients, no optimizer step
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  int64_t peak_mem_bytes = 0;  // CPU: peak resident set of the process; CUDA: caching allocator peak on the device
  // The engine's unsharded buffers: the most held at once since the previous
  // logged step (ShardedModel::unsharded_memory), and the plan's bound for it.
  int64_t unsharded_peak_bytes = 0;
  int64_t unsharded_bound_bytes = 0;
  double mfu = -1;            // model FLOPs utilization of this rank; -1 where the device's peak is not known
  int64_t skipped_steps = 0;  // fp16: steps skipped so far (the loss scaler's count)
  StepCounters comm;
  // Checkpoint saves since the previous logged step (-1: no checkpoint.dir):
  // how long they held training, of which waiting for a save in flight, and
  // the host memory staging copies hold now (checkpoint.async).
  double checkpoint_stall_s = -1;
  double checkpoint_wait_s = -1;
  int64_t checkpoint_staging_bytes = -1;
};

// One checkpoint save of a run (TrainSummary::checkpoints), as this rank saw it.
struct CheckpointRecord {
  int64_t step = 0;            // the checkpoint's step
  bool async = false;          // checkpoint.async
  bool staged = false;         // written by the writer thread while training went on (async, within the limit)
  bool committed = false;      // complete and visible
  double stall_s = 0;          // how long it held training: staging and its commit (synchronous: all of it)
  double wait_s = 0;           // how long it waited for the previous save in flight (async)
  double seconds = 0;          // from its start to its commit
  int64_t bytes = 0;           // written by all ranks (rank 0's figure; 0 on the others for DCP)
  int64_t staging_bytes = 0;   // host memory of this rank's staging buffers (async)
};

struct TrainSummary {
  std::vector<StepRecord> steps;  // every step run by this call, on every rank (loss is the global mean)
  int64_t parameters = 0;
  std::string plan;               // ShardedModel::describe()
  int64_t start_step = 0;         // first step run (the resumed checkpoint's step, else 0)
  int64_t end_step = 0;           // completed steps at the end
  std::string resumed_from;       // checkpoint path, "" when not resumed
  std::vector<EvalRecord> evals;
  int stop_reason = 0;            // non-zero: stopped early by stop_requested (its agreed value)
  std::string last_checkpoint;    // path of the last checkpoint saved by this call, "" if none
  std::vector<CheckpointRecord> checkpoints;  // every save this call started, in order
  std::string trace_file;         // rank 0: the --profile-steps trace written by this call, "" if none
  std::string metrics_url;        // rank 0: where its Prometheus metrics were served, "" if not
};

// Cheap checks that need no process group (flags, files exist, the model
// resolves, shapes fit): run before launching workers so bad input fails
// once, fast, with exit code 2. With Mode::kConvert only what a conversion
// uses is checked (no data, no training flags). The Prometheus address is
// not checked here (the workers bind it): see check_metrics_address.
// world_size: the number of processes when known before they start (the
// local launcher), else 0.
void validate_options(const TrainOptions& options, int world_size = 0);

// The options as a run at `world_size` ranks uses them: step.grad_accum from
// step.global_batch_size when that is set (UsageError when the batch does not
// divide, or when an explicit grad_accum disagrees). The Trainer applies it to
// the options it is given; validate_options and check_memory check through it.
TrainOptions at_world_size(TrainOptions options, int world_size);

// Memory a run needs, checked before anything is allocated (Note [Memory
// check] in src/train/memory_check.cpp): per rank, the sharding plan's bytes (parameter,
// gradient and optimizer shards, unsharded units during a step) and the
// loss's logits (one chunk of B x T x V: models::chunked_loss_bytes), a lower
// bound of what training takes. Throws UsageError naming the need, its parts
// and what is available.
//   this_rank == nullopt: all local_world_size processes of this machine, in
//     host memory (the local launcher, before it starts them);
//   this_rank == a device: this process only: its host part against the
//     host's available memory, its device part against the device's free
//     memory (CUDA).
// Nothing is checked where the machine does not say what it has.
// Returns the plan's bound on one rank's unsharded buffers during a step
// (ShardingPlan::unsharded_bound of --grad-accum), which the trainer logs
// beside the engine's measured peak; 0 for Mode::kConvert.
int64_t check_memory(const TrainOptions& options, int world_size, int local_world_size,
                     std::optional<c10::Device> this_rank);

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
  // sharding.sync_module_states: rank 0's parameters, read from hf.init_from
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

// What a training run is asked to do: the options of the trainer and of its
// parts (data, steps, logging, sharding, checkpoints, Hugging Face files,
// LoRA, evaluation), gathered in TrainOptions, and the checks that need no
// process group. Each part of the trainer (src/train) includes this header
// for the options it reads; fsdp/train/trainer.h holds the Trainer itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/data/dataset.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/layers.h"
#include "fsdp/nn/attention_backend.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"

namespace fsdp::train {

struct TrainOptions;
class ModelConfig;  // fsdp/train/model_family.h

// Note [Checks beside their structs]
// Each part of the options checks itself, declared beside its struct: against
// a context holding the whole run (a part's check may read another part where
// the two must agree), the world size and, once resolved, the model.
// validate_options is the list of those calls, made twice: first without the
// model (the values and the files they name, so that a bad value is named
// before any model file is read), then with it (what depends on the model).
// A failed check throws UsageError naming the field (CheckpointOptions::dir),
// the value and the fix; fsdp-train's users see the flag instead.
struct CheckContext {
  const TrainOptions& run;
  int world_size = 0;                          // 0: not known yet
  std::shared_ptr<const ModelConfig> model;  // null: the first pass
};

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
void check(const DataOptions& o, const CheckContext& c);

// Dynamic loss scaling (optim/grad_scaler.h).
enum class LossScaling {
  kAuto,  // on exactly when the parameters are fp16 (FsdpOptions::mixed_precision.param_dtype == kHalf)
  kOn,
  kOff,
};
const char* to_string(LossScaling s);  // "auto" | "on" | "off"
// "auto" | "on" | "off"; UsageError naming StepOptions::loss_scaling otherwise.
LossScaling parse_loss_scaling(const std::string& s);

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
  // The attention kernel LibTorch's SDPA tries first (nn::set_attention_backend).
  nn::AttentionBackend attention_backend = nn::AttentionBackend::kFlash;
  // The decoder's products (q, k, v, o, gate, up, down) in the compute dtype
  // or as rowwise-scaled FP8 (models::set_fp8_linears; the head, embedding
  // and norms stay in the compute dtype).
  models::Fp8Linear fp8_linear = models::Fp8Linear::kOff;
  int64_t max_steps = 500;  // >= 1 when training
  // 0: train to max_steps. Else run() stops once this many steps are done,
  // saves a checkpoint (checkpoint.dir is required) and exports nothing; the
  // schedule still ends at max_steps, so a later resume continues the same
  // run (an allocation shorter than the run, a world-size change on purpose).
  int64_t stop_at_step = 0;
  double clip_grad = 1.0;  // 0: no clipping
  uint64_t seed = 1337;
  LossScaling loss_scaling = LossScaling::kAuto;
  double initial_loss_scale = 65536.0;  // > 0
};
void check(const StepOptions& o, const CheckContext& c);

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
  // How the log names options: each log line's text goes through this before
  // it is printed (fsdp-train: the fields the library names, such as
  // CheckpointOptions::dir, become its flags). Null: as the library writes it.
  std::function<std::string(const std::string&)> user_terms;
};
void check(const LogOptions& o, const CheckContext& c);

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
void check(const CheckpointOptions& o, const CheckContext& c);

// Hugging Face interchange (checkpoint/hf.h).
struct HfOptions {
  std::string init_from;                  // "": no; else a HF model directory to start from (when not resuming)
  std::string export_dir;                 // "": no export; else the final weights go here
  at::ScalarType export_dtype = at::kFloat;  // kFloat (exact) | kBFloat16 | kHalf
  // Split the weights into files of at most this many bytes (transformers'
  // default 5GB); <= 0: one file.
  int64_t export_shard_bytes = 5'000'000'000;
};
void check(const HfOptions& o, const CheckContext& c);

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
void check(const LoraOptions& o, const CheckContext& c);

// Evaluation on held-out data: consecutive windows from its start
// (data::EvalWindows), the exact mean next-token loss over every target.
struct EvalOptions {
  std::string val_data;     // "": no evaluation; same formats and tokenizer as DataOptions
  int64_t every = 0;        // evaluate after every N completed steps (and after the last)
  int64_t max_windows = 0;  // periodic evaluation: only the first N windows (0: all)
};
void check(const EvalOptions& o, const CheckContext& c);

// What a run does.
enum class Mode {
  kTrain,     // step.max_steps steps, with evaluation, checkpoints and the export as asked
  kEvaluate,  // the starting weights (hf.init_from or checkpoint.resume) on ALL eval windows, then the export if asked
  kConvert,   // checkpoint.dir's newest checkpoint to hf.export_dir (convert_checkpoint): no data, no training
};

// FsdpOptions as the trainer starts them: every field the engine's default
// but the wrap, which is the model's blocks (WrapPolicy::by_type with no types).
FsdpOptions trainer_fsdp_defaults();

struct TrainOptions {
  Mode mode = Mode::kTrain;
  // Preset name, HF config.json, or a directory holding one. Converting a
  // checkpoint (Mode::kConvert): "" takes the checkpoint's model.
  std::string model = "tiny";
  // cpu; cuda: each worker trains on cuda:<its local rank>; cuda:N: every
  // worker on GPU N, several ranks sharing it (worker_device).
  at::Device device = at::kCPU;
  DataOptions data;
  StepOptions step;
  optim::AdamWOptions adamw;
  optim::LrSchedule schedule;  // max_steps is taken from step.max_steps
  LogOptions log;
  // The engine's options, in its own (FSDP2's) words. The trainer fills in
  // what depends on its model and process (engine_options): a by_type wrap
  // with no types means the model's blocks (one unit per decoder layer, the
  // embedding and the head: the default); checkpoint_types comes from
  // activation_checkpointing; unit_overrides start with the head and the last
  // layer kept after forward (last_units_kept), then these; device is
  // `device`; init_rule and seed are the model's. hybrid_shard_size 0 is
  // LOCAL_WORLD_SIZE. Pure bf16 (mixed_precision.master_dtype kBFloat16) also
  // switches AdamW to bf16 moments with Kahan-compensated updates.
  FsdpOptions fsdp = trainer_fsdp_defaults();
  // Every decoder layer keeps only its input in forward and is recomputed in
  // backward (what it recomputes: fsdp.checkpoint_policy; its saved inputs in
  // host memory: fsdp.offload_checkpoint_inputs).
  bool activation_checkpointing = false;
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
// The optimizer's parts of the run (adamw, schedule, param_groups), as the
// trainer's AdamW and schedule take them.
void check_optimizer(const CheckContext& c);

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

// The engine's options for a model of `cfg` (its units and block; null: the
// checks alone, which do not depend on them): the trainer's sharding choices
// (hybrid size 0 is left for the caller to fill in with LOCAL_WORLD_SIZE),
// checked against `world_size` (0: unknown). The one road from a run's
// options to fully_shard's: fsdp-train and fsdp-inspect's plans both take it.
FsdpOptions engine_options(const TrainOptions& options, const ModelConfig* cfg, int world_size);

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

}  // namespace fsdp::train

// fsdp-train: trains a Llama-family model with Fully Sharded Data Parallel.
//
// Modes: `fsdp-train [train] ...` trains; `fsdp-train eval ...` (or --eval-only)
// evaluates the starting weights; `fsdp-train convert --checkpoint-dir DIR
// --export-hf OUT` converts a checkpoint to Hugging Face files. The old
// spelling of a conversion, --max-steps 0 --resume, still works and says it is
// deprecated.
//
// Process model: with --nproc-per-node N (> 1) this process becomes a local
// launcher — it checks the flags, starts N workers (this same program and
// arguments) with torchrun's environment, supervises them and exits with the
// first failing worker's status. Under torchrun, Kubeflow PyTorchJob or Slurm
// srun every process is a worker already and --nproc-per-node is ignored.
// Several nodes without torchrun: the same command on each node with --nnodes
// N --node-rank i --master-addr <node 0's address> (node 0 hosts the store).
//
// Exit codes: 0 success, 2 bad usage (flags, files, shapes), 1 other failures.
// SIGTERM/SIGINT: every rank finishes its current step, a checkpoint is saved
// (with --checkpoint-dir) and the exit code is 0; without --checkpoint-dir the
// run stops after the step, nothing is saved, and the exit code is 128 + the
// signal (143 for SIGTERM) so that a supervisor does not take it for a finished
// run. A second signal kills the process at once. While the process is still
// joining the job (rendezvous), SIGTERM/SIGINT end it at once.
//
// Faults: --timeout SECONDS (or FSDP_TIMEOUT; the flag wins; default 600 s for
// collectives, 300 s for joining) bounds every wait on another rank. Joining:
// MASTER_ADDR resolving, the store answering, every rank showing up; ranks
// missing at the deadline are named. Collectives: a rank that does not reach
// one in time (suspended with SIGSTOP, hung, dead) is named by every surviving
// rank ("rank 1 did not reach all_reduce #5 ... within 30000 ms: stopped, hung
// or dead"), exit 1. The --nproc-per-node launcher blames that rank, not the
// one that noticed, prints its one-line summary before the workers' own error
// lines, and after a SIGTERM/SIGINT gives the workers --timeout to exit before
// stopping them (SIGTERM, then SIGKILL 10 s later).
#include <CLI/CLI.hpp>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "cli_numbers.h"
#include "option_names.h"
#include "config_file.h"
#include "train_flags.h"
#include "fsdp/comm/launcher.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/common/internals.h"
#include "fsdp/common/device.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/common/memory.h"
#include "fsdp/data/dataset.h"
#include "fsdp/train/model_family.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/prometheus.h"
#include "fsdp/train/trainer.h"

namespace {

using fsdp::kExitFailure;
using fsdp::kExitUsage;

// The one piece of process-wide mutable state in fsdp-train: the signal that
// asked this worker to stop (0: none), written by the handler, read once per
// step through TrainOptions::stop_requested.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal handler needs lock-free atomics");

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// While joining the job nothing has been trained or saved, and the joining
// code waits inside the rendezvous store, not at a step boundary: a signal
// ends the process at once, with one line (write(2) and _exit are
// async-signal-safe) and the shell's 128 + signal.
extern "C" void on_signal_while_joining(int sig) {
  static const char kTerm[] = "fsdp-train: error: stopped by SIGTERM while joining the job (nothing trained or saved)\n";
  static const char kInt[] = "fsdp-train: error: stopped by SIGINT while joining the job (nothing trained or saved)\n";
  const char* text = sig == SIGTERM ? kTerm : kInt;
  const size_t n = sig == SIGTERM ? sizeof(kTerm) - 1 : sizeof(kInt) - 1;
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text, n);
  ::_exit(128 + sig);
}

// `handler` for SIGTERM and SIGINT: on_signal_while_joining while joining, then
// on_stop_signal, which stops after the current step (preemption: Kubernetes,
// Slurm, torchrun's agent) with SA_RESETHAND: a second signal takes the
// default action (the process dies).
void handle_stop_signals(void (*handler)(int), int flags) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// The default corpus: built by scripts/prepare_data.sh, or the small one in
// the repository when it has not been built.
std::string embedded_corpus() {
  if (::access(FSDP_EMBEDDED_CORPUS, R_OK) == 0) return FSDP_EMBEDDED_CORPUS;
  return FSDP_FALLBACK_CORPUS;
}

// The validation split scripts/prepare_data.sh writes beside a corpus:
// corpus.jsonl -> corpus.val.jsonl.
std::string validation_split(const std::string& train) {
  const std::string ext = ".jsonl";
  if (train.size() > ext.size() && train.compare(train.size() - ext.size(), ext.size(), ext) == 0) {
    return train.substr(0, train.size() - ext.size()) + ".val.jsonl";
  }
  return train + ".val.jsonl";
}

// CPUs this process may run on (its affinity mask, as taskset and cgroups set it).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// --nproc-per-node's upper bound: one process per GPU with --device cuda; on
// the CPU 4 per core (each process holds LibTorch, its threads and its share
// of the model: more only thrash the machine).
constexpr int kProcessesPerCpu = 4;

void check_nproc(int nproc, at::DeviceType device) {
  FSDP_CHECK(nproc >= 1, "--nproc-per-node must be >= 1, got ", nproc);
  if (nproc == 1) return;
  if (device == at::kCUDA) {
    fsdp::worker_device("cuda", /*local_rank=*/0);  // a CUDA build with a GPU, else it says how to get one
    const int gpus = fsdp::cuda_device_count();
    FSDP_CHECK(nproc <= gpus, "--nproc-per-node ", nproc, " with --device cuda needs one GPU per process, but this "
               "machine shows ", gpus, " (CUDA_VISIBLE_DEVICES?) — use --nproc-per-node <= ", gpus);
    return;
  }
  const int cpus = usable_cpus();
  const int64_t limit = int64_t{kProcessesPerCpu} * cpus;
  FSDP_CHECK(nproc <= limit, "--nproc-per-node ", nproc, " is more processes than this machine can run: at most ",
             limit, " (", kProcessesPerCpu, " per CPU, ", cpus, " CPU", cpus == 1 ? "" : "s",
             " usable) with --device cpu — use fewer processes, or several machines (torchrun, Slurm, Kubeflow)");
}

// --profile-steps A:B -> [A, B).
void parse_profile_steps(const std::string& text, fsdp::train::LogOptions& log) {
  const size_t colon = text.find(':');
  // The rule of every integer flag (cli_numbers.h): decimal digits within 64 bits.
  auto number = [&](std::string part) -> int64_t {
    FSDP_CHECK(fsdp::cli::strict_integer(part, /*is_unsigned=*/true).empty(), "--profile-steps '", text,
               "' is not A:B with whole numbers 0 <= A < B (e.g. 10:13 traces steps 10, 11 and 12)");
    return std::stoll(part);
  };
  FSDP_CHECK(colon != std::string::npos, "--profile-steps '", text,
             "' is not A:B with whole numbers 0 <= A < B (e.g. 10:13 traces steps 10, 11 and 12)");
  log.profile_begin = number(text.substr(0, colon));
  log.profile_end = number(text.substr(colon + 1));
  FSDP_CHECK(log.profile_begin < log.profile_end, "--profile-steps '", text, "': the end ", log.profile_end,
             " must be after the start ", log.profile_begin, " (A:B traces steps A..B-1)");
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

int run(int argc, char** argv) {
  fsdp::train::TrainOptions o;
  fsdp::cli::TrainFlags flags;  // the choices in words, typed into `o` after parsing
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 29500;  // torchrun's default
  std::string token_dtype = "u16";
  std::string format = "auto";
  std::string timeout_text;
  std::string profile_steps;
  bool print_config = false;

  CLI::App app{"fsdp-train: train a Llama-family model with Fully Sharded Data Parallel (C++/LibTorch)."};
  app.get_formatter()->column_width(34);
  // A flag given twice takes its last value (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  app.add_option("--model", o.model,
                 "Model: a preset (" + join(fsdp::train::all_model_presets()) +
                     "), a Hugging Face config.json, or a directory holding one")
      ->capture_default_str();
  o.data.path = "embedded";
  app.add_option("--data", o.data.path,
                 "Training data: plain text, JSON lines (field --text-field), either optionally gzip-compressed "
                 "(.json.gz), a binary file of little-endian token ids, a directory of such files, or a pattern "
                 "such as 'c4/en/c4-train.*.json.gz' (files in name order); 'embedded': the corpus "
                 "scripts/prepare_data.sh builds from "
                 "Debian's fortunes package (build/data/corpus.jsonl), else the repository's small fallback data/fallback_corpus.jsonl")
      ->capture_default_str();
  app.add_option("--data-format", format, "auto | text | jsonl | bin (auto: by extension and content)")
      ->check(CLI::IsMember({"auto", "text", "jsonl", "bin"}))
      ->capture_default_str();
  app.add_option("--text-field", o.data.text_field, "JSON-lines field holding each document")->capture_default_str();
  app.add_option("--input-field", o.data.input_field,
                 "Encoder-decoder models (t5): the JSON-lines field holding each example's input")
      ->capture_default_str();
  app.add_option("--target-field", o.data.target_field,
                 "Encoder-decoder models (t5): the JSON-lines field holding each example's target")
      ->capture_default_str();
  app.add_option("--target-len", o.data.target_len,
                 "Encoder-decoder models (t5): target tokens per example, the decoder's width (0: --seq-len, "
                 "which is then the encoder's)")
      ->capture_default_str();
  app.add_option("--token-dtype", token_dtype, "Width of token ids in binary data: u16 | u32")
      ->check(CLI::IsMember({"u16", "u32", "uint16", "uint32"}))
      ->capture_default_str();
  app.add_option("--tokenizer", o.data.tokenizer,
                 "Tokenizer for text data: byte, a Hugging Face tokenizer.json (Llama 3, Qwen2/2.5/3, SmolLM2, "
                 "Llama 2, Mistral, TinyLlama), a SentencePiece .model, a tiktoken BPE file (Llama 3), or a model "
                 "directory holding tokenizer.json or tokenizer.model")
      ->capture_default_str();
  app.add_option("--seq-len", o.data.seq_len, "Tokens per sample (T)")->capture_default_str();
  app.add_option("--batch-size", o.step.batch_size, "Samples per rank per micro-batch (B)")->capture_default_str();
  app.add_option("--grad-accum", o.step.grad_accum,
                 "Micro-batches per optimizer step; gradients are synchronized on the last one only")
      ->capture_default_str();
  app.add_option("--loss-chunk-rows", o.step.loss_chunk_rows,
                 "Tokens per chunk of the output projection and loss, which never hold the whole B x T x vocab "
                 "logits (0: chosen from the vocabulary, 64 MiB of fp32 logits per chunk)")
      ->capture_default_str();
  app.add_option("--lr", o.schedule.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--warmup-steps", o.schedule.warmup_steps, "Linear warmup steps")->capture_default_str();
  app.add_option("--min-lr", o.schedule.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str();
  app.add_option("--weight-decay", o.adamw.weight_decay,
                 "AdamW decoupled weight decay (not on norms, biases and embeddings unless --weight-decay-all)")
      ->capture_default_str();
  app.add_flag("--weight-decay-all", o.param_groups.decay_all,
               "Decay every parameter, norms, biases and embeddings included (for comparison)");
  app.add_option("--lr-scale", flags.lr_scales,
                 "REGEX=FACTOR: parameters whose name the regex finds train at FACTOR x the learning rate "
                 "(repeatable; the first match wins), e.g. --lr-scale lora_B=4");
  app.add_option("--freeze", o.freeze,
                 "Freeze the parameters whose name this regex finds (e.g. 'embed_tokens|layers\\.[0-3]\\.'): "
                 "no gradients, no reductions, no optimizer state");
  app.add_option("--beta1", o.adamw.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.adamw.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--clip-grad", o.step.clip_grad, "Clip the global gradient norm to this (0: off)")
      ->capture_default_str();
  app.add_option("--max-steps", o.step.max_steps,
                 "Optimizer steps; the cosine decay ends here. (0 with --resume: deprecated spelling of "
                 "'fsdp-train convert')")
      ->capture_default_str();
  app.add_option("--seed", o.step.seed, "Seed for initialization and data order")->capture_default_str();
  app.add_flag("!--no-shuffle", o.data.shuffle, "Read windows in order instead of a seeded shuffle per epoch");
  app.add_option("--log-every", o.log.log_every, "Log every N steps (and the last)")->capture_default_str();
  using fsdp::train::MetricScope;
  app.add_option("--metrics-file", o.log.metrics_file,
                 "Append one JSON object per logged step (" +
                     fsdp::train::metric_names(MetricScope::kStep, fsdp::train::kToJson) + ") and per evaluation (" +
                     fsdp::train::metric_names(MetricScope::kEval, fsdp::train::kToJson) +
                     "); --list-metrics says what each means");
  app.add_option("--tensorboard", o.log.tensorboard_dir,
                 "Write TensorBoard event files into this directory (rank 0): " +
                     fsdp::train::metric_names(MetricScope::kStep, fsdp::train::kToTensorBoard) +
                     " at each logged step, and " +
                     fsdp::train::metric_names(MetricScope::kEval, fsdp::train::kToTensorBoard));
  app.add_option("--metrics-port", o.log.metrics_port,
                 "Serve the metrics for Prometheus on http://HOST:PORT/metrics while the run goes on (rank 0; "
                 "labelled rank=\"0\"): the --metrics-file values as " +
                     fsdp::train::metric_names(MetricScope::kStep, fsdp::train::kToPrometheus) + ", " +
                     fsdp::train::metric_names(MetricScope::kEval, fsdp::train::kToPrometheus) +
                     ". 0: any free port (logged). A port in use is an error before training");
  app.add_option("--metrics-host", o.log.metrics_host,
                 "Address --metrics-port listens on: 0.0.0.0 (every interface: a Prometheus server elsewhere) or "
                 "127.0.0.1 (this machine only)")
      ->capture_default_str();
  app.add_flag("--metrics-every-rank", o.log.metrics_every_rank,
               "Every process serves its own metrics on --metrics-port + its local rank (labelled rank=\"R\")");
  bool list_metrics = false;
  app.add_flag("--list-metrics", list_metrics,
               "Print the table of metrics (--metrics-file keys, TensorBoard tags, Prometheus names, meanings) "
               "and exit")
      ->configurable(false);
  app.add_option("--profile-steps", profile_steps,
                 "Trace steps A..B-1 ('A:B', steps numbered as in 'Batch N'): every rank's all-gathers and "
                 "reduce-scatters (issue, wait, the collective itself, bytes), forward, backward, optimizer, data "
                 "wait, evaluation and checkpoint saves, merged into one Chrome/Perfetto trace (--profile-file), and "
                 "one line per traced step with its exposed communication time");
  app.add_option("--profile-file", o.log.profile_file, "Where --profile-steps writes its trace (JSON)")
      ->capture_default_str();
  app.add_option("--nproc-per-node", nproc,
                 "Start N local worker processes and supervise them (ignored under torchrun/srun/PyTorchJob)")
      ->capture_default_str();
  app.add_option("--nnodes", nnodes,
                 "Nodes of the job when fsdp-train launches them itself: run it once per node with the same flags "
                 "and --node-rank 0..N-1; node 0 hosts the store at --master-addr:--master-port")
      ->capture_default_str();
  app.add_option("--node-rank", node_rank, "This node's rank in [0, --nnodes)")->capture_default_str();
  app.add_option("--master-addr", master_addr, "Node 0's address as the other nodes reach it (--nnodes > 1)");
  app.add_option("--master-port", master_port, "The store's port on node 0 (--nnodes > 1)")->capture_default_str();
  app.add_option("--timeout", timeout_text,
                 "Seconds to wait for other ranks: each collective, and joining the job (default: 600 for "
                 "collectives, 300 for joining; env FSDP_TIMEOUT). A rank that does not arrive in time "
                 "(suspended, hung, dead, never started) is named and the job fails");
  app.add_option("--device", flags.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--sharding", flags.sharding,
                 "full (FULL_SHARD) | grad-op (SHARD_GRAD_OP) | none (NO_SHARD, DDP) | hybrid (HYBRID_SHARD)")
      ->capture_default_str();
  app.add_option("--wrap", flags.wrap,
                 "Units: block (one per decoder layer) | size:N (a block becomes a unit once it holds N parameters "
                 "not yet wrapped) | root (the whole model as one unit) | all (every marked boundary)")
      ->capture_default_str();
  app.add_option("--hybrid-shard-size", o.sharding.hybrid_shard_size,
                 "HYBRID: ranks per shard group (default: LOCAL_WORLD_SIZE, i.e. one node)")
      ->capture_default_str();
  app.add_flag("--sync-module-states", o.sharding.sync_module_states,
               "Rank 0 alone builds the whole model (initialized, or read from --init-from) in host memory and "
               "broadcasts it to every rank's shards before training; the other ranks read no weights");
  auto* mem = app.add_option_group("Memory and precision", "Mixed precision, activation checkpointing, offload, prefetch");
  mem->add_option("--mixed-precision", flags.mixed_precision,
                  "fp32 | bf16 (bf16 parameters and compute, fp32 reduction and master weights) | fp16 (fp16 "
                  "parameters with dynamic loss scaling; GPU only with this LibTorch) | bf16-pure (bf16 everywhere, "
                  "Kahan-compensated AdamW with bf16 moments)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "bf16-pure"}))
      ->capture_default_str();
  mem->add_option("--reduce-dtype", flags.reduce_dtype,
                  "Gradient communication dtype: fp32 | bf16 | fp16 (default: the --mixed-precision preset's)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  mem->add_option("--all-gather-wire", flags.all_gather_wire,
                  "Parameter all-gathers on the wire: native (the param dtype) | bf16 (widened on arrival; compute "
                  "stays in the param dtype) | int8 (per-block scales, dequantized on arrival) — docs/compression.md")
      ->check(CLI::IsMember({"native", "bf16", "int8"}))
      ->capture_default_str();
  mem->add_option("--reduce-scatter-wire", flags.reduce_scatter_wire,
                  "Gradient reduce-scatters on the wire: native (the reduce dtype) | bf16 | int8 (per-block scales, "
                  "stochastic rounding); summed in fp32 by the owner — docs/compression.md")
      ->check(CLI::IsMember({"native", "bf16", "int8"}))
      ->capture_default_str();
  mem->add_option("--quant-block", o.sharding.compression.block_size,
                  "int8 wire: elements per fp32 scale")
      ->capture_default_str();
  mem->add_flag("--activation-checkpointing", o.sharding.activation_checkpointing,
                "Keep only each decoder layer's input in forward and recompute the layer in backward");
  mem->add_flag("--offload-activations", o.sharding.offload_activations,
                "With --activation-checkpointing: keep those saved inputs in host memory (GPU runs)");
  mem->add_flag("--cpu-offload", o.sharding.cpu_offload,
                "Parameter and gradient shards and optimizer state in host memory; the optimizer steps there");
  mem->add_option("--backward-prefetch", flags.backward_prefetch,
                  "pre (gather the next unit before computing this one's gradients) | post (after) | none")
      ->check(CLI::IsMember({"pre", "post", "none"}))
      ->capture_default_str();
  mem->add_flag("--forward-prefetch", o.sharding.forward_prefetch,
                "Gather the next unit's parameters while the current one computes forward");
  mem->add_option("--limit-all-gathers", o.sharding.limit_all_gathers,
                  "At most N all-gathers issued ahead of use (rate limiter)")
      ->capture_default_str();
  mem->add_option("--loss-scaling", flags.loss_scaling,
                  "Dynamic loss scaling: auto (on for fp16) | on | off. Steps with inf/nan gradients are skipped on "
                  "every rank and the scale halves; it doubles after 2000 clean steps; saved in checkpoints")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  mem->add_option("--initial-loss-scale", o.sharding.initial_loss_scale, "Starting loss scale")->capture_default_str();
  auto* ckpt = app.add_option_group("Checkpoints", "Sharded checkpoints: save, resume, keep");
  ckpt->add_option("--checkpoint-dir", o.checkpoint.dir,
                   "Directory for sharded checkpoints (step_NNNNNNNN/, one file per shard + manifest.json); saving "
                   "and --resume use the same one. Every rank must see it (a shared file system on several nodes)");
  ckpt->add_option("--checkpoint-every", o.checkpoint.every,
                   "Save a checkpoint every N steps (0: only at the end and when stopped by SIGTERM/SIGINT)")
      ->capture_default_str();
  ckpt->add_option("--keep-last", o.checkpoint.keep_last,
                   "Keep only the newest K complete checkpoints; older ones are deleted after a newer one is "
                   "complete (0: keep all)")
      ->capture_default_str();
  ckpt->add_flag("--resume", o.checkpoint.resume,
                 "Continue from the newest complete, valid checkpoint in --checkpoint-dir (damaged ones are "
                 "skipped; none yet: start from scratch or --init-from). World size, sharding and wrap may differ. "
                 "A PyTorch distributed checkpoint (DCP: .metadata) at the top of --checkpoint-dir is resumed "
                 "when the directory holds no checkpoint of ours");
  ckpt->add_flag("--async-checkpoint", o.checkpoint.async,
                 "Save checkpoints in the background: training goes on while a writer thread persists a copy of "
                 "the state staged in host memory (one save in flight; same commit protocol; docs/checkpoints.md)");
  ckpt->add_option("--checkpoint-staging-limit", flags.checkpoint_staging_limit,
                   "With --async-checkpoint: the most host memory one rank stages for a save (16GiB, 500MB, "
                   "bytes); a larger state is saved synchronously, as the log says")
      ->capture_default_str();
  ckpt->add_option("--checkpoint-format", o.checkpoint.format,
                   "sharded (ours: one file per shard) | dcp (each step_N a PyTorch distributed checkpoint that "
                   "torch.distributed.checkpoint.load reads; docs/checkpoints.md)")
      ->check(CLI::IsMember({"sharded", "dcp"}))
      ->capture_default_str();
  ckpt->add_option("--dcp-layout", o.checkpoint.dcp_layout,
                   "Keys of a DCP checkpoint written: torch (FSDP2 with get_state_dict: model.<HF name>, "
                   "optimizer.state.<name>.exp_avg) | torchtitan (its Llama names and q/k row order); reading "
                   "tells them apart by itself")
      ->check(CLI::IsMember({"torch", "torchtitan"}))
      ->capture_default_str();
  ckpt->add_option("--export-dcp", o.checkpoint.export_dcp,
                   "fsdp-train convert: write the checkpoint as a PyTorch distributed checkpoint into this new "
                   "directory (--dcp-layout, --dcp-format; with its optimizer state when it has one)");
  ckpt->add_option("--export-checkpoint", o.checkpoint.export_checkpoint,
                   "fsdp-train convert: write the checkpoint as one of ours (step_N) into this checkpoint directory");
  ckpt->add_option("--dcp-format", o.checkpoint.dcp_format,
                   "Items of a DCP checkpoint written: torch_save (DCP's default) | safetensors "
                   "(HuggingFaceStorageWriter's shard files)")
      ->check(CLI::IsMember({"torch_save", "safetensors"}))
      ->capture_default_str();
  auto* hf = app.add_option_group("Hugging Face", "Hugging Face safetensors interchange");
  hf->add_option("--init-from", o.hf.init_from,
                 "Start from a Hugging Face Llama/Mistral/Qwen2/Qwen3 directory (config.json + model.safetensors or "
                 "model.safetensors.index.json); its config.json is the model unless --model is given. Ignored "
                 "when --resume finds a checkpoint");
  hf->add_option("--export-hf", o.hf.export_dir,
                 "At the end, write the weights as Hugging Face safetensors + config.json (transformers 5's form; "
                 "bos/eos ids from --init-from's config, else from the tokenizer) into this directory (replaced "
                 "atomically; it must be new, empty or a previous export), with --init-from's tokenizer and "
                 "generation_config.json files copied as they are");
  hf->add_option("--export-dtype", flags.export_dtype, "Exported weight dtype: float32 (exact) | bfloat16 | float16")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}))
      ->capture_default_str();
  hf->add_option("--export-shard-size", flags.export_shard_size,
                 "Split exported weights into files of at most this size, with model.safetensors.index.json "
                 "(5GB, 500MB, 2GiB, bytes; 0: one file)")
      ->capture_default_str();
  auto* lora = app.add_option_group("LoRA", "Low-rank adapters (peft's LoRA) on a frozen model");
  lora->add_option("--lora-rank", o.lora.rank,
                   "Train LoRA adapters of this rank on --lora-targets, every other parameter frozen (0: off)")
      ->capture_default_str();
  lora->add_option("--lora-alpha", o.lora.alpha,
                   "Adapter scale alpha: outputs are scaled by alpha / rank (default 2 x rank: a scale of 2)");
  lora->add_option("--lora-dropout", o.lora.dropout, "Dropout on the adapters' input while training, in [0, 1)")
      ->capture_default_str();
  lora->add_option("--lora-targets", flags.lora_targets,
                   "Comma-separated names of the Linear layers that get adapters (q_proj, k_proj, v_proj, o_proj, "
                   "gate_proj, up_proj, down_proj; Mixtral experts w1, w2, w3)")
      ->capture_default_str();
  lora->add_flag("--merge-lora", o.lora.merge,
                 "--export-hf writes the merged model (W + B A alpha / rank), a plain Hugging Face model, instead "
                 "of the PEFT adapter directory (adapter_config.json + adapter_model.safetensors, for "
                 "PeftModel.from_pretrained)");
  lora->add_option("--init-adapter", o.lora.init_adapter,
                   "Start the adapters from a PEFT adapter directory of the same rank and targets (ignored when "
                   "--resume finds a checkpoint)");
  auto* ev = app.add_option_group("Evaluation", "Held-out loss");
  ev->add_option("--val-data", o.eval.val_data,
                 "Validation data (same formats, --data-format, --text-field and --tokenizer as --data); "
                 "'embedded': the validation split beside the embedded corpus");
  ev->add_option("--eval-every", o.eval.every,
                 "Evaluate every N steps and after the last; logs 'Eval Loss: X' (0: never)")
      ->capture_default_str();
  ev->add_option("--eval-windows", o.eval.max_windows,
                 "Periodic evaluation uses only the first N windows of --val-data (0: all)")
      ->capture_default_str();
  bool eval_only = false;
  ev->add_flag("--eval-only", eval_only,
               "Evaluate the weights from --init-from or --resume on all of --val-data (exact mean loss over every "
               "target token), print 'Eval Loss: X', and exit (the same as 'fsdp-train eval')");
  // --config FILE: TOML with the long flag names as keys, e.g.
  //   model = "llama3.2-1b"   seq-len = 2048   mixed-precision = "bf16"
  // Flags on the command line override the file (Note [Config files]).
  std::string config_file;
  app.add_option("--config", config_file, "Read options from this TOML file (keys: the long flag names without "
                                          "'--'); command-line flags override it")
      ->configurable(false);
  app.add_flag("--print-config", print_config,
               "Print the effective configuration (the --config file with command-line overrides and defaults "
               "applied) as TOML, and exit")
      ->configurable(false);
  // The modes: training (no subcommand, or `train`), evaluation, conversion.
  // Every option may follow the subcommand (fallthrough to this app's options).
  app.fallthrough();
  app.require_subcommand(0, 1);
  auto* train_cmd = app.add_subcommand("train", "Train (the default)");
  auto* eval_cmd = app.add_subcommand(
      "eval", "Evaluate the weights of --init-from or --resume on all of --val-data, then export if asked "
              "(= --eval-only)");
  auto* convert_cmd = app.add_subcommand(
      "convert", "Convert the newest checkpoint of --checkpoint-dir (ours, or a PyTorch distributed checkpoint) to "
                 "Hugging Face files (--export-hf), a distributed checkpoint (--export-dcp) or ours "
                 "(--export-checkpoint); no data needed; the model is the checkpoint's (or --model)");
  fsdp::cli::strict_numbers(app);  // before --version: it is no number
  app.set_version_flag("--version", std::string("fsdp-train 0.1.0 (LibTorch ") + fsdp::internals::torch_version() + ")")
      ->configurable(false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "fsdp-train: error: " << e.what() << " (see fsdp-train --help)\n";
    return kExitUsage;
  }
  if (app.count("--config") > 0) fsdp::cli::apply_config_file(app, config_file);

  if (list_metrics) {
    std::cout << fsdp::train::metrics_markdown();
    return 0;
  }
  // --max-steps 0: the old spelling of a conversion.
  const bool deprecated_conversion = app.count("--max-steps") > 0 && o.step.max_steps == 0 &&
                                     convert_cmd->parsed() == false && eval_cmd->parsed() == false;
  FSDP_CHECK(!deprecated_conversion || o.checkpoint.resume, "--max-steps 0 (the deprecated spelling of 'fsdp-train "
             "convert') converts a checkpoint and needs --resume --checkpoint-dir DIR --export-hf OUT; give "
             "--max-steps >= 1 to train");
  FSDP_CHECK(!(convert_cmd->parsed() && eval_only), "'fsdp-train convert' and --eval-only are two modes; give one");
  FSDP_CHECK(!(train_cmd->parsed() && (eval_only || deprecated_conversion)), "'fsdp-train train' trains; leave out ",
             eval_only ? "--eval-only" : "--max-steps 0", " or use 'fsdp-train ", eval_only ? "eval" : "convert", "'");
  const std::string mode = convert_cmd->parsed() || deprecated_conversion ? "convert"
                           : eval_cmd->parsed() || eval_only               ? "eval"
                                                                           : "";
  o.mode = mode == "convert" ? fsdp::train::Mode::kConvert
           : mode == "eval"  ? fsdp::train::Mode::kEvaluate
                             : fsdp::train::Mode::kTrain;

  // The effective configuration: printed on request (once valid), recorded by every run beside its metrics.
  o.log.config_text = fsdp::cli::effective_config(app, mode);
  if (app.count("--config") > 0) o.log.config_file = config_file;
  fsdp::cli::apply_train_flags(flags, o);
  if (!profile_steps.empty()) parse_profile_steps(profile_steps, o.log);
  o.data.token_dtype = fsdp::data::parse_token_dtype(token_dtype);
  o.data.format = fsdp::data::parse_data_format(format);
  if (o.data.path == "embedded") o.data.path = embedded_corpus();
  if (o.eval.val_data == "embedded") o.eval.val_data = validation_split(o.data.path);
  // --init-from DIR without --model: the model is DIR's config.json.
  if (!o.hf.init_from.empty() && app.count("--model") == 0) o.model = o.hf.init_from;
  // Converting a checkpoint without --model: the checkpoint's model (an empty
  // model spec; train/trainer.h).
  if (o.mode == fsdp::train::Mode::kConvert && app.count("--model") == 0) o.model.clear();
  fsdp::comm::InitOptions init;
  if (app.count("--timeout") > 0) {  // given: '' is refused too, not taken as "not given"
    init.timeout = init.store_timeout = fsdp::comm::parse_timeout(timeout_text, "--timeout");
  } else if (const char* env = std::getenv("FSDP_TIMEOUT"); env != nullptr && *env != '\0') {
    init.timeout = init.store_timeout = fsdp::comm::parse_timeout(env, "FSDP_TIMEOUT");
  }
  if (print_config) {
    fsdp::train::validate_options(o, std::max(nproc, 1));  // never print a configuration that cannot run
    std::cout << o.log.config_text;
    return 0;
  }

  const fsdp::comm::WorldInfo world = fsdp::comm::detect_world();
  const bool is_worker = world.launcher != "single";
  // Said once: by the process the user started, not again by the local launcher's workers.
  if (deprecated_conversion && world.launcher != "fsdp-train" && world.rank == 0) {
    std::cerr << "fsdp-train: warning: --max-steps 0 to convert a checkpoint is deprecated; use 'fsdp-train convert "
                 "--checkpoint-dir DIR --export-hf OUT'\n";
  }
  if (!is_worker) check_nproc(nproc, o.device);  // under torchrun/srun/PyTorchJob the flag is ignored
  if (!is_worker) {
    FSDP_CHECK(nnodes >= 1 && nnodes <= 65536, "--nnodes must be in [1, 65536], got ", nnodes);
    FSDP_CHECK(node_rank >= 0 && node_rank < nnodes, "--node-rank ", node_rank, " must be in [0, --nnodes ", nnodes,
               ") — number the nodes 0..", nnodes - 1);
    FSDP_CHECK(nnodes == 1 || !master_addr.empty(), "--nnodes ", nnodes,
               " needs --master-addr: node 0's address as every node reaches it (and the same --master-port on all)");
    FSDP_CHECK(master_port >= 1 && master_port <= 65535, "--master-port must be in [1, 65535], got ", master_port);
  }
  if ((nproc > 1 || nnodes > 1) && !is_worker) {
    fsdp::train::validate_options(o, nproc * nnodes);  // fail once, before starting anything
    // The Prometheus ports the workers will listen on: free now, or an error before anything starts.
    if (o.log.metrics_port > 0 && o.mode != fsdp::train::Mode::kConvert) {
      for (int r = 0; r < (o.log.metrics_every_rank ? nproc : 1); ++r) {
        fsdp::train::check_metrics_address(o.log.metrics_host, o.log.metrics_port + r);
      }
    }
    // Every local worker's memory at once, before any of them allocates.
    fsdp::train::check_memory(o, nproc * nnodes, nproc, std::nullopt);
    fsdp::comm::LaunchOptions lo;
    lo.nproc = nproc;
    lo.nnodes = nnodes;
    lo.node_rank = node_rank;
    lo.master_addr = master_addr;
    lo.master_port = master_port;
    lo.signal_timeout = init.timeout;
    lo.join_timeout = init.store_timeout;  // one deadline: this launcher's start to its workers' join
    return fsdp::comm::launch_self("fsdp-train", argc, argv, lo);
  }

  if (o.device == at::kCUDA) {
    // NCCL on cuda:<local rank>, made current before any CUDA work.
    fsdp::set_current_device(fsdp::worker_device("cuda", world.local_rank));
    init.backend = "nccl";
  }
  // Nodes started with different --max-steps would part mid-run (one finishes,
  // the other waits in a collective): agreed at the join, both values named.
  if (o.mode == fsdp::train::Mode::kTrain) init.agreed.emplace_back("--max-steps", std::to_string(o.step.max_steps));
  handle_stop_signals(on_signal_while_joining, 0);
  const fsdp::comm::Runtime rt = fsdp::comm::init_process_group(world, init);
  // Only now: a signal while joining must end the process, not wait for a step.
  handle_stop_signals(on_stop_signal, SA_RESETHAND);
  o.stop_requested = [] { return g_stop_signal.load(); };
  const fsdp::train::TrainSummary s = fsdp::train::train(o, rt);
  if (s.stop_reason != 0 && o.checkpoint.dir.empty()) return 128 + s.stop_reason;  // stopped, nothing saved
  return 0;
}

}  // namespace

// The library's errors name its options; the user gave flags (option_names.h).
int main(int argc, char** argv) {
  return fsdp::run_main("fsdp-train", [&] { return fsdp::cli::with_flag_names([&] { return run(argc, argv); }); });
}

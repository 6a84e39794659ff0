#include "train_options_table.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <map>
#include <type_traits>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/models/lora.h"
#include "fsdp/nn/recompute.h"
#include "fsdp/train/metrics.h"
#include "fsdp/train/model_family.h"

namespace fsdp::cli {
namespace {

// The option groups of --help, in order, with their descriptions.
const std::pair<const char*, const char*> kOptionGroups[] = {
    {"Memory and precision", "Mixed precision, activation checkpointing, offload, prefetch"},
    {"Checkpoints", "Sharded checkpoints: save, resume, keep"},
    {"Hugging Face", "Hugging Face safetensors interchange"},
    {"LoRA", "Low-rank adapters (peft's LoRA) on a frozen model"},
    {"Evaluation", "Held-out loss"},
};

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The library's name of a member path of TrainTargets ("o.data.seq_len" ->
// "DataOptions::seq_len"); "" for the run's own flags (run.*).
std::string field_name(const std::string& path) {
  static const std::pair<const char*, const char*> kStructs[] = {
      {"o.data.", "DataOptions::"},       {"o.step.", "StepOptions::"},
      {"o.log.", "LogOptions::"},         {"o.fsdp.", "FsdpOptions::"},
      {"o.checkpoint.", "CheckpointOptions::"}, {"o.hf.", "HfOptions::"},
      {"o.lora.", "LoraOptions::"},       {"o.eval.", "EvalOptions::"},
      {"o.adamw.", "AdamWOptions::"},     {"o.schedule.", "LrSchedule::"},
      {"o.param_groups.", "ParamGroupOptions::"}, {"o.", "TrainOptions::"}};
  for (const auto& [prefix, name] : kStructs) {
    if (path.rfind(prefix, 0) == 0) return name + path.substr(std::string(prefix).size());
  }
  return "";
}

// The row's bound member and its field name: `BIND(o.data.seq_len)`.
#define BIND(member) [](TrainTargets& t) -> OptionTarget { return &t.member; }, field_name(#member)

// A member given in words, with the library's parse and to_string:
// `WORDS(o.fsdp.strategy, parse_sharding_strategy, to_string)`.
#define WORDS(member, parse, print)                                                                   \
  [](TrainTargets& t) -> OptionTarget {                                                               \
    auto* m = &t.member;                                                                              \
    return WordsTarget{[m](const std::string& w, bool) { *m = parse(w); }, [m] { return std::string(print(*m)); }}; \
  }, field_name(#member)

// A repeatable row whose every word adds one element: `REPEATED(o.param_groups.lr_scales, ...)`.
#define REPEATED(member, parse, print)                                                       \
  [](TrainTargets& t) -> OptionTarget {                                                      \
    auto* m = &t.member;                                                                     \
    return WordsTarget{[m](const std::string& w, bool first) {                              \
                         if (first) m->clear();                                              \
                         m->push_back(parse(w));                                             \
                       },                                                                    \
                       [m] { return print(*m); }, true};                                     \
  }, field_name(#member)

// The words of the types the library names by a function taking more than the
// word (what to name in its error) or returning an optional.
// cpu, cuda (each rank on cuda:<local rank>) or cuda:N (every rank on GPU N).
at::Device parse_device(const std::string& s) {
  if (s == "cpu" || s == "cuda") return s == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  const std::string digits = s.rfind("cuda:", 0) == 0 ? s.substr(5) : "";
  constexpr int kMaxIndex = std::numeric_limits<c10::DeviceIndex>::max();
  const bool number = !digits.empty() && digits.size() <= 3 && (digits[0] != '0' || digits.size() == 1) &&
                      digits.find_first_not_of("0123456789") == std::string::npos && std::stoi(digits) <= kMaxIndex;
  FSDP_CHECK(number, "TrainOptions::device '", s, "' is not one of: cpu, cuda, cuda:N (N in 0..", kMaxIndex,
             ": every rank on GPU N)");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(digits)));
}
std::string device_word(const at::Device& d) { return d.str(); }
WrapPolicy parse_wrap(const std::string& s) {
  WrapPolicy p = parse_wrap_policy(s, std::type_index(typeid(void)));
  p.types.clear();  // by_type with no types: the model's blocks (TrainOptions::fsdp)
  return p;
}
std::optional<ReshardAfterForward> parse_reshard(const std::string& s) {
  return parse_reshard_after_forward(s, "FsdpOptions::reshard_after_forward");
}
std::string preset_name(const MixedPrecision& mp) { return mp.preset_name(); }
at::ScalarType parse_reduce_dtype(const std::string& s) {
  return parse_dtype_word(s, "FsdpOptions::mixed_precision.reduce_dtype");
}
WireFormat parse_all_gather_wire(const std::string& s) {
  return parse_wire_format(s, "FsdpOptions::compression.all_gather");
}
WireFormat parse_reduce_scatter_wire(const std::string& s) {
  return parse_wire_format(s, "FsdpOptions::compression.reduce_scatter");
}
nn::RecomputePolicy parse_ac_policy(const std::string& s) {
  const std::optional<nn::RecomputePolicy> p = nn::parse_recompute_policy(s);
  FSDP_CHECK(p.has_value(), "FsdpOptions::checkpoint_policy '", s, "' is not one of: full, tail, selective");
  return *p;
}
nn::AttentionBackend parse_attention(const std::string& s) {
  const std::optional<nn::AttentionBackend> b = nn::parse_attention_backend(s);
  FSDP_CHECK(b.has_value(), "StepOptions::attention_backend '", s, "' is not one of: flash, cudnn");
  return *b;
}
models::LayerKernels parse_kernels(const std::string& s) {
  const std::optional<models::LayerKernels> k = models::parse_layer_kernels(s);
  FSDP_CHECK(k.has_value(), "StepOptions::kernels '", s, "' is not one of: reference, fused");
  return *k;
}
models::Fp8Linear parse_fp8(const std::string& s) {
  const std::optional<models::Fp8Linear> m = models::parse_fp8_linear(s);
  FSDP_CHECK(m.has_value(), "StepOptions::fp8_linear '", s, "' is not one of: off, rowwise");
  return *m;
}
int64_t parse_staging_limit(const std::string& s) {
  return parse_byte_size(s, "CheckpointOptions::staging_limit",
                         "stage nothing: every save is written before training goes on");
}
int64_t parse_shard_bytes(const std::string& s) {
  return parse_byte_size(s, "HfOptions::export_shard_bytes", "one file");
}
std::string comma_words(const std::vector<std::string>& v) { return join(v, ","); }
std::string lr_scale_words(const std::vector<std::pair<std::string, double>>& v) {
  std::vector<std::string> words;
  for (const auto& scale : v) words.push_back(optim::lr_scale_text(scale));
  return join(words, " ");
}

constexpr unsigned kD = kShowDefault;
constexpr Inspect kUses = Inspect::kUses;
constexpr Inspect kIgnores = Inspect::kIgnores;

// The model, the data and the optimizer.
std::vector<OptionRow> data_rows() {
  return {
      {"--model", "", "Model: a preset (" + join(train::all_model_presets()) +
                          "), a Hugging Face config.json, or a directory holding one",
       BIND(o.model), {}, kD, kUses},
      {"--data", "",
       "Training data: plain text, JSON lines (field --text-field), either optionally gzip-compressed "
       "(.json.gz), a binary file of little-endian token ids, a directory of such files, or a pattern "
       "such as 'c4/en/c4-train.*.json.gz' (files in name order); 'embedded': the corpus "
       "scripts/prepare_data.sh builds from "
       "Debian's fortunes package (build/data/corpus.jsonl), else the repository's small fallback data/fallback_corpus.jsonl",
       BIND(o.data.path), {}, kD},
      {"--data-format", "", "auto | text | jsonl | bin (auto: by extension and content)",
       WORDS(o.data.format, data::parse_data_format, data::to_string),
       {"auto", "text", "jsonl", "bin"}, kD, kIgnores, {"DatasetOptions::format"}},
      {"--text-field", "", "JSON-lines field holding each document", BIND(o.data.text_field), {}, kD, kIgnores,
       {"DatasetOptions::text_field"}},
      {"--input-field", "", "Encoder-decoder models (t5): the JSON-lines field holding each example's input",
       BIND(o.data.input_field), {}, kD, kIgnores,
       {"PairOptions::input_field"}},
      {"--target-field", "", "Encoder-decoder models (t5): the JSON-lines field holding each example's target",
       BIND(o.data.target_field), {}, kD, kIgnores,
       {"PairOptions::target_field"}},
      {"--target-len", "",
       "Encoder-decoder models (t5): target tokens per example, the decoder's width (0: --seq-len, "
       "which is then the encoder's)",
       BIND(o.data.target_len), {}, kD, kIgnores,
       {"PairOptions::target_len"}},
      {"--token-dtype", "", "Width of token ids in binary data: u16 | u32",
       WORDS(o.data.token_dtype, data::parse_token_dtype, data::to_string),
       {"u16", "u32", "uint16", "uint32"}, kD, kIgnores,
       {"DatasetOptions::token_dtype"}},
      {"--tokenizer", "",
       "Tokenizer for text data: byte, a Hugging Face tokenizer.json (Llama 3, Qwen2/2.5/3, SmolLM2, "
       "Llama 2, Mistral, TinyLlama), a SentencePiece .model, a tiktoken BPE file (Llama 3), or a model "
       "directory holding tokenizer.json or tokenizer.model",
       BIND(o.data.tokenizer), {}, kD, kIgnores,
       {"load_dataset: tokenizer"}},
      {"--seq-len", "", "Tokens per sample (T)", BIND(o.data.seq_len), {}, kD, kUses,
       {"SamplerOptions::seq_len", "PairOptions::input_len", "StepWorkload::seq_len"}},
      {"--batch-size", "", "Samples per rank per micro-batch (B)", BIND(o.step.batch_size), {}, kD, kUses,
       {"StepWorkload::batch_size"}},
      {"--grad-accum", "", "Micro-batches per optimizer step; gradients are synchronized on the last one only",
       BIND(o.step.grad_accum), {}, kD, kUses,
       {"StepWorkload::grad_accum"}},
      {"--global-batch-size", "",
       "Rows per optimizer step at any world size (0: --batch-size x --grad-accum x ranks): --grad-accum "
       "becomes this / (--batch-size x ranks), so a job resumed with fewer or more nodes reads the same "
       "data per step",
       BIND(o.step.global_batch_size), {}, kD, kUses},
      {"--loss-chunk-rows", "",
       "Tokens per chunk of the output projection and loss, which never hold the whole B x T x vocab "
       "logits (0: chosen from the vocabulary, 64 MiB of fp32 logits per chunk)",
       BIND(o.step.loss_chunk_rows), {}, kD, kUses},
      {"--kernels", "",
       "reference (Hugging Face's operations one by one) | fused (one kernel each: RMSNorm through LibTorch's, "
       "SwiGLU and rotary through our own; rounded once in bf16 where the reference rounds more; gradient "
       "clipping inside the fused AdamW kernel) — docs/training.md",
       WORDS(o.step.kernels, parse_kernels, models::to_string), {"reference", "fused"}, kD, kUses},
      {"--attention-backend", "",
       "The attention kernel tried first: flash (LibTorch's order: flash, memory-efficient, math, cuDNN) | cudnn "
       "(cuDNN's, flash as the fallback; CUDA only — the CPU runs its flash kernel either way); the log names "
       "the kernel the first attention got — docs/training.md",
       WORDS(o.step.attention_backend, parse_attention, nn::to_string), {"flash", "cudnn"}, kD},
      {"--fp8-linear", "",
       "off | rowwise: the decoder's q/k/v/o/gate/up/down products in FP8 e4m3 with one scale per row "
       "(at::_scaled_mm on CUDA, emulated on the CPU; weight gradients, head, embedding and norms in the "
       "compute dtype) — docs/training.md",
       WORDS(o.step.fp8_linear, parse_fp8, models::to_string), {"off", "rowwise"}, kD, kUses},
      {"--lr", "", "Peak learning rate", BIND(o.schedule.lr), {}, kD},
      {"--warmup-steps", "", "Linear warmup steps", BIND(o.schedule.warmup_steps), {}, kD},
      {"--min-lr", "", "Learning rate at the end of the cosine decay", BIND(o.schedule.min_lr), {}, kD},
      {"--weight-decay", "",
       "AdamW decoupled weight decay (not on norms, biases and embeddings unless --weight-decay-all)",
       BIND(o.adamw.weight_decay), {}, kD},
      {"--weight-decay-all", "", "Decay every parameter, norms, biases and embeddings included (for comparison)",
       BIND(o.param_groups.decay_all)},
      {"--lr-scale", "",
       "REGEX=FACTOR: parameters whose name the regex finds train at FACTOR x the learning rate "
       "(repeatable; the first match wins), e.g. --lr-scale lora_B=4",
       REPEATED(o.param_groups.lr_scales, optim::parse_lr_scale, lr_scale_words)},
      {"--freeze", "",
       "Freeze the parameters whose name this regex finds (e.g. 'embed_tokens|layers\\.[0-3]\\.'): "
       "no gradients, no reductions, no optimizer state",
       BIND(o.freeze), {}, 0, kUses,
       {"freeze_matching: pattern"}},
      {"--beta1", "", "AdamW beta1", BIND(o.adamw.beta1), {}, kD},
      {"--beta2", "", "AdamW beta2", BIND(o.adamw.beta2), {}, kD},
      {"--clip-grad", "", "Clip the global gradient norm to this (0: off)", BIND(o.step.clip_grad), {}, kD, kUses,
       {"clip_grad_norm: max_norm"}},
      {"--max-steps", "",
       "Optimizer steps; the cosine decay ends here. (0 with --resume: deprecated spelling of "
       "'fsdp-train convert')",
       BIND(o.step.max_steps), {}, kD, kIgnores,
       {"LrSchedule::max_steps"}},
      {"--stop-at-step", "",
       "Stop once N steps are done, save a checkpoint and exit 0 without exporting; the schedule still "
       "ends at --max-steps, so --resume continues the same run (0: train to --max-steps)",
       BIND(o.step.stop_at_step), {}, kD},
      {"--seed", "", "Seed for initialization and data order", BIND(o.step.seed), {}, kD, kUses},
      {"!--no-shuffle", "", "Read windows in order instead of a seeded shuffle per epoch", BIND(o.data.shuffle)},
  };
}

// Logging, metrics, tracing, the launcher and the engine's layout.
std::vector<OptionRow> run_rows() {
  using train::MetricScope;
  using train::metric_names;
  return {
      {"--log-every", "", "Log every N steps (and the last)", BIND(o.log.log_every), {}, kD},
      {"--metrics-file", "",
       "Append one JSON object per logged step (" + metric_names(MetricScope::kStep, train::kToJson) +
           ") and per evaluation (" + metric_names(MetricScope::kEval, train::kToJson) +
           "); --list-metrics says what each means",
       BIND(o.log.metrics_file)},
      {"--tensorboard", "",
       "Write TensorBoard event files into this directory (rank 0): " +
           metric_names(MetricScope::kStep, train::kToTensorBoard) + " at each logged step, and " +
           metric_names(MetricScope::kEval, train::kToTensorBoard),
       BIND(o.log.tensorboard_dir)},
      {"--metrics-port", "",
       "Serve the metrics for Prometheus on http://HOST:PORT/metrics while the run goes on (rank 0; "
       "labelled rank=\"0\"): the --metrics-file values as " +
           metric_names(MetricScope::kStep, train::kToPrometheus) + ", " +
           metric_names(MetricScope::kEval, train::kToPrometheus) +
           ". 0: any free port (logged). A port in use is an error before training",
       BIND(o.log.metrics_port)},
      {"--metrics-host", "",
       "Address --metrics-port listens on: 0.0.0.0 (every interface: a Prometheus server elsewhere) or "
       "127.0.0.1 (this machine only)",
       BIND(o.log.metrics_host), {}, kD},
      {"--metrics-every-rank", "",
       "Every process serves its own metrics on --metrics-port + its local rank (labelled rank=\"R\")",
       BIND(o.log.metrics_every_rank)},
      {"--list-metrics", "",
       "Print the table of metrics (--metrics-file keys, TensorBoard tags, Prometheus names, meanings) "
       "and exit",
       BIND(run.list_metrics), {}, kNotInConfig},
      {"--list-options", "",
       "Print this table of options as JSON (flag, group, help, kind, default, choices, config key, whether "
       "fsdp-inspect uses it) and exit",
       BIND(run.list_options), {}, kNotInConfig},
      {"--profile-steps", "",
       "Trace steps A..B-1 ('A:B', steps numbered as in 'Batch N'): every rank's all-gathers and "
       "reduce-scatters (issue, wait, the collective itself, bytes), forward, backward, optimizer, data "
       "wait, evaluation and checkpoint saves, merged into one Chrome/Perfetto trace (--profile-file), and "
       "one line per traced step with its exposed communication time",
       BIND(run.profile_steps), {}, 0, Inspect::kIgnores, {"LogOptions::profile_begin:profile_end"}},
      {"--profile-file", "", "Where --profile-steps writes its trace (JSON)", BIND(o.log.profile_file), {}, kD},
      {"--nproc-per-node", "",
       "Start N local worker processes and supervise them (ignored under torchrun/srun/PyTorchJob)",
       BIND(run.nproc), {}, kD, kUses,
       {"LaunchOptions::nproc", "start_job: nproc_per_node", "ClusterSpec::procs_per_node"}},
      {"--nnodes", "",
       "Nodes of the job when fsdp-train launches them itself: run it once per node with the same flags "
       "and --node-rank 0..N-1; node 0 hosts the store at --master-addr:--master-port",
       BIND(run.nnodes), {}, kD, kUses,
       {"LaunchOptions::nnodes"}},
      {"--node-rank", "", "This node's rank in [0, --nnodes)", BIND(run.node_rank), {}, kD, kIgnores,
       {"LaunchOptions::node_rank"}},
      {"--master-addr", "", "Node 0's address as the other nodes reach it (--nnodes > 1)", BIND(run.master_addr),
       {}, 0, kIgnores,
       {"LaunchOptions::master_addr"}},
      {"--master-port", "", "The store's port on node 0 (--nnodes > 1)", BIND(run.master_port), {}, kD, kIgnores,
       {"LaunchOptions::master_port"}},
      {"--timeout", "",
       "Seconds to wait for other ranks: each collective, and joining the job (default: 600 for "
       "collectives, 300 for joining; env FSDP_TIMEOUT). A rank that does not arrive in time "
       "(suspended, hung, dead, never started) is named and the job fails",
       BIND(run.timeout), {}, 0, kIgnores,
       {"InitOptions::timeout", "InitOptions::store_timeout", "LaunchOptions::join_timeout"}},
      {"--backend", "",
       "Process group: tcp (ours, the CPU's default) | gloo (PyTorch's ProcessGroupGloo) | nccl (ours, CUDA's "
       "default) | c10d-nccl (PyTorch's ProcessGroupNCCL) | auto",
       BIND(run.backend), {"auto", "tcp", "gloo", "nccl", "c10d-nccl"}, kD, kIgnores,
       {"InitOptions::backend"}},
      {"--device", "", "cpu | cuda (each rank on cuda:<its local rank>) | cuda:N (every rank on GPU N: tests)",
       WORDS(o.device, parse_device, device_word), {}, kD, kUses,
       {"worker_device: kind", "start_job: device"}},
      {"--sharding", "",
       "full (FULL_SHARD) | grad-op (SHARD_GRAD_OP) | none (NO_SHARD, DDP) | hybrid (HYBRID_SHARD)",
       WORDS(o.fsdp.strategy, parse_sharding_strategy, to_string), {}, kD, kUses},
      {"--wrap", "",
       "Units: block (one per decoder layer) | size:N (a block becomes a unit once it holds N parameters "
       "not yet wrapped) | root (the whole model as one unit) | all (every marked boundary)",
       WORDS(o.fsdp.wrap, parse_wrap, to_string), {}, kD, kUses},
      {"--hybrid-shard-size", "", "HYBRID: ranks per shard group (default: LOCAL_WORLD_SIZE, i.e. one node)",
       BIND(o.fsdp.hybrid_shard_size), {}, kD, kUses},
      {"--reshard-after-forward", "",
       "After each unit's forward, the root's aside (FSDP2's reshard_after_forward): default (the strategy's: true "
       "for full and hybrid, false for grad-op; with every layer a unit, the output head and the last layer, "
       "whose backward comes first, keep theirs, as torchtitan's default) | true (free the gathered parameters, "
       "every unit) | false (keep them "
       "to backward) | N (keep a shard over groups of N ranks, so backward gathers inside the group: "
       "ZeRO++'s hpZ, e.g. the processes of one node) — docs/compression.md",
       WORDS(o.fsdp.reshard_after_forward, parse_reshard, to_string), {}, kD, kUses},
      {"--sync-module-states", "",
       "Rank 0 alone builds the whole model (initialized, or read from --init-from) in host memory and "
       "broadcasts it to every rank's shards before training; the other ranks read no weights",
       BIND(o.fsdp.sync_module_states)},
  };
}

std::vector<OptionRow> memory_rows() {
  const std::string g = "Memory and precision";
  return {
      {"--mixed-precision", g,
       "fp32 | bf16 (bf16 parameters and compute, fp32 reduction and master weights) | fp16 (fp16 "
       "parameters with dynamic loss scaling; GPU only with this LibTorch) | bf16-pure (bf16 everywhere, "
       "Kahan-compensated AdamW with bf16 moments)",
       WORDS(o.fsdp.mixed_precision, MixedPrecision::preset, preset_name), {"fp32", "bf16", "fp16", "bf16-pure"}, kD,
       kUses},
      {"--reduce-dtype", g, "Gradient communication dtype: fp32 | bf16 | fp16 (default: the --mixed-precision preset's)",
       WORDS(o.fsdp.mixed_precision.reduce_dtype, parse_reduce_dtype, dtype_word), {"fp32", "bf16", "fp16"}, 0, kUses},
      {"--all-gather-wire", g,
       "Parameter all-gathers on the wire: native (the param dtype) | bf16 (widened on arrival; compute "
       "stays in the param dtype) | int8 (per-block scales, dequantized on arrival) — docs/compression.md",
       WORDS(o.fsdp.compression.all_gather, parse_all_gather_wire, to_string), {"native", "bf16", "int8"}, kD, kUses},
      {"--reduce-scatter-wire", g,
       "Gradient reduce-scatters on the wire: native (the reduce dtype) | bf16 | int8 (per-block scales, "
       "stochastic rounding); summed in fp32 by the owner — docs/compression.md",
       WORDS(o.fsdp.compression.reduce_scatter, parse_reduce_scatter_wire, to_string), {"native", "bf16", "int8"}, kD,
       kUses},
      {"--quant-block", g, "int8 wire: elements per fp32 scale", BIND(o.fsdp.compression.block_size), {}, kD,
       kUses},
      {"--activation-checkpointing", g,
       "Keep only each decoder layer's input in forward and recompute the layer in backward",
       BIND(o.activation_checkpointing), {}, 0, kUses},
      {"--ac-policy", g,
       "With --activation-checkpointing, what backward recomputes: tail (the layer up to its last product, "
       "whose gradients are then computed from what is at hand: full's gradients bit for bit, one product "
       "fewer) | full (the whole layer) | selective (keeps attention's products and output, recomputes the "
       "norms and the MLP) — docs/training.md",
       WORDS(o.fsdp.checkpoint_policy, parse_ac_policy, nn::to_string), {"tail", "full", "selective"}, kD, kUses},
      {"--offload-activations", g, "With --activation-checkpointing: keep those saved inputs in host memory (GPU runs)",
       BIND(o.fsdp.offload_checkpoint_inputs)},
      {"--cpu-offload", g,
       "Parameter and gradient shards and optimizer state in host memory; the optimizer steps there",
       BIND(o.fsdp.cpu_offload), {}, 0, kUses},
      {"!--no-pin-memory", g,
       "With --cpu-offload on CUDA: keep the host shards in pageable memory instead of page-locked (FSDP2's "
       "CPUOffloadPolicy(pin_memory=False)): no pinned memory held, but each copy to and from the device blocks",
       BIND(o.fsdp.pin_memory)},
      {"--backward-prefetch", g,
       "pre (gather the next unit before computing this one's gradients) | post (after) | none",
       WORDS(o.fsdp.backward_prefetch, parse_backward_prefetch, to_string), {"pre", "post", "none"}, kD, kUses},
      {"--forward-prefetch", g, "Gather the next unit's parameters while the current one computes forward",
       BIND(o.fsdp.forward_prefetch), {}, 0, kUses},
      {"--limit-all-gathers", g, "At most N all-gathers issued ahead of use (rate limiter)",
       BIND(o.fsdp.limit_all_gathers), {}, kD, kUses},
      {"--loss-scaling", g,
       "Dynamic loss scaling: auto (on for fp16) | on | off. Steps with inf/nan gradients are skipped on "
       "every rank and the scale halves; it doubles after 2000 clean steps; saved in checkpoints",
       WORDS(o.step.loss_scaling, train::parse_loss_scaling, train::to_string), {"auto", "on", "off"}, kD},
      {"--initial-loss-scale", g, "Starting loss scale", BIND(o.step.initial_loss_scale), {}, kD},
  };
}

std::vector<OptionRow> checkpoint_rows() {
  const std::string g = "Checkpoints";
  return {
      {"--checkpoint-dir", g,
       "Directory for sharded checkpoints (step_NNNNNNNN/, one file per shard + manifest.json); saving "
       "and --resume use the same one. Every rank must see it (a shared file system on several nodes)",
       BIND(o.checkpoint.dir), {}, 0, kIgnores,
       {"open_checkpoint_dir: dir", "check_checkpoint_dir: dir", "save_checkpoint: dir",
        "load_latest_checkpoint: dir"}},
      {"--checkpoint-every", g,
       "Save a checkpoint every N steps (0: only at the end and when stopped by SIGTERM/SIGINT)",
       BIND(o.checkpoint.every), {}, kD},
      {"--keep-last", g,
       "Keep only the newest K complete checkpoints; older ones are deleted after a newer one is "
       "complete (0: keep all)",
       BIND(o.checkpoint.keep_last), {}, kD},
      {"--resume", g,
       "Continue from the newest complete, valid checkpoint in --checkpoint-dir (damaged ones are "
       "skipped; none yet: start from scratch or --init-from). World size, sharding and wrap may differ. "
       "A PyTorch distributed checkpoint (DCP: .metadata) at the top of --checkpoint-dir is resumed "
       "when the directory holds no checkpoint of ours",
       BIND(o.checkpoint.resume)},
      {"--async-checkpoint", g,
       "Save checkpoints in the background: training goes on while a writer thread persists a copy of "
       "the state staged in host memory (one save in flight; same commit protocol; docs/checkpoints.md)",
       BIND(o.checkpoint.async)},
      {"--checkpoint-staging-limit", g,
       "With --async-checkpoint: the most host memory one rank stages for a save (16GiB, 500MB, "
       "bytes); a larger state is saved synchronously, as the log says",
       WORDS(o.checkpoint.staging_limit, parse_staging_limit, format_byte_size), {}, kD, kIgnores,
       {"AsyncSaveOptions::staging_limit"}},
      {"--checkpoint-format", g,
       "sharded (ours: one file per shard) | dcp (each step_N a PyTorch distributed checkpoint that "
       "torch.distributed.checkpoint.load reads; docs/checkpoints.md)",
       BIND(o.checkpoint.format), {"sharded", "dcp"}, kD},
      {"--dcp-layout", g,
       "Keys of a DCP checkpoint written: torch (FSDP2 with get_state_dict: model.<HF name>, "
       "optimizer.state.<name>.exp_avg) | torchtitan (its Llama names and q/k row order); reading "
       "tells them apart by itself",
       BIND(o.checkpoint.dcp_layout), {"torch", "torchtitan"}, kD, kIgnores,
       {"DcpLoadOptions::names"}},
      {"--export-dcp", g,
       "fsdp-train convert: write the checkpoint as a PyTorch distributed checkpoint into this new "
       "directory (--dcp-layout, --dcp-format; with its optimizer state when it has one)",
       BIND(o.checkpoint.export_dcp)},
      {"--export-checkpoint", g,
       "fsdp-train convert: write the checkpoint as one of ours (step_N) into this checkpoint directory",
       BIND(o.checkpoint.export_checkpoint)},
      {"--dcp-format", g,
       "Items of a DCP checkpoint written: torch_save (DCP's default) | safetensors "
       "(HuggingFaceStorageWriter's shard files)",
       BIND(o.checkpoint.dcp_format), {"torch_save", "safetensors"}, kD},
  };
}

std::vector<OptionRow> hf_lora_eval_rows() {
  const std::string hf = "Hugging Face", lora = "LoRA", ev = "Evaluation";
  return {
      {"--init-from", hf,
       "Start from a Hugging Face Llama/Mistral/Qwen2/Qwen3 directory (config.json + model.safetensors or "
       "model.safetensors.index.json); its config.json is the model unless --model is given. Ignored "
       "when --resume finds a checkpoint",
       BIND(o.hf.init_from), {}, 0, kUses,
       {"find_hf_weights: dir", "import_hf: dir", "DcpLoadOptions::load_optimizer = false"}},
      {"--export-hf", hf,
       "At the end, write the weights as Hugging Face safetensors + config.json (transformers 5's form; "
       "bos/eos ids from --init-from's config, else from the tokenizer) into this directory (replaced "
       "atomically; it must be new, empty or a previous export), with --init-from's tokenizer and "
       "generation_config.json files copied as they are",
       BIND(o.hf.export_dir), {}, 0, kIgnores,
       {"export_hf: dir", "export_peft_adapter: dir"}},
      {"--export-dtype", hf, "Exported weight dtype: float32 (exact) | bfloat16 | float16",
       WORDS(o.hf.export_dtype, checkpoint::parse_export_dtype, checkpoint::hf_dtype_name),
       {"float32", "bfloat16", "float16", "fp32", "bf16", "fp16"}, kD, kIgnores,
       {"HfExportOptions::dtype"}},
      {"--export-shard-size", hf,
       "Split exported weights into files of at most this size, with model.safetensors.index.json "
       "(5GB, 500MB, 2GiB, bytes; 0: one file)",
       WORDS(o.hf.export_shard_bytes, parse_shard_bytes, format_byte_size), {}, kD},
      {"--lora-rank", lora, "Train LoRA adapters of this rank on --lora-targets, every other parameter frozen (0: off)",
       BIND(o.lora.rank), {}, kD, kUses,
       {"LoraConfig::rank"}},
      {"--lora-alpha", lora,
       "Adapter scale alpha: outputs are scaled by alpha / rank (default 2 x rank: a scale of 2)",
       BIND(o.lora.alpha), {}, 0, kIgnores,
       {"LoraConfig::alpha"}},
      {"--lora-dropout", lora, "Dropout on the adapters' input while training, in [0, 1)", BIND(o.lora.dropout),
       {}, kD, kIgnores,
       {"LoraConfig::dropout"}},
      {"--lora-targets", lora,
       "Comma-separated names of the Linear layers that get adapters (q_proj, k_proj, v_proj, o_proj, "
       "gate_proj, up_proj, down_proj; Mixtral experts w1, w2, w3)",
       WORDS(o.lora.targets, models::parse_lora_targets, comma_words), {}, kD, kUses,
       {"LoraConfig::targets"}},
      {"--merge-lora", lora,
       "--export-hf writes the merged model (W + B A alpha / rank), a plain Hugging Face model, instead "
       "of the PEFT adapter directory (adapter_config.json + adapter_model.safetensors, for "
       "PeftModel.from_pretrained)",
       BIND(o.lora.merge), {}, 0, kIgnores,
       {"HfExportOptions::lora_scaling"}},
      {"--init-adapter", lora,
       "Start the adapters from a PEFT adapter directory of the same rank and targets (ignored when "
       "--resume finds a checkpoint)",
       BIND(o.lora.init_adapter), {}, 0, kIgnores,
       {"import_peft_adapter: dir", "read_peft_adapter_config: dir", "check_adapter_alpha: dir"}},
      {"--val-data", ev,
       "Validation data (same formats, --data-format, --text-field and --tokenizer as --data); "
       "'embedded': the validation split beside the embedded corpus",
       BIND(o.eval.val_data)},
      {"--eval-every", ev, "Evaluate every N steps and after the last; logs 'Eval Loss: X' (0: never)",
       BIND(o.eval.every), {}, kD},
      {"--eval-windows", ev, "Periodic evaluation uses only the first N windows of --val-data (0: all)",
       BIND(o.eval.max_windows), {}, kD},
      {"--eval-only", ev,
       "Evaluate the weights from --init-from or --resume on all of --val-data (exact mean loss over every "
       "target token), print 'Eval Loss: X', and exit (the same as 'fsdp-train eval')",
       BIND(run.eval_only), {}, 0, Inspect::kIgnores, {"Mode::kEvaluate"}},
      // --config FILE: TOML with the long flag names as keys, e.g.
      //   model = "llama3.2-1b"   seq-len = 2048   mixed-precision = "bf16"
      // Flags on the command line override the file (Note [Config files]).
      {"--config", "",
       "Read options from this TOML file (keys: the long flag names without "
       "'--'); command-line flags override it",
       BIND(run.config_file), {}, kNotInConfig, kUses, {"LogOptions::config_file"}},
      {"--print-config", "",
       "Print the effective configuration (the --config file with command-line overrides and defaults "
       "applied) as TOML, and exit",
       BIND(run.print_config), {}, kNotInConfig, Inspect::kIgnores, {"LogOptions::config_text"}},
  };
}

#undef BIND
#undef WORDS
#undef REPEATED

std::vector<OptionRow> make_table() {
  std::vector<OptionRow> rows = data_rows();
  for (auto part : {run_rows(), memory_rows(), checkpoint_rows(), hf_lora_eval_rows()}) {
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

std::string group_description(const std::string& title) {
  for (const auto& [name, description] : kOptionGroups) {
    if (title == name) return description;
  }
  FSDP_ASSERT(false, "option group '", title, "' of the option table is not in kOptionGroups");
  return "";
}

bool is_switch(const OptionTarget& t) { return std::holds_alternative<bool*>(t); }
bool is_repeatable(const OptionTarget& t) {
  const WordsTarget* w = std::get_if<WordsTarget>(&t);
  return std::holds_alternative<std::vector<std::string>*>(t) || (w != nullptr && w->repeat);
}

// A row in words: CLI11 checks the choices and keeps the words given (which
// --print-config shows); the callback, run once the parse is complete, types
// them with the library's parse.
CLI::Option* add_words(CLI::App& where, const OptionRow& row, const WordsTarget& w) {
  CLI::Option* opt = nullptr;
  if (w.repeat) {
    opt = where.add_option_function<std::vector<std::string>>(
        row.flag,
        [set = w.set](const std::vector<std::string>& words) {
          for (size_t i = 0; i < words.size(); ++i) set(words[i], i == 0);
        },
        row.help);
  } else {
    opt = where.add_option_function<std::string>(
        row.flag, [set = w.set](const std::string& word) { set(word, true); }, row.help);
  }
  if ((row.traits & kShowDefault) != 0) opt->default_str(w.get());
  return opt;
}

// Adds `row` bound to its target in `t`, into `where` (the app or its group).
CLI::Option* add_row(CLI::App& where, const OptionRow& row, TrainTargets& t) {
  OptionTarget target = row.target(t);
  CLI::Option* opt = std::visit(
      [&](auto& value) -> CLI::Option* {
        using V = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<V, WordsTarget>) {
          return add_words(where, row, value);
        } else if constexpr (std::is_same_v<V, bool*>) {
          return where.add_flag(row.flag, *value, row.help);
        } else {
          return where.add_option(row.flag, *value, row.help);
        }
      },
      target);
  if (!row.choices.empty()) opt->check(CLI::IsMember(row.choices));
  if ((row.traits & kShowDefault) != 0 && !std::holds_alternative<WordsTarget>(target)) opt->capture_default_str();
  if ((row.traits & kNotInConfig) != 0) opt->configurable(false);
  return opt;
}

// Adds the rows `take` selects, bound into `t`, each in its option group (made at
// its first row: --help lists them in the table's order).
void register_rows(CLI::App& app, TrainTargets& t, const std::function<bool(const OptionRow&)>& take) {
  std::map<std::string, CLI::App*> groups;
  for (const OptionRow& row : train_option_table()) {
    if (!take(row)) continue;
    CLI::App* where = &app;
    if (!row.group.empty()) {
      CLI::App*& group = groups[row.group];
      if (group == nullptr) group = app.add_option_group(row.group, group_description(row.group));
      where = group;
    }
    add_row(*where, row, t);
  }
}

}  // namespace

const std::vector<OptionRow>& train_option_table() {
  static const std::vector<OptionRow> table = make_table();
  return table;
}

void register_train_options(CLI::App& app, TrainTargets& t) {
  register_rows(app, t, [](const OptionRow&) { return true; });
}

std::string IgnoredOptions::given() const {
  std::vector<std::string> names;
  for (const auto& [flag, o] : options) {
    if (o->count() > 0) names.push_back(flag);
  }
  return join(names);
}

void register_inspect_train_options(CLI::App& app, TrainTargets& t, IgnoredOptions& ignored) {
  for (const OptionRow& row : train_option_table()) {
    FSDP_ASSERT(app.get_option_no_throw(row.name()) == nullptr, "fsdp-inspect declares ", row.name(),
                " itself, but it is fsdp-train's flag, declared once in the option table "
                "(apps/train_options_table.cpp): drop fsdp-inspect's declaration, mark the row kUses and read "
                "its member of TrainTargets");
  }
  register_rows(app, t, [](const OptionRow& row) { return row.inspect == Inspect::kUses; });
  TrainTargets shapes;  // only the kinds of the ignored rows' values
  for (const OptionRow& row : train_option_table()) {
    if (row.inspect == Inspect::kUses) continue;
    const std::string name = row.name();
    const std::string help = "(fsdp-train's; ignored by fsdp-inspect)";
    CLI::Option* opt = is_switch(row.target(shapes)) ? app.add_flag(name, help)
                                                     : app.add_option(name, ignored.values, help);
    opt->group("");  // accepted, not listed in --help
    ignored.options.emplace_back(name, opt);
  }
}

std::string train_options_json(const CLI::App& app) {
  TrainTargets shapes;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const OptionRow& row : train_option_table()) {
    const CLI::Option* opt = app.get_option_no_throw(row.name());
    FSDP_ASSERT(opt != nullptr, "option ", row.name(), " of the table is not registered");
    const OptionTarget kind = row.target(shapes);
    nlohmann::ordered_json r;
    r["flag"] = row.name();
    r["group"] = row.group;
    r["help"] = row.help;
    r["kind"] = is_switch(kind) ? "switch" : is_repeatable(kind) ? "repeatable" : "value";
    r["type"] = opt->get_type_name();  // CLI11's: INT, FLOAT, TEXT, ... (the --config TOML type follows it)
    r["default"] = opt->get_default_str();
    r["choices"] = row.choices;
    r["config_key"] = row.config_key();
    r["inspect"] = row.inspect == Inspect::kUses ? "uses" : "ignores";
    rows.push_back(r);
  }
  return rows.dump(2);
}

}  // namespace fsdp::cli

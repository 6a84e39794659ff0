#include "fsdp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include <unistd.h>

#include "checkpoint/file_io.h"
#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/checkpoint/ownership.h"
#include "fsdp/checkpoint/sharded.h"
#include "fsdp/common/device.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/trace.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/optim/grad_scaler.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/freeze.h"
#include "train/tensorboard.h"

namespace fsdp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}


std::string signal_name(int code) {
  switch (code) {
    case 15: return "SIGTERM";
    case 2: return "SIGINT";
    default: return "stop request " + std::to_string(code);
  }
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

// The model config an --init-from run uses: --model when it names the same
// directory (or was not given: the CLI then sets it to the directory).
models::LlamaConfig init_config(const TrainOptions& o) {
  models::LlamaConfig cfg = models::resolve_model_config(o.model);
  if (o.hf.init_from.empty()) return cfg;
  const models::LlamaConfig from = models::resolve_model_config(o.hf.init_from);
  const std::string diff = checkpoint::config_mismatch(cfg, from);
  FSDP_CHECK(diff.empty(), "--model ", o.model, " and --init-from ", o.hf.init_from, "/config.json describe different "
             "models (", diff, "); leave out --model to take the config from ", o.hf.init_from);
  // The special token ids name tokens of the vocabulary the weights were
  // trained with, whatever --model says; --export-hf writes them back.
  cfg.bos_token_id = from.bos_token_id;
  cfg.eos_token_id = from.eos_token_id;
  return cfg;
}

// "bos 1, eos 2" / "bos null, eos [128001, 128009]" for logs.
std::string token_ids_text(std::optional<int64_t> bos, const std::vector<int64_t>& eos) {
  const std::string e = eos.empty()       ? std::string("null")
                        : eos.size() == 1 ? std::to_string(eos[0])
                                          : fmt::format("[{}]", fmt::join(eos, ", "));
  return fmt::format("bos {}, eos {}", bos ? std::to_string(*bos) : std::string("null"), e);
}

std::shared_ptr<const data::TokenDataset> load_data(const TrainOptions& o, const std::string& path,
                                              const data::Tokenizer* tokenizer) {
  data::DatasetOptions dopt;
  dopt.path = path;
  dopt.format = o.data.format;
  dopt.text_field = o.data.text_field;
  dopt.token_dtype = o.data.token_dtype;
  // BOS before every document where the tokenizer's own files say so (a tokenizer.json
  // template "<s> $A"); EOS after every document in any case.
  dopt.add_bos = tokenizer != nullptr && tokenizer->adds_bos();
  // Half of what is free: the model and the other ranks on this machine need the rest.
  if (const int64_t free = available_host_memory_bytes(); free > 0) dopt.memory_budget = free / 2;
  return data::load_dataset(dopt, tokenizer);
}

// --device's spelling of a device type ("cpu", "cuda"), as worker_device takes it.
std::string device_name(at::DeviceType type) { return c10::DeviceTypeName(type, /*lower_case=*/true); }

WrapPolicy wrap_policy(const WrapChoice& w) {
  switch (w.kind) {
    case WrapChoice::Kind::kBlock: return WrapPolicy::by_type({models::llama_block_type()});
    case WrapChoice::Kind::kSize: return WrapPolicy::size_based(w.min_num_params);
    case WrapChoice::Kind::kRoot: return WrapPolicy::root_only();
    case WrapChoice::Kind::kAll: return WrapPolicy::every_unit();
  }
  FSDP_ASSERT(false, "unknown WrapChoice::Kind ", static_cast<int>(w.kind));
  return {};
}

// The engine's options from the trainer's (hybrid size 0: the caller fills in
// LOCAL_WORLD_SIZE).
FsdpOptions engine_options(const TrainOptions& o, int world_size) {
  const ShardingOptions& s = o.sharding;
  FSDP_CHECK(s.wrap.kind != WrapChoice::Kind::kSize || s.wrap.min_num_params >= 1, "--wrap size:",
             s.wrap.min_num_params, ": the minimum parameter count after 'size:' must be a positive integer, e.g. "
             "size:1000000");
  FsdpOptions fo;
  fo.strategy = s.strategy;
  fo.wrap = wrap_policy(s.wrap);
  fo.hybrid_shard_size = s.hybrid_shard_size;
  fo.sync_module_states = s.sync_module_states;
  fo.mixed_precision = s.mixed_precision;
  if (s.activation_checkpointing) fo.checkpoint_types = {models::llama_block_type()};
  fo.offload_checkpoint_inputs = s.offload_activations;
  fo.cpu_offload = s.cpu_offload;
  fo.backward_prefetch = s.backward_prefetch;
  fo.forward_prefetch = s.forward_prefetch;
  fo.limit_all_gathers = s.limit_all_gathers;
  fo.device = at::Device(o.device);
  check_options(fo, world_size);
  return fo;
}

// Note [Export extras]
// What --export-hf writes beside the weights and the model's config.json:
//  - "extra_config": the special token ids when there is no --init-from (the
//    tokenizer's; with --init-from its config.json's travel in the model
//    config, see init_config);
//  - "extra_files": [[absolute source path, file name], ...] copied as they
//    are: the --init-from directory's tokenizer and generation files
//    (checkpoint::find_hf_side_files), then the files of the run's own
//    --tokenizer, which replace those of the same name (the model was trained
//    with it): a model directory's tokenizer files; a tokenizer.json (also
//    under another name) as tokenizer.json, with the tokenizer files beside a
//    file named tokenizer.json; a SentencePiece model as tokenizer.model.
//    A tiktoken file (its format is not transformers') and "byte" add none.
// The same JSON goes into every checkpoint's trainer_state ("hf_export"), so a
// conversion of the checkpoint (Note [Checkpoint conversion]) writes what the
// run's own --export-hf would have written.
nlohmann::json export_extras(const TrainOptions& o, const data::Tokenizer& tokenizer,
                             const std::optional<int64_t>& bos, const std::vector<int64_t>& eos) {
  namespace fs = std::filesystem;
  nlohmann::json config = nlohmann::json::object();
  if (o.hf.init_from.empty()) {
    config["bos_token_id"] = bos ? nlohmann::json(*bos) : nlohmann::json(nullptr);
    config["eos_token_id"] = eos.empty() ? nlohmann::json(nullptr) : nlohmann::json(eos[0]);
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (!o.hf.init_from.empty()) files = checkpoint::find_hf_side_files(o.hf.init_from);
  auto own = [&](const std::string& path, const std::string& name) {
    files.erase(std::remove_if(files.begin(), files.end(), [&](const auto& f) { return f.second == name; }),
                files.end());
    files.emplace_back(path, name);
  };
  // A directory's tokenizer files; its generation_config.json belongs to a model, not to the tokenizer.
  auto own_directory = [&](const fs::path& dir) {
    for (const auto& [path, name] : checkpoint::find_hf_side_files(dir.string())) {
      if (name != "generation_config.json") own(path, name);
    }
  };
  std::error_code ec;
  const fs::path spec = o.data.tokenizer;
  const std::string kind = tokenizer.name().substr(0, tokenizer.name().find(':'));
  if (spec != "byte" && fs::is_directory(spec, ec)) {
    own_directory(spec);
  } else if (kind == "hf" || spec.filename() == "tokenizer.json") {
    if (spec.filename() == "tokenizer.json") own_directory(fs::absolute(spec, ec).parent_path());
    own(fs::absolute(spec, ec).string(), "tokenizer.json");
  } else if (kind == "sentencepiece") {
    own(fs::absolute(spec, ec).string(), "tokenizer.model");
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [path, name] : files) list.push_back({path, name});
  return {{"extra_config", config}, {"extra_files", list}};
}

using LogLine = std::function<void(const std::string&)>;

// "45s", "3m12s", "1h02m", "2d03h".
std::string duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (seconds < 10) return fmt::format("{:.1f}s", seconds);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

// Rank 0's console: fsdp-train's log lines ("<time> I [fsdp-train] ..." for
// level 'I' on stdout, 'W' for warnings on stderr; none under --quiet), and,
// when stdout is a terminal, a progress line kept below them (redrawn after
// each step, erased before the next log line, so logs piped to a file or
// collected by Kubernetes never hold it).
class Console {
 public:
  Console(const TrainOptions& o, bool lead)
      : on_(lead && !o.log.quiet), bar_(on_ && isatty(STDOUT_FILENO) == 1) {}
  ~Console() { erase_bar(); }
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  void line(char level, const std::string& text) {
    if (!on_) return;
    erase_bar();
    (level == 'W' ? std::cerr : std::cout) << timestamp() << " " << level << " [fsdp-train] " << text << std::endl;
  }
  LogLine level(char lv) {
    return [this, lv](const std::string& text) { line(lv, text); };
  }
  // [#########...........] 45/100 steps, ETA 3m12s
  void progress(int64_t done, int64_t total, double eta_s) {
    if (!bar_ || total <= 0) return;
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * std::min<int64_t>(done, total) / total);
    std::cout << "\r[" << std::string(static_cast<size_t>(filled), '#')
              << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << done << "/" << total
              << " steps, ETA " << duration_text(eta_s) << std::flush;
    bar_shown_ = true;
  }

 private:
  void erase_bar() {
    if (!bar_shown_) return;
    std::cout << "\r\033[K" << std::flush;
    bar_shown_ = false;
  }
  const bool on_;
  const bool bar_;
  bool bar_shown_ = false;
};

// Writes `text` to `path` through a temporary file in the same directory and
// a rename: a reader (or a crash) sees the old file or the new one, never half.
void write_file_atomically(const std::string& path, const std::string& text, const char* flag) {
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  try {
    checkpoint::io::write_text_file(tmp, text);
    checkpoint::io::rename_path(tmp, path);
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    FSDP_FAIL(flag, " ", path, ": writing failed (", e.what(), "); free space on its disk or choose another path");
  }
}

// Note [Metrics after a resume]
// A run resumed from the checkpoint of step S trains steps S, S+1, ... again;
// the interrupted run may have logged some of them (it stopped after its last
// checkpoint). Their records are dropped from --metrics-file before the
// resumed run appends, so each step is in the file once, with the values of
// the run that continues. So is the evaluation at step S (of the checkpoint's
// own weights), as TensorBoard drops it (train/tensorboard.h): both show the
// same points. Lines that are not JSON objects with a "step" (an
// --eval-only record, a user's note) are kept as they are. The file is
// rewritten atomically. Returns the number of records dropped.
int64_t drop_metrics_from(const std::string& path, int64_t first_step) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;
  std::ifstream in(path);
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() >= first_step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  FSDP_CHECK(!in.bad(), "--metrics-file ", path, ": cannot read it back to drop the steps trained again");
  if (dropped > 0) write_file_atomically(path, kept, "--metrics-file");
  return dropped;
}

// A file rank 0 writes (--metrics-file, --profile-file): its directory exists,
// it is no directory itself, and this process may write it.
void check_output_file(const std::string& path, const char* flag) {
  const auto parent = std::filesystem::path(path).parent_path();
  FSDP_CHECK(parent.empty() || std::filesystem::is_directory(parent), flag, " ", path, ": directory ", parent.string(),
             " does not exist");
  FSDP_CHECK(!std::filesystem::is_directory(path), flag, " ", path, " is a directory; give a file name");
  checkpoint::check_writable(path, flag, /*directory=*/false);
}

// metrics.jsonl -> metrics.config.toml, beside it.
std::string config_path_beside(const std::string& metrics_file) {
  std::filesystem::path p(metrics_file);
  return (p.parent_path() / (p.stem().string() + ".config.toml")).string();
}

// The end-of-run line: what was trained, how fast, the best evaluation, and
// where everything the run wrote went.
std::string run_summary(const TrainOptions& o, const TrainSummary& s, int64_t global_batch, double seconds) {
  const int64_t steps = s.end_step - s.start_step;
  const int64_t tokens = steps * global_batch * o.data.seq_len;
  std::string text = fmt::format("Run summary: {} step{} ({} -> {}) in {}, {} tokens, {:.0f} tokens/s", steps,
                                 steps == 1 ? "" : "s", s.start_step, s.end_step, duration_text(seconds), tokens,
                                 seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
  if (!s.steps.empty()) text += fmt::format("; loss {:.5f} -> {:.5f}", s.steps.front().loss, s.steps.back().loss);
  if (!s.evals.empty()) {
    const auto best = std::min_element(s.evals.begin(), s.evals.end(),
                                       [](const EvalRecord& a, const EvalRecord& b) { return a.loss < b.loss; });
    text += fmt::format("; best eval loss {:.5f} (step {})", best->loss, best->step);
  }
  if (s.stop_reason != 0) text += fmt::format("; stopped by {}", signal_name(s.stop_reason));
  if (!s.last_checkpoint.empty()) text += fmt::format("; checkpoints in {} (last {})", o.checkpoint.dir,
                                                      std::filesystem::path(s.last_checkpoint).filename().string());
  if (!o.hf.export_dir.empty() && s.stop_reason == 0) text += fmt::format("; exported to {}", o.hf.export_dir);
  if (!o.log.metrics_file.empty()) text += fmt::format("; metrics in {}", o.log.metrics_file);
  if (!o.log.tensorboard_dir.empty()) text += fmt::format("; TensorBoard in {}", o.log.tensorboard_dir);
  if (!s.trace_file.empty()) text += fmt::format("; trace in {}", s.trace_file);
  return text;
}

// ---- --profile-steps: Note [Traced steps]

// Chrome trace events of one rank (pid = rank, one tid per thread).
nlohmann::json trace_events_json(const std::vector<trace::Event>& events, int rank) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
  out.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  std::vector<bool> used;
  for (const trace::Event& e : events) {
    nlohmann::json args = nlohmann::json::object();
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    if (e.step >= 0) args["step"] = e.step;
    if (!e.detail.empty()) args[e.cat == "comm" && e.name.find(' ') == std::string::npos ? "what" : "unit"] = e.detail;
    out.push_back({{"ph", "X"}, {"name", e.name}, {"cat", e.cat}, {"ts", e.begin_us}, {"dur", e.dur_us},
                   {"pid", rank}, {"tid", e.thread}, {"args", args}});
    if (used.size() <= static_cast<size_t>(e.thread)) used.resize(static_cast<size_t>(e.thread) + 1);
    used[static_cast<size_t>(e.thread)] = true;
  }
  const std::vector<std::string> names = trace::thread_names();
  for (size_t t = 0; t < used.size() && t < names.size(); ++t) {
    if (!used[t]) continue;
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", names[t]}}}});
    // The training thread first, then the lanes.
    out.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", t},
                   {"args", {{"sort_index", names[t] == "main" ? 0 : static_cast<int>(t) + 1}}}});
  }
  return out;
}

// One line per traced step from this rank's spans: where its time went and
// how much communication it waited for.
std::string profile_summary(const std::vector<trace::Event>& events, const trace::Event& step) {
  const int64_t b = step.begin_us, e = step.begin_us + step.dur_us;
  std::vector<trace::Event> in;  // clipped to the step
  for (const trace::Event& x : events) {
    const int64_t xb = std::max(x.begin_us, b), xe = std::min(x.begin_us + x.dur_us, e);
    if (xe <= xb || x.cat == "step") continue;
    trace::Event c = x;
    c.begin_us = xb;
    c.dur_us = xe - xb;
    in.push_back(std::move(c));
  }
  const int main = step.thread;
  auto ms = [&](auto keep) { return static_cast<double>(trace::covered_us(in, keep)) / 1e3; };
  const double forward = ms([&](const trace::Event& x) { return x.thread == main && x.name == "forward"; });
  const double backward = ms([&](const trace::Event& x) { return x.thread == main && x.name == "backward"; });
  const double optimizer = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "optim"; });
  const double data = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "data"; });
  const double exposed = ms([&](const trace::Event& x) { return x.thread == main && x.cat == "comm"; });
  const double lanes = ms([&](const trace::Event& x) { return x.thread != main && x.cat == "comm"; });
  const double total = static_cast<double>(step.dur_us) / 1e3;
  return fmt::format("Profile step {}: {:.1f} ms (rank 0): forward {:.1f} ms, backward {:.1f} ms, optimizer {:.1f} "
                     "ms, data wait {:.1f} ms; communication {:.1f} ms on the lanes, exposed {:.1f} ms ({:.0f}% of "
                     "the step)",
                     step.step, total, forward, backward, optimizer, data, lanes, exposed,
                     total > 0 ? 100.0 * exposed / total : 0.0);
}

// The engine options of this worker for a model of `cfg` built on the meta
// device: each rank materializes only its own shards (init_rule, seed).
FsdpOptions worker_engine_options(const TrainOptions& o, const comm::Runtime& rt, const models::LlamaConfig& cfg,
                                  at::Device device) {
  FsdpOptions fo = engine_options(o, rt.world_group->size());
  fo.device = device;
  if (fo.hybrid_shard_size == 0) fo.hybrid_shard_size = rt.world.local_world_size;
  fo.init_rule = models::llama_init_rule(cfg);
  fo.seed = o.step.seed;
  return fo;
}

// --lora-rank: the adapters of the model (models/lora.h), added before
// fully_shard lays it out; the init rule of the engine then covers them.
models::LoraConfig lora_config(const TrainOptions& o) {
  models::LoraConfig c;
  c.rank = o.lora.rank;
  c.alpha = o.lora.effective_alpha();
  c.dropout = o.lora.dropout;
  c.targets = o.lora.targets;
  return c;
}

void add_lora(const TrainOptions& o, models::LlamaForCausalLMImpl& model, FsdpOptions* engine = nullptr) {
  if (!o.lora.enabled()) return;
  models::apply_lora(model, lora_config(o), o.step.seed);
  if (engine) engine->init_rule = models::lora_init_rule(model, engine->init_rule);
}

// The export options of --export-hf with the extras above. Carried files that
// no longer exist (a conversion long after the run) are left out, each named
// through `warn`.
checkpoint::HfExportOptions export_options(const TrainOptions& o, const nlohmann::json& extras, bool progress,
                                           const std::function<void(const std::string&)>& warn) {
  checkpoint::HfExportOptions eo;
  eo.dtype = o.hf.export_dtype;
  eo.max_shard_bytes = o.hf.export_shard_bytes;
  eo.progress = progress;
  if (extras.contains("extra_config")) eo.extra_config = extras["extra_config"];
  if (extras.contains("extra_files")) {
    for (const auto& f : extras["extra_files"]) {
      const std::string path = f.at(0).get<std::string>();
      const std::string name = f.at(1).get<std::string>();
      if (std::filesystem::is_regular_file(path)) {
        eo.extra_files.emplace_back(path, name);
      } else {
        warn(fmt::format("{} (the run's {}) no longer exists: the export has no {}; copy it there by hand", path,
                         name, name));
      }
    }
  }
  return eo;
}

// --export-hf: writes the Hugging Face files (a collective over `group`) and logs what was written.
void export_and_report(const TrainOptions& o, ShardedModel& sharded, const models::LlamaConfig& cfg,
                       comm::ProcessGroup& group, const nlohmann::json& extras, bool progress, const LogLine& say,
                       const LogLine& warn) {
  checkpoint::HfExportOptions eo = export_options(o, extras, progress, warn);
  checkpoint::HfExportResult e;
  if (o.lora.enabled() && !o.lora.merge) {
    // A PEFT user's export: the adapter directory, with the tokenizer files (PeftModel.save_pretrained).
    checkpoint::PeftExportOptions po;
    po.dtype = eo.dtype;
    po.base_model = o.hf.init_from.empty() ? o.model : o.hf.init_from;
    po.extra_files = eo.extra_files;
    po.progress = eo.progress;
    e = checkpoint::export_peft_adapter(o.hf.export_dir, sharded, lora_config(o), group, po);
  } else {
    if (o.lora.enabled()) eo.lora_scaling = o.lora.effective_alpha() / static_cast<double>(o.lora.rank);
    e = checkpoint::export_hf(o.hf.export_dir, sharded, cfg, group, eo);
  }
  say(fmt::format("Exported {} ({}) to {} in {:.2f} s: {}, {:.2f} GB/s ({})",
                  !o.lora.enabled() ? "Hugging Face weights" : o.lora.merge ? "merged LoRA weights" : "the LoRA adapter",
                  checkpoint::hf_dtype_name(o.hf.export_dtype), e.dir, e.io.seconds, megabytes(e.io.bytes),
                  e.io.gb_per_s(), fmt::join(e.files, ", ")));
}

// The model config of the newest checkpoint in `dir` whose manifest parses
// (checkpoints of one directory hold one model: resume refuses another).
models::LlamaConfig checkpoint_model_config(const std::string& dir) {
  const auto list = checkpoint::list_checkpoints(dir);
  FSDP_CHECK(!list.empty(), "--checkpoint-dir ", dir, " holds no checkpoint (step_NNNNNNNN/ with manifest.json) to "
             "convert; --max-steps 0 converts an existing checkpoint — point --checkpoint-dir at the run's "
             "directory");
  std::string why;
  for (const auto& c : list) {
    const std::string path = (std::filesystem::path(c.path) / "manifest.json").string();
    try {
      std::ifstream in(path);
      const nlohmann::json manifest = nlohmann::json::parse(in);
      return models::parse_hf_config(manifest.at("model_config").dump(), c.path);
    } catch (const nlohmann::json::exception& e) {
      why += fmt::format("; {}: {}", path, e.what());
    }
  }
  FSDP_FAIL("no checkpoint in ", dir, " has a readable manifest", why);
}

// The config a conversion exports: the checkpoint's, which --model (when
// given: non-empty) must agree with.
models::LlamaConfig conversion_config(const TrainOptions& o) {
  models::LlamaConfig cfg = checkpoint_model_config(o.checkpoint.dir);
  if (!o.model.empty()) {
    const models::LlamaConfig named = models::resolve_model_config(o.model);
    const std::string diff = checkpoint::config_mismatch(named, cfg);
    FSDP_CHECK(diff.empty(), "--model ", o.model, " and the checkpoints in ", o.checkpoint.dir,
               " describe different models (", diff, "); leave out --model to convert the checkpoint's model");
  }
  return cfg;
}

// --export-hf DIR: a LoRA run writes a PEFT adapter directory there unless --merge-lora.
void check_export_target(const TrainOptions& o) {
  if (o.lora.enabled() && !o.lora.merge) {
    checkpoint::check_peft_export_dir(o.hf.export_dir);
  } else {
    checkpoint::check_export_dir(o.hf.export_dir);
  }
}

// --freeze REGEX: requires_grad false on every parameter whose name it finds,
// before fully_shard lays the units out (Note [Frozen parameters] in the engine).
void apply_freeze(const TrainOptions& o, torch::nn::Module& model) {
  if (!o.freeze.empty()) nn::freeze_matching(model, o.freeze);
}

// The --lora-* flags, and their targets against the model (built on the meta device).
void validate_lora(const TrainOptions& o, const models::LlamaConfig& cfg) {
  if (!o.lora.enabled()) {
    for (const auto& [given, flag] : {std::pair<bool, const char*>{o.lora.merge, "--merge-lora"},
                                      {!o.lora.init_adapter.empty(), "--init-adapter"},
                                      {o.lora.alpha != 0, "--lora-alpha"},
                                      {o.lora.dropout != 0, "--lora-dropout"}}) {
      FSDP_CHECK(!given, flag, " needs LoRA: give --lora-rank N (e.g. 8)");
    }
    return;
  }
  FSDP_CHECK(o.lora.rank >= 1, "--lora-rank ", o.lora.rank, " must be >= 1 (e.g. 8 or 16; 0 turns LoRA off)");
  FSDP_CHECK(!o.lora.merge || !o.hf.export_dir.empty(), "--merge-lora merges the adapters into the --export-hf "
             "files; give --export-hf DIR (or leave out --merge-lora)");
  auto meta = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  models::apply_lora(*meta, lora_config(o), 0);  // UsageError: values, targets the model lacks
  if (!o.lora.init_adapter.empty()) {
    const models::LoraConfig a = checkpoint::read_peft_adapter_config(o.lora.init_adapter);
    std::vector<std::string> ours = o.lora.targets;
    std::sort(ours.begin(), ours.end());
    FSDP_CHECK(a.rank == o.lora.rank && a.targets == ours, "--init-adapter ", o.lora.init_adapter, " has r ", a.rank,
               " on ", fmt::format("{}", fmt::join(a.targets, ",")), " but the run has --lora-rank ", o.lora.rank,
               " --lora-targets ", fmt::format("{}", fmt::join(o.lora.targets, ",")), "; give the adapter's");
  }
}

// Note [Checkpoint conversion]
// --max-steps 0 with --resume --checkpoint-dir CK --export-hf OUT: load the
// newest valid checkpoint of CK (its parameters only: no optimizer state, no
// data, no tokenizer) into the model its manifest describes, and export it
// exactly as the run's --export-hf would have (Note [Export extras]). Any
// world size, sharding or wrap: the checkpoint is re-cut on load and the
// export gathers whole units, so the files do not depend on them.
void validate_conversion(const TrainOptions& o, int world_size) {
  worker_device(device_name(o.device), /*local_rank=*/0);
  const char* what = "--max-steps 0 converts a checkpoint to Hugging Face files without training";
  std::string missing;
  for (const auto& [absent, flag] : {std::pair<bool, const char*>{!o.checkpoint.resume, "--resume"},
                                     {o.checkpoint.dir.empty(), "--checkpoint-dir DIR"},
                                     {o.hf.export_dir.empty(), "--export-hf OUT"}}) {
    if (absent) missing += std::string(missing.empty() ? "" : ", ") + flag;
  }
  FSDP_CHECK(missing.empty(), what, ": it needs --resume --checkpoint-dir DIR --export-hf OUT (missing: ", missing,
             "); or give --max-steps >= 1 to train");
  FSDP_CHECK(o.hf.init_from.empty(), what, ": the weights come from the checkpoint, so --init-from ",
             o.hf.init_from, " has no use — leave it out (the run's --init-from files are carried over from the "
             "checkpoint's record)");
  FSDP_CHECK(!o.eval.only, what, "; --eval-only evaluates instead: give it --max-steps >= 1 or leave it out");
  FSDP_CHECK(std::filesystem::is_directory(o.checkpoint.dir), "--checkpoint-dir ", o.checkpoint.dir,
             " is not a directory holding checkpoints");
  check_export_target(o);
  checkpoint::hf_dtype_name(o.hf.export_dtype);  // float32, bfloat16 or float16, else UsageError
  engine_options(o, world_size);
  validate_lora(o, conversion_config(o));
}

TrainSummary convert_checkpoint(const TrainOptions& o, const comm::Runtime& rt) {
  const comm::ProcessGroupPtr& world = rt.world_group;
  const bool lead = world->rank() == 0;
  const at::Device device = worker_device(device_name(o.device), rt.world.local_rank);
  set_current_device(device);
  Console console(o, lead);
  const LogLine say = console.level('I');
  const LogLine warn = console.level('W');
  const bool progress = lead && !o.log.quiet && isatty(STDERR_FILENO) == 1;

  const models::LlamaConfig cfg = conversion_config(o);
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), o.step.seed);
  FsdpOptions fo = worker_engine_options(o, rt, cfg, device);
  add_lora(o, *impl, &fo);  // a LoRA run's checkpoint: the same --lora-* flags
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);
  auto sharded = fully_shard(root.ptr(), world, fo);
  comm::ProcessGroupPtr group = rt.cpu_group ? rt.cpu_group : world;

  checkpoint::LoadOptions lo;
  lo.progress = progress;
  const checkpoint::LoadResult r =
      checkpoint::load_latest_checkpoint(o.checkpoint.dir, *sharded, /*optimizer=*/nullptr, *group, lo);
  for (const auto& why : r.rejected) warn(why + "; trying the previous checkpoint");
  std::vector<std::string> ignored;
  checkpoint::list_checkpoints(o.checkpoint.dir, &ignored);
  for (const auto& i : ignored) warn(fmt::format("{}/{} is not a checkpoint: ignored", o.checkpoint.dir, i));
  FSDP_CHECK(r.loaded, "--checkpoint-dir ", o.checkpoint.dir, " holds no checkpoint to convert");
  const std::string diff =
      checkpoint::config_mismatch(cfg, models::parse_hf_config(r.manifest->at("model_config").dump(), r.path));
  FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " holds another model than the newest checkpoint's (", diff,
             "); convert it from a directory of its own");
  say(fmt::format("Loaded checkpoint {} (step {}, {}): {} in {:.2f} s, {:.2f} GB/s", r.path, r.step, cfg.summary(),
                  megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
  const nlohmann::json extras =
      r.trainer_state->contains("hf_export") ? (*r.trainer_state)["hf_export"] : nlohmann::json::object();
  export_and_report(o, *sharded, cfg, *group, extras, progress, say, warn);
  TrainSummary summary;
  summary.parameters = cfg.num_parameters();
  summary.plan = sharded->describe();
  summary.start_step = r.step;
  summary.end_step = r.step;
  summary.resumed_from = r.path;
  return summary;
}

}  // namespace

void validate_options(const TrainOptions& o, int world_size) {
  if (o.step.max_steps == 0) {  // Note [Checkpoint conversion]: no data, no training flags
    validate_conversion(o, world_size);
    return;
  }
  worker_device(device_name(o.device), /*local_rank=*/0);  // a known --device, a build that has it, at least one device
  FSDP_CHECK(o.step.batch_size >= 1, "--batch-size must be >= 1, got ", o.step.batch_size);
  FSDP_CHECK(o.step.grad_accum >= 1, "--grad-accum must be >= 1, got ", o.step.grad_accum);
  FSDP_CHECK(o.step.max_steps >= 1, "--max-steps must be >= 1 (or 0 with --resume --checkpoint-dir DIR --export-hf "
             "OUT: convert the newest checkpoint to Hugging Face files), got ", o.step.max_steps);
  FSDP_CHECK(o.step.clip_grad >= 0, "--clip-grad must be >= 0 (0 disables clipping), got ", o.step.clip_grad);
  FSDP_CHECK(o.log.log_every >= 1, "--log-every must be >= 1, got ", o.log.log_every);
  FSDP_CHECK(o.data.seq_len >= 1, "--seq-len must be >= 1, got ", o.data.seq_len);
  FSDP_CHECK(o.data.prefetch >= 1, "the loader's prefetch depth must be >= 1, got ", o.data.prefetch);
  // Products of flags must fit in 64 bits before anything is sized or indexed by them
  // (the global batch, the sample index of the last step, a micro-batch's tokens).
  {
    const int64_t procs = std::max(world_size, 1);
    auto fits = [](std::initializer_list<int64_t> factors) { return checked_product(factors).has_value(); };
    const auto& st = o.step;
    FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs}), "the global batch, --batch-size ", st.batch_size,
               " x --grad-accum ", st.grad_accum, " x ", procs, " process", procs == 1 ? "" : "es",
               ", is beyond 64-bit integers — use values whose product is a batch this machine can hold");
    FSDP_CHECK(fits({st.batch_size, st.grad_accum, procs, st.max_steps}), "--max-steps ", st.max_steps,
               " global batches of ", st.batch_size * st.grad_accum * procs, " samples (--batch-size x --grad-accum x ",
               procs, " process", procs == 1 ? "" : "es", ") number samples beyond 64-bit integers — use fewer steps "
               "or a smaller batch");
    FSDP_CHECK(fits({st.batch_size, o.data.seq_len, 2}), "a micro-batch of --batch-size ", st.batch_size,
               " x --seq-len ", o.data.seq_len, " tokens is beyond 64-bit integers — use smaller values");
  }
  FSDP_CHECK(!o.data.path.empty(), "--data is required: a text file, a JSON-lines file, a binary token file or a "
             "directory of .bin shards");
  // A file, a directory or a pattern (c4/en/c4-train.*.json.gz); data_files names what is missing.
  FSDP_CHECK(!data::data_files({o.data.path, o.data.format}).empty(), "--data ", o.data.path, ": no data files");
  data::tokenizer_file(o.data.tokenizer);  // exists, a regular file (not /dev/zero or a FIFO), not empty
  optim::LrSchedule sched = o.schedule;
  sched.max_steps = o.step.max_steps;
  // The optimizer takes these as 32-bit float scalars: 1e300 is a finite double but no float.
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--lr", o.schedule.lr}, {"--min-lr", o.schedule.min_lr},
                                {"--weight-decay", o.adamw.weight_decay}, {"--beta1", o.adamw.beta1},
                                {"--beta2", o.adamw.beta2}}) {
    FSDP_CHECK(std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(), flag, " ", v,
               " is outside the range of a 32-bit float (|x| <= 3.4e38), which the optimizer computes in");
  }
  sched.validate();
  FSDP_CHECK(o.adamw.weight_decay >= 0, "--weight-decay must be >= 0, got ", o.adamw.weight_decay);
  FSDP_CHECK(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1, "--beta1 must be in [0, 1), got ", o.adamw.beta1,
             " (PyTorch's default is 0.9)");
  FSDP_CHECK(o.adamw.beta2 >= 0 && o.adamw.beta2 < 1, "--beta2 must be in [0, 1), got ", o.adamw.beta2,
             " (PyTorch's default is 0.999; Llama used 0.95)");
  engine_options(o, world_size);  // every sharding, memory and precision choice fits the engine
  FSDP_CHECK(std::isfinite(o.sharding.initial_loss_scale) && o.sharding.initial_loss_scale > 0,
             "--initial-loss-scale must be a finite number > 0 (e.g. 65536), got ", o.sharding.initial_loss_scale);
  FSDP_CHECK(o.sharding.hybrid_shard_size >= 0, "--hybrid-shard-size must be >= 1 (or 0 for LOCAL_WORLD_SIZE), got ",
             o.sharding.hybrid_shard_size);
  FSDP_CHECK(o.checkpoint.every >= 0, "--checkpoint-every must be >= 0 (0: only at the end), got ", o.checkpoint.every);
  FSDP_CHECK(o.checkpoint.keep_last >= 0, "--keep-last must be >= 0 (0: keep all), got ", o.checkpoint.keep_last);
  if (o.checkpoint.dir.empty()) {
    FSDP_CHECK(!o.checkpoint.resume, "--resume needs --checkpoint-dir DIR (the directory checkpoints are saved to "
               "and resumed from)");
    FSDP_CHECK(o.checkpoint.every == 0, "--checkpoint-every needs --checkpoint-dir DIR");
    FSDP_CHECK(o.checkpoint.keep_last == 0, "--keep-last needs --checkpoint-dir DIR");
  } else {
    std::error_code ec;
    FSDP_CHECK(!std::filesystem::exists(o.checkpoint.dir, ec) || std::filesystem::is_directory(o.checkpoint.dir, ec),
               "--checkpoint-dir ", o.checkpoint.dir, " exists and is not a directory");
    checkpoint::check_writable(o.checkpoint.dir, "--checkpoint-dir", /*directory=*/true);
    checkpoint::check_checkpoint_dir(o.checkpoint.dir);  // Note [Ownership of what we delete]
    // A new run would overwrite (and --keep-last delete) another run's checkpoints.
    const auto existing = checkpoint::list_checkpoints(o.checkpoint.dir);
    FSDP_CHECK(o.checkpoint.resume || existing.empty(), "--checkpoint-dir ", o.checkpoint.dir, " already holds ",
               existing.size(), " checkpoint", existing.size() == 1 ? "" : "s", " (newest ",
               existing.empty() ? "" : std::filesystem::path(existing.front().path).filename().string(),
               "); add --resume to continue from it, or choose another directory");
  }
  if (!o.hf.init_from.empty()) {
    checkpoint::find_hf_weights(o.hf.init_from);
    FSDP_CHECK(std::filesystem::exists(std::filesystem::path(o.hf.init_from) / "config.json"), "--init-from ",
               o.hf.init_from, " has no config.json (a Hugging Face model directory has config.json and "
               "*.safetensors)");
  }
  if (!o.hf.export_dir.empty()) {
    check_export_target(o);
    checkpoint::hf_dtype_name(o.hf.export_dtype);  // float32, bfloat16 or float16, else UsageError
  }
  FSDP_CHECK(o.eval.every >= 0, "--eval-every must be >= 0 (0: no periodic evaluation), got ", o.eval.every);
  FSDP_CHECK(o.eval.max_windows >= 0, "--eval-windows must be >= 0 (0: all), got ", o.eval.max_windows);
  if (o.eval.val_data.empty()) {
    FSDP_CHECK(o.eval.every == 0, "--eval-every needs --val-data PATH");
    FSDP_CHECK(!o.eval.only, "--eval-only needs --val-data PATH");
  } else {
    FSDP_CHECK(!data::data_files({o.eval.val_data, o.data.format}).empty(), "--val-data ", o.eval.val_data,
               ": no data files");
  }
  FSDP_CHECK(!o.eval.only || !o.hf.init_from.empty() || o.checkpoint.resume,
             "--eval-only evaluates existing weights: give --init-from DIR or --resume with --checkpoint-dir DIR");
  const models::LlamaConfig cfg = init_config(o);
  validate_lora(o, cfg);
  FSDP_CHECK(o.data.seq_len <= cfg.max_position_embeddings, "--seq-len ", o.data.seq_len, " is longer than model '",
             cfg.name, "' supports (max_position_embeddings = ", cfg.max_position_embeddings,
             "); use --seq-len <= ", cfg.max_position_embeddings);
  if (!o.log.metrics_file.empty()) check_output_file(o.log.metrics_file, "--metrics-file");
  if (!o.log.tensorboard_dir.empty()) {
    checkpoint::check_writable(o.log.tensorboard_dir, "--tensorboard", /*directory=*/true);
  }
  if (o.log.profile_end > o.log.profile_begin) {
    FSDP_CHECK(o.log.profile_begin >= 0, "--profile-steps ", o.log.profile_begin, ":", o.log.profile_end,
               " starts before step 0; steps are numbered from 0 as in the log's 'Batch N'");
    FSDP_CHECK(o.log.profile_begin < o.step.max_steps, "--profile-steps ", o.log.profile_begin, ":",
               o.log.profile_end, " starts at or after --max-steps ", o.step.max_steps,
               ", so nothing would be traced; choose steps below ", o.step.max_steps);
    FSDP_CHECK(!o.log.profile_file.empty(), "--profile-file is empty; give the trace's file name");
    check_output_file(o.log.profile_file, "--profile-file");
  }
}

// Note [Memory check]
// Overcommitting kernels let a process map far more than the machine has; the run
// then dies at the first touch (the OOM killer: SIGKILL, no message) or LibTorch
// throws from deep inside a step. So before anything is allocated, the plan's bytes
// (plan_sharding on the meta device: no memory), the logits of one micro-batch and
// a lower bound on its activations are compared with what the machine says it has:
// /proc/meminfo's MemAvailable within the cgroup's limit, and cudaMemGetInfo's free
// bytes. It is a lower bound (attention scores, communication buffers and LibTorch
// itself come on top), so it refuses only runs that cannot fit. The local launcher checks
// all of its processes at once before starting them; every rank then checks its
// own share, which its siblings' allocations cannot make fail (the launcher saw
// room for all of them).
int64_t check_memory(const TrainOptions& o, int world_size, int local_world_size,
                     std::optional<c10::Device> this_rank) {
  if (o.step.max_steps == 0) return 0;  // a conversion holds one unit at a time
  const models::LlamaConfig cfg = init_config(o);
  auto impl = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  add_lora(o, *impl);  // a frozen base has no gradient or optimizer state
  apply_freeze(o, *impl);
  nn::Unit<models::LlamaForCausalLMImpl> root(impl);
  FsdpOptions fo = engine_options(o, world_size);
  if (fo.hybrid_shard_size == 0) fo.hybrid_shard_size = local_world_size;
  const bool pure = fo.mixed_precision.master_dtype == at::kBFloat16;
  const ShardingPlan plan = plan_sharding(root.ptr(), world_size, 0, fo, pure ? at::kBFloat16 : at::kFloat);
  // The sizes are bounded (LlamaConfig limits, validate_options' products), except
  // what grows with a micro-batch: B x T x (elements per token) of the compute dtype.
  const int64_t elem = static_cast<int64_t>(c10::elementSize(fo.mixed_precision.param_dtype));
  const int64_t kHuge = std::numeric_limits<int64_t>::max() / 4;  // "more than any machine": no overflow below
  const auto bytes_per_micro_batch = [&](int64_t elements_per_token) {
    const std::optional<int64_t> b = checked_product({o.step.batch_size, o.data.seq_len, elements_per_token, elem});
    return std::min(b.value_or(kHuge), kHuge);
  };
  const int64_t logit_bytes = bytes_per_micro_batch(cfg.vocab_size);
  // Activations kept for backward, a lower bound per token and decoder layer: the
  // norms, q/k/v/o and residuals (10 x hidden_size) and the MLP's gate, up, act
  // and product (4 x intermediate_size); attention scores are left out (a fused
  // kernel keeps none). With --activation-checkpointing only each layer's input
  // stays, plus one layer while it is recomputed. (Measured on the tiny model:
  // 281 MB over the weights' at B=16, T=256; this says 210 MB.)
  const int64_t per_layer = 10 * cfg.hidden_size + 4 * cfg.intermediate_size;
  const int64_t per_token = o.eval.only ? per_layer
                            : o.sharding.activation_checkpointing
                                ? cfg.num_hidden_layers * cfg.hidden_size + per_layer
                                : cfg.num_hidden_layers * per_layer;
  const int64_t activation_bytes = bytes_per_micro_batch(per_token);
  const int64_t shards = plan.param_shard_bytes + (o.eval.only ? 0 : plan.grad_shard_bytes + plan.optimizer_bytes);
  const int64_t unsharded = plan.unsharded_bound(o.step.grad_accum);
  const int64_t step = unsharded + logit_bytes + activation_bytes;
  const bool on_device = this_rank && this_rank->is_cuda();
  const bool cuda_run = o.device == at::kCUDA;
  // Host: everything on CPU runs; the offloaded shards with --cpu-offload on CUDA.
  const int64_t host = cuda_run ? (o.sharding.cpu_offload ? shards : 0) : shards + step;
  const std::string parts = fmt::format(
      "parameter and gradient shards {}, optimizer state {}, unsharded units during a step {}, logits of one "
      "micro-batch {} (--batch-size {} x --seq-len {} x vocab_size {}), activations {}",
      format_bytes(plan.param_shard_bytes + (o.eval.only ? 0 : plan.grad_shard_bytes)),
      format_bytes(o.eval.only ? 0 : plan.optimizer_bytes), format_bytes(unsharded),
      format_bytes(logit_bytes), o.step.batch_size, o.data.seq_len, cfg.vocab_size, format_bytes(activation_bytes));
  const char* fix = "reduce --batch-size or --seq-len, add --activation-checkpointing, shard over more processes or "
                    "machines, use --cpu-offload, bf16 (--mixed-precision) or a smaller model";
  const int ranks = this_rank ? 1 : std::max(local_world_size, 1);
  if (host > 0) {
    const int64_t available = available_host_memory_bytes();
    const std::optional<int64_t> need = checked_mul(host, ranks);
    FSDP_CHECK(available < 0 || (need && *need <= available), "model '", cfg.name, "' needs at least ",
               format_bytes(host), " of host memory per process (", parts, ")",
               ranks > 1 ? fmt::format(" x {} processes on this machine = {}", ranks,
                                       need ? format_bytes(*need) : std::string("beyond 64-bit integers"))
                         : std::string(),
               ", but this machine has ", format_bytes(available), " available — ", fix);
  }
  if (on_device) {
    const int64_t device_need = (o.sharding.cpu_offload ? 0 : shards) + step;
    const int64_t free = free_memory_bytes(*this_rank);
    FSDP_CHECK(free < 0 || device_need <= free, "model '", cfg.name, "' needs at least ", format_bytes(device_need),
               " on ", this_rank->str(), " (", parts, "), but it has ", format_bytes(free), " free — ", fix);
  }
  return unsharded;
}

// The state of one run on this rank. Members are declared in the order they
// come to exist, so that they are destroyed in reverse: the loader before the
// data, the optimizer and scaler before the groups they reduce over, the
// checkpoint directory's lock last but for the console.
class Trainer::Impl {
 public:
  Impl(TrainOptions options, comm::Runtime runtime);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void restore();
  StepRecord train_step();
  EvalRecord evaluate(int64_t max_windows);
  std::string save();
  void export_hf();
  TrainSummary run();

  int64_t step() const { return step_; }
  bool stop_requested() const { return stop_; }
  const TrainSummary& summary() const { return summary_; }

 private:
  void build();
  void warn_about_token_ids();
  void log_plan_and_memory();
  void open_records();
  void write_metrics(const nlohmann::json& j);
  void begin_training();
  at::Tensor forward_backward();
  void log_step(StepRecord& rec);
  void check_unsharded_contract(int64_t step, const UnshardedMemory& unsharded);
  nlohmann::json trainer_state(int64_t completed) const;
  void start_trace_if_due();
  void finish_trace();
  int agree_stop_reason();
  void require_restored(const char* method) const;

  const TrainOptions o_;
  const comm::Runtime rt_;
  const comm::ProcessGroupPtr world_;
  const int rank_;
  const int W_;
  const bool lead_;
  // Note [Checkpoint conversion]: max_steps == 0 builds nothing; run() converts.
  const bool conversion_;
  Console console_;
  const LogLine say_;
  const LogLine warn_;
  // Progress bars for long checkpoint I/O: rank 0, and only on a terminal.
  const bool progress_;

  // cuda:<local rank> (the NCCL world group's device) or the CPU.
  at::Device device_ = at::kCPU;
  int64_t unsharded_bound_ = 0;  // the plan's bound on the engine's unsharded buffers (Note [Unsharded memory])
  checkpoint::CheckpointDirHold checkpoint_dir_;
  models::LlamaConfig cfg_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::optional<int64_t> tokenizer_bos_;
  std::vector<int64_t> tokenizer_eos_;
  std::shared_ptr<const data::TokenDataset> dataset_;
  std::shared_ptr<const data::TokenDataset> val_dataset_;  // null without eval.val_data
  std::shared_ptr<const data::BatchSampler> sampler_;
  int64_t global_batch_ = 0;  // G: samples per optimizer step over all ranks
  std::shared_ptr<models::LlamaForCausalLMImpl> model_;
  std::optional<checkpoint::HfImportResult> rank0_import_;  // --sync-module-states --init-from: rank 0 read the files
  std::optional<nn::Unit<models::LlamaForCausalLMImpl>> root_;
  FsdpOptions engine_;
  std::shared_ptr<ShardedModel> sharded_;
  double device_peak_flops_ = 0;
  double flops_per_token_ = 0;
  std::unique_ptr<optim::AdamW> opt_;
  optim::LrSchedule sched_;
  // Scalars the trainer reduces (loss, the stop flag, checkpoint agreement)
  // go through their own group, so the FSDP byte counts in the metrics are
  // the engine's alone.
  comm::ProcessGroupPtr scalars_;
  std::unique_ptr<optim::ShardedGradScaler> scaler_;  // null without loss scaling
  TrainSummary summary_;
  // Opened by restore(), once the start step is known (Note [Metrics after a resume]).
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> board_;
  nlohmann::json model_config_;
  // Note [Export extras]: what --export-hf adds, recorded in every checkpoint.
  nlohmann::json hf_extras_;

  bool restored_ = false;
  bool resumed_ = false;
  int64_t start_step_ = 0;  // where restore() started
  int64_t step_ = 0;        // completed steps
  int64_t saved_at_ = -1;   // the step of the newest checkpoint in checkpoint.dir of this run, -1: none
  std::unique_ptr<data::BackgroundLoader> loader_;  // from begin_training()
  // The interval since the previous logged step, which its Speed and ETA cover.
  Clock::time_point interval_start_;
  int64_t interval_steps_ = 0;
  double seconds_per_step_ = 0;  // the latest interval's mean, for the ETA
  bool contract_broken_ = false;  // warned once that the unsharded-memory bound failed
  int stop_local_ = 0;            // this rank's stop request at the last step
  bool stop_ = false;             // agreed at the last step: some rank asked to stop
  bool tracing_ = false;
};

Trainer::Impl::Impl(TrainOptions options, comm::Runtime runtime)
    : o_(std::move(options)),
      rt_(std::move(runtime)),
      world_(rt_.world_group),
      rank_(world_->rank()),
      W_(world_->size()),
      lead_(rank_ == 0),
      conversion_(o_.step.max_steps == 0),
      console_(o_, lead_),
      say_(console_.level('I')),
      warn_(console_.level('W')),
      progress_(lead_ && !o_.log.quiet && isatty(STDERR_FILENO) == 1) {
  validate_options(o_, W_);
  trace::set_thread_name("main");
  if (!conversion_) build();
}

void Trainer::Impl::build() {
  device_ = worker_device(device_name(o_.device), rt_.world.local_rank);
  FSDP_CHECK(world_->device().type() == device_.type(), "--device ", device_name(o_.device),
             " but the world process group (", world_->backend(), ") runs on ", world_->device().str(),
             "; start the workers with the backend for ", device_name(o_.device), " (tcp for cpu, nccl for cuda)");
  set_current_device(device_);
  // This rank's share, before anything is allocated.
  unsharded_bound_ = check_memory(o_, W_, rt_.world.local_world_size, device_);
  // --checkpoint-dir is this run's alone until it ends (Note [Ownership of
  // what we delete]): rank 0 locks it and removes what interrupted saves left.
  if (!o_.checkpoint.dir.empty()) {
    checkpoint_dir_ = checkpoint::open_checkpoint_dir(o_.checkpoint.dir, rt_.cpu_group ? *rt_.cpu_group : *world_);
  }

  // --- model configuration and data
  cfg_ = init_config(o_);
  tokenizer_ = data::make_tokenizer(o_.data.tokenizer);
  FSDP_CHECK(tokenizer_->vocab_size() <= cfg_.vocab_size, "tokenizer ", tokenizer_->name(), " has ",
             tokenizer_->vocab_size(), " tokens but model '", cfg_.name, "' has vocab_size ", cfg_.vocab_size,
             "; choose a model with a large enough vocabulary or another tokenizer");
  if (tokenizer_->bos_id() >= 0) tokenizer_bos_ = tokenizer_->bos_id();
  if (tokenizer_->eos_id() >= 0) tokenizer_eos_ = {tokenizer_->eos_id()};
  warn_about_token_ids();
  dataset_ = load_data(o_, o_.data.path, tokenizer_.get());
  dataset_->validate(cfg_.vocab_size);
  if (!o_.eval.val_data.empty()) {
    val_dataset_ = load_data(o_, o_.eval.val_data, tokenizer_.get());
    val_dataset_->validate(cfg_.vocab_size);
  }

  data::SamplerOptions sopt;
  sopt.seq_len = o_.data.seq_len;
  sopt.batch_size = o_.step.batch_size;
  sopt.world_size = W_;
  sopt.rank = rank_;
  sopt.grad_accum = o_.step.grad_accum;
  sopt.seed = o_.step.seed;
  sopt.shuffle = o_.data.shuffle;
  sampler_ = std::make_shared<const data::BatchSampler>(dataset_, sopt);
  global_batch_ = sampler_->global_batch_size();
  // One optimizer step reads each window at most once: a global batch past the
  // epoch (a slip of --grad-accum) would repeat the data inside every step and
  // could run for years.
  FSDP_CHECK(o_.eval.only || global_batch_ <= sampler_->samples_per_epoch(), "one optimizer step reads --batch-size ",
             o_.step.batch_size, " x --grad-accum ", o_.step.grad_accum, " x ", W_, " ranks = ", global_batch_,
             " windows, but --data ", o_.data.path, " holds only ", sampler_->samples_per_epoch(),
             " windows of --seq-len ", o_.data.seq_len,
             " per epoch — lower --grad-accum or --batch-size (or --seq-len), or give more data");

  // --- model, built on the meta device; each rank materializes its shards.
  // --sync-module-states: rank 0 alone builds the whole model on the CPU
  // (initialized, or loaded from --init-from) and fully_shard broadcasts its
  // values, unit by unit, to every rank's shards.
  const bool rank0_materializes = o_.sharding.sync_module_states && rank_ == 0;
  model_ = std::make_shared<models::LlamaForCausalLMImpl>(
      cfg_, at::TensorOptions().device(rank0_materializes ? at::kCPU : at::kMeta), o_.step.seed);
  engine_ = worker_engine_options(o_, rt_, cfg_, device_);
  add_lora(o_, *model_, &engine_);
  apply_freeze(o_, *model_);
  if (rank0_materializes && !o_.hf.init_from.empty()) {
    rank0_import_ = checkpoint::import_hf_module(o_.hf.init_from, *model_, cfg_, progress_);
  }
  if (rank0_materializes && !o_.lora.init_adapter.empty()) {
    checkpoint::import_peft_adapter_module(o_.lora.init_adapter, *model_);
  }
  root_.emplace(model_);
  sharded_ = fully_shard(root_->ptr(), world_, engine_);
  // MFU: this rank's share of the model FLOPs per second over the device's data-sheet
  // peak for the compute dtype; left out where the peak is not known (the CPU).
  device_peak_flops_ = peak_flops(device_model(device_), engine_.mixed_precision.param_dtype);
  flops_per_token_ = cfg_.training_flops_per_token(o_.data.seq_len);
  if (o_.sharding.sync_module_states) {
    say_(fmt::format("--sync-module-states: rank 0's {} broadcast to {} rank{} before sharding",
                     o_.hf.init_from.empty() ? "initial parameters" : "weights from " + o_.hf.init_from, W_,
                     W_ == 1 ? "" : "s"));
  }

  optim::AdamWOptions aopt = o_.adamw;
  if (engine_.mixed_precision.master_dtype == at::kBFloat16) {
    // Pure bf16: AnyPrecision AdamW (bf16 moments, Kahan-compensated updates).
    aopt.state_dtype = at::kBFloat16;
    aopt.kahan_summation = true;
  }
  opt_ = std::make_unique<optim::AdamW>(aopt);
  opt_->add_shards(sharded_->shards(), sharded_->units(), optim::param_rule(o_.param_groups));
  sched_ = o_.schedule;
  sched_.max_steps = o_.step.max_steps;

  // Host-side tensors: with NCCL the runtime's TCP cpu_group carries them.
  scalars_ = rt_.cpu_group ? rt_.cpu_group : W_ > 1 ? world_->new_group([&] {
    std::vector<int> all(static_cast<size_t>(W_));
    for (int i = 0; i < W_; ++i) all[static_cast<size_t>(i)] = i;
    return all;
  }(), "trainer") : world_;

  // fp16: dynamic loss scaling over the sharded gradients; every rank skips
  // the same steps (grad_scaler.h).
  const LossScaling ls = o_.sharding.loss_scaling;
  if (ls == LossScaling::kOn || (ls == LossScaling::kAuto && engine_.mixed_precision.param_dtype == at::kHalf)) {
    optim::GradScalerOptions gso;
    gso.init_scale = o_.sharding.initial_loss_scale;
    scaler_ = std::make_unique<optim::ShardedGradScaler>(gso, scalars_);
  }

  summary_.parameters = cfg_.num_parameters();
  summary_.plan = sharded_->describe();
  log_plan_and_memory();
  model_config_ = nlohmann::json::parse(cfg_.to_hf_config_json());
  hf_extras_ = export_extras(o_, *tokenizer_, tokenizer_bos_, tokenizer_eos_);
}

// With --init-from, the special token ids of its config.json (which --export-hf
// keeps) may name other tokens than the tokenizer's (which training uses).
void Trainer::Impl::warn_about_token_ids() {
  if (o_.hf.init_from.empty() || (!cfg_.bos_token_id.has_value() && cfg_.eos_token_id.empty())) return;
  const bool bos_differs = cfg_.bos_token_id && tokenizer_bos_ && *cfg_.bos_token_id != *tokenizer_bos_;
  const bool eos_differs = !cfg_.eos_token_id.empty() && !tokenizer_eos_.empty() &&
                           std::find(cfg_.eos_token_id.begin(), cfg_.eos_token_id.end(), tokenizer_eos_[0]) ==
                               cfg_.eos_token_id.end();
  if (bos_differs || eos_differs) {
    warn_(fmt::format("--tokenizer {} uses {} but {}/config.json says {}; training uses the tokenizer's ids, "
                      "--export-hf keeps the config's (they belong to the weights' vocabulary)",
                      o_.data.tokenizer, token_ids_text(tokenizer_bos_, tokenizer_eos_), o_.hf.init_from,
                      token_ids_text(cfg_.bos_token_id, cfg_.eos_token_id)));
  }
}

void Trainer::Impl::log_plan_and_memory() {
  int64_t total = 0, trainable = 0;
  for (const UnitInfo& e : sharded_->units()) {
    total += e.numel;
    trainable += e.trainable ? e.numel : 0;
  }
  const std::string frozen = trainable == total ? std::string()
                             : fmt::format("; {} of {} trainable, {} frozen", trainable, total, total - trainable);
  say_(fmt::format("model {} ({} parameters{}), {} ranks ({}), {} units, global batch {} x {} tokens", cfg_.name,
                   cfg_.num_parameters(), frozen, W_, rt_.world.launcher, count_units(sharded_->units()),
                   global_batch_, o_.data.seq_len));
  say_(fmt::format("data {}, {} windows of {} tokens per epoch", dataset_->describe(), sampler_->samples_per_epoch(),
                   o_.data.seq_len));
  if (lead_ && !o_.log.quiet) std::cout << summary_.plan << std::flush;
  // Where this rank's bytes live (CPU offload moves shards and optimizer state to host memory).
  std::string where;
  for (const auto& m : sharded_->memory_placement()) {
    if (m.bytes == 0) continue;
    where += fmt::format("{}{} {} on {}{}", where.empty() ? "" : ", ", m.what, format_bytes(m.bytes), m.device,
                         m.pinned ? " (pinned)" : "");
  }
  int64_t state = 0;
  for (const auto& slot : opt_->slots()) state += slot.exp_avg.nbytes() + slot.exp_avg_sq.nbytes();
  const std::string state_device = opt_->slots().empty() ? "-" : opt_->slots().front().exp_avg.device().str();
  say_(fmt::format("memory per rank: {}, optimizer state {} on {}; unsharded buffers during a step at most {}",
                   where, format_bytes(state), state_device, format_bytes(unsharded_bound_)));
}

void Trainer::Impl::require_restored(const char* method) const {
  FSDP_CHECK(!conversion_, "Trainer::", method, ": step.max_steps is 0, which converts a checkpoint; only run() "
             "does that");
  FSDP_CHECK(restored_, "Trainer::", method, " needs the weights in place: call restore() first");
}

// --- where the weights come from: a checkpoint, a Hugging Face directory, or the seed
void Trainer::Impl::restore() {
  FSDP_CHECK(!conversion_, "Trainer::restore: step.max_steps is 0, which converts a checkpoint; only run() does "
             "that");
  FSDP_CHECK(!restored_, "Trainer::restore: the weights are restored already; call it once");
  for (const auto& name : checkpoint_dir_.removed) {
    say_(fmt::format("removed {}/{}, left by an interrupted save", o_.checkpoint.dir, name));
  }
  if (o_.checkpoint.resume) {
    checkpoint::LoadOptions lo;
    lo.progress = progress_;
    const checkpoint::LoadResult r =
        checkpoint::load_latest_checkpoint(o_.checkpoint.dir, *sharded_, opt_.get(), *scalars_, lo);
    for (const auto& why : r.rejected) warn_(why + "; trying the previous checkpoint");
    if (r.loaded) {
      resumed_ = true;
      const models::LlamaConfig saved = models::parse_hf_config(r.manifest->at("model_config").dump(), r.path);
      const std::string diff = checkpoint::config_mismatch(cfg_, saved);
      FSDP_CHECK(diff.empty(), "checkpoint ", r.path, " was saved from another model (", diff,
                 "); resume with the model it was saved with or use another --checkpoint-dir");
      const nlohmann::json& ts = *r.trainer_state;
      start_step_ = ts.at("step").get<int64_t>();
      if (scaler_ && ts.contains("grad_scaler")) {
        scaler_->set_state(ts["grad_scaler"].at("scale").get<double>(),
                           ts["grad_scaler"].at("growth_tracker").get<int64_t>());
      }
      summary_.resumed_from = r.path;
      say_(fmt::format("Resumed from {} (step {}): {} in {:.2f} s, {:.2f} GB/s", r.path, start_step_,
                       megabytes(r.io.bytes), r.io.seconds, r.io.gb_per_s()));
      auto differs = [&](const char* key, const nlohmann::json& now, const char* flag) {
        if (ts.contains(key) && ts[key] != now) {
          warn_(fmt::format("the checkpoint was saved with {} {} (now {}): the data order from step {} on differs "
                            "from the saved run's", flag, ts[key].dump(), now.dump(), start_step_));
        }
      };
      differs("global_batch_size", global_batch_, "a global batch of");
      differs("seq_len", o_.data.seq_len, "--seq-len");
      differs("seed", o_.step.seed, "--seed");
      differs("shuffle", o_.data.shuffle, "shuffle =");
      differs("data", o_.data.path, "--data");
    } else {
      say_(fmt::format("no checkpoint in {} yet: starting from {}", o_.checkpoint.dir,
                       o_.hf.init_from.empty() ? "scratch" : o_.hf.init_from));
    }
  }
  if (!resumed_ && !o_.hf.init_from.empty()) {
    // With --sync-module-states rank 0 read the files before sharding.
    const checkpoint::HfImportResult r =
        o_.sharding.sync_module_states ? rank0_import_.value_or(checkpoint::HfImportResult{})
                                       : checkpoint::import_hf(o_.hf.init_from, *sharded_, cfg_, *scalars_, progress_);
    say_(fmt::format("Initialized from {} ({} file{}): {} in {:.2f} s, {:.2f} GB/s{}", o_.hf.init_from,
                     r.files.size(), r.files.size() == 1 ? "" : "s", megabytes(r.io.bytes), r.io.seconds,
                     r.io.gb_per_s(),
                     r.ignored.empty() ? "" : fmt::format(" (ignored: {})", fmt::join(r.ignored, ", "))));
  }
  if (!resumed_ && !o_.lora.init_adapter.empty()) {
    // With --sync-module-states rank 0 read it before sharding.
    if (!o_.sharding.sync_module_states) checkpoint::import_peft_adapter(o_.lora.init_adapter, *sharded_);
    say_(fmt::format("LoRA adapters from {}", o_.lora.init_adapter));
  }
  FSDP_CHECK(!o_.eval.only || resumed_ || !o_.hf.init_from.empty(), "--eval-only --resume: there is no checkpoint "
             "in ", o_.checkpoint.dir, " to evaluate; give --init-from DIR or a --checkpoint-dir that holds one");
  open_records();
  step_ = start_step_;
  saved_at_ = resumed_ ? start_step_ : -1;
  summary_.start_step = start_step_;
  summary_.end_step = start_step_;
  restored_ = true;
}

// --- what rank 0 records: metrics, TensorBoard, the effective configuration
void Trainer::Impl::open_records() {
  if (lead_ && !o_.log.metrics_file.empty()) {
    if (o_.checkpoint.resume && !o_.eval.only) {
      if (const int64_t n = drop_metrics_from(o_.log.metrics_file, start_step_); n > 0) {
        say_(fmt::format("dropped {} record{} of steps >= {} from {}: the resumed run trains those steps again", n,
                         n == 1 ? "" : "s", start_step_, o_.log.metrics_file));
      }
    }
    metrics_.open(o_.log.metrics_file, std::ios::app);
    FSDP_CHECK(metrics_.good(), "--metrics-file ", o_.log.metrics_file, ": cannot open for appending");
    if (!o_.log.config_text.empty()) {
      write_file_atomically(config_path_beside(o_.log.metrics_file), o_.log.config_text, "--metrics-file");
    }
  }
  if (lead_ && !o_.log.tensorboard_dir.empty()) {
    board_ = std::make_unique<TensorBoardWriter>(o_.log.tensorboard_dir, o_.checkpoint.resume ? start_step_ : -1);
    if (!o_.log.config_text.empty()) {
      write_file_atomically((std::filesystem::path(o_.log.tensorboard_dir) / "config.toml").string(),
                            o_.log.config_text, "--tensorboard");
    }
  }
}

// A record that cannot be written fails the run: metrics are results.
void Trainer::Impl::write_metrics(const nlohmann::json& j) {
  errno = 0;
  metrics_ << j.dump() << "\n" << std::flush;
  if (!metrics_) {
    FSDP_FAIL("--metrics-file ", o_.log.metrics_file, ": writing failed (",
              errno != 0 ? std::strerror(errno) : "stream error", "); free space on its disk or choose another file");
  }
}

// --- evaluation: exact mean over every target of the windows (sampler.h, EvalWindows)
EvalRecord Trainer::Impl::evaluate(int64_t max_windows) {
  require_restored("evaluate");
  FSDP_CHECK(val_dataset_ != nullptr, "Trainer::evaluate needs eval.val_data (--val-data PATH)");
  const int64_t completed = step_;
  trace::Span span("eval", "eval", -1, {}, completed);
  const auto t0 = Clock::now();
  data::EvalWindows windows(val_dataset_, o_.data.seq_len, W_, rank_, max_windows);
  at::NoGradGuard no_grad;
  // Evaluation mode (no LoRA dropout) until the end of this scope.
  struct EvalMode {
    torch::nn::Module& m;
    explicit EvalMode(torch::nn::Module& module) : m(module) { m.eval(); }
    ~EvalMode() { m.train(); }
  } eval_mode(*model_);
  double sum = 0.0;
  const int64_t batches = windows.num_batches(o_.step.batch_size);
  for (int64_t b = 0; b < batches; ++b) {
    const data::Batch batch = windows.batch(b, o_.step.batch_size);
    sum += (*root_)(batch.inputs.to(device_), batch.targets.to(device_), models::LossReduction::kSum).item<double>();
  }
  at::Tensor t = at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
  scalars_->all_reduce(t, comm::ReduceOp::kSum)->wait();
  EvalRecord rec;
  rec.step = completed;
  rec.targets = windows.total_targets();
  rec.loss = t.item<double>() / static_cast<double>(rec.targets);
  if (!std::isfinite(rec.loss)) {  // the same value on every rank: all fail together
    const char* value = std::isnan(rec.loss) ? "NaN" : rec.loss > 0 ? "inf" : "-inf";
    FSDP_FAIL("the evaluation loss is ", value, " at step ", completed,
              ": the weights or the --val-data produce NaN/inf",
              o_.eval.only ? "; check the weights being evaluated"
                           : "; lower --lr or raise --warmup-steps, or clip harder with --clip-grad");
  }
  say_(fmt::format("Eval Loss: {:.5f} (step {}, {} tokens, {:.2f} s)", rec.loss, completed, rec.targets,
                   seconds_since(t0)));
  if (metrics_.is_open()) {
    nlohmann::json j = {{"eval_loss", rec.loss}, {"eval_tokens", rec.targets}};
    if (!o_.eval.only) j["step"] = completed;
    write_metrics(j);
  }
  if (board_) board_->scalars(completed, {{"eval/loss", rec.loss}});
  summary_.evals.push_back(rec);
  sharded_->take_step_counters();  // evaluation's all-gathers are not a step's
  return rec;
}

nlohmann::json Trainer::Impl::trainer_state(int64_t completed) const {
  nlohmann::json ts{{"step", completed},
                    {"samples_seen", completed * global_batch_},
                    {"epochs", sampler_->epochs_after(completed)},
                    {"seed", o_.step.seed},
                    {"global_batch_size", global_batch_},
                    {"batch_size", o_.step.batch_size},
                    {"grad_accum", o_.step.grad_accum},
                    {"world_size", W_},
                    {"seq_len", o_.data.seq_len},
                    {"shuffle", o_.data.shuffle},
                    {"data", o_.data.path},
                    {"tokenizer", o_.data.tokenizer},
                    {"schedule",
                     {{"lr", sched_.lr},
                      {"min_lr", sched_.min_lr},
                      {"warmup_steps", sched_.warmup_steps},
                      {"max_steps", sched_.max_steps}}},
                    // Training draws no random numbers: parameters are initialized from (seed, name)
                    // and the data order is a pure function of (seed, step), so seed and step are the
                    // whole RNG state.
                    {"rng", "none consumed: seed and step determine initialization and data order"},
                    {"hf_export", hf_extras_}};
  if (scaler_) {
    ts["grad_scaler"] = {{"scale", scaler_->scale_value()},
                         {"growth_tracker", scaler_->growth_tracker()},
                         {"skipped_steps", scaler_->skipped_steps()}};
  }
  return ts;
}

std::string Trainer::Impl::save() {
  require_restored("save");
  FSDP_CHECK(!o_.checkpoint.dir.empty(), "Trainer::save needs checkpoint.dir (--checkpoint-dir DIR)");
  const int64_t completed = step_;
  trace::Span span("checkpoint save", "checkpoint", -1, {}, completed);
  checkpoint::SaveOptions so;
  so.keep_last = o_.checkpoint.keep_last;
  so.progress = progress_;
  const checkpoint::SaveResult r = checkpoint::save_checkpoint(o_.checkpoint.dir, completed, *sharded_, opt_.get(),
                                                               model_config_, trainer_state(completed), *scalars_, so);
  say_(fmt::format("Saved checkpoint {} in {:.2f} s: {}, {:.2f} GB/s ({})", checkpoint::checkpoint_name(completed),
                   r.io.seconds, megabytes(r.io.bytes), r.io.gb_per_s(), o_.checkpoint.dir));
  for (const auto& p : r.pruned) {
    say_(fmt::format("removed old checkpoint {} (--keep-last {})", p, o_.checkpoint.keep_last));
  }
  summary_.last_checkpoint = r.path;
  saved_at_ = completed;
  return r.path;
}

void Trainer::Impl::export_hf() {
  require_restored("export_hf");
  FSDP_CHECK(!o_.hf.export_dir.empty(), "Trainer::export_hf needs hf.export_dir (--export-hf DIR)");
  // Special token ids (README, Hugging Face): with --init-from, its
  // config.json's (cfg_ carries them, see init_config); otherwise the
  // tokenizer the model was trained with, null where it has none. Files:
  // Note [Export extras].
  export_and_report(o_, *sharded_, cfg_, *scalars_, hf_extras_, progress_, say_, warn_);
}

// The data loader and the step counters start here, not in restore(): an
// --eval-only run reads no training batches, and a resume's loading and the
// first evaluation are not a step.
void Trainer::Impl::begin_training() {
  data::LoaderOptions lopt;
  lopt.queue_depth = o_.data.prefetch;
  loader_ = std::make_unique<data::BackgroundLoader>(sampler_, /*start_step=*/step_, lopt);
  sharded_->take_step_counters();
  sharded_->reset_unsharded_peak();
  // The device's peak from the first step on, as the benchmark's peers count
  // it (the CPU's figure, the resident set, stays the process's peak).
  if (device_.is_cuda()) reset_peak_memory(device_);
  interval_start_ = Clock::now();
  interval_steps_ = 0;
}

// Forward and backward of every micro-batch (gradient synchronization on the
// last only); returns this rank's loss summed over them, each divided by
// grad_accum, i.e. its mean: a (1) float64 tensor on the device, not read
// here (no host synchronization inside the step; summed in float64 as the
// host sum it replaces, the same bits).
at::Tensor Trainer::Impl::forward_backward() {
  at::Tensor local;
  for (int64_t a = 0; a < o_.step.grad_accum; ++a) {
    data::Batch batch;
    {
      trace::Span span("data", "data");
      batch = loader_->next();
    }
    sharded_->set_requires_gradient_sync(a == o_.step.grad_accum - 1);
    if (o_.lora.dropout > 0) {
      // Masks keyed by (seed, step, micro-batch, rank): a recompute draws the same, a resumed run too.
      const auto micro = static_cast<uint64_t>((step_ * o_.step.grad_accum + a) * W_ + rank_);
      models::set_lora_dropout_key(*model_, splitmix64(o_.step.seed ^ splitmix64(micro)));
    }
    // To a CUDA device through page-locked memory, without waiting: a copy
    // from pageable memory would wait for the device.
    const auto to_device = [&](const at::Tensor& t) {
      return device_.is_cuda() ? t.pin_memory().to(device_, /*non_blocking=*/true) : t.to(device_);
    };
    at::Tensor loss =
        (*root_)(to_device(batch.inputs), to_device(batch.targets)) / static_cast<double>(o_.step.grad_accum);
    (scaler_ ? scaler_->scale(loss) : loss).backward();
    const at::Tensor l = loss.detach().to(at::kDouble).reshape({1});
    local = local.defined() ? local + l : l;
  }
  return local;
}

StepRecord Trainer::Impl::train_step() {
  require_restored("train_step");
  FSDP_CHECK(!o_.eval.only, "Trainer::train_step: eval.only evaluates and trains nothing");
  FSDP_CHECK(step_ < o_.step.max_steps, "Trainer::train_step: ", step_, " steps are done, step.max_steps is ",
             o_.step.max_steps, "; the schedule ends there");
  if (!loader_) begin_training();
  const int64_t step = step_;
  const auto t0 = Clock::now();
  const int64_t step_begin_us = trace::enabled() ? trace::now_us() : -1;
  const double lr = sched_.at(step);
  opt_->set_lr(lr);
  sharded_->zero_grad();
  const at::Tensor local_t = forward_backward();
  const double loss_scale = scaler_ ? scaler_->scale_value() : 0.0;
  at::Tensor norm_t;
  bool skipped = false;
  {
    trace::Span span("optimizer", "optim");
    skipped = scaler_ && scaler_->unscale(sharded_->shards());
    if (!skipped) {
      norm_t = o_.step.clip_grad > 0 ? sharded_->clip_grad_norm_tensor(o_.step.clip_grad)
                                     : sharded_->grad_norm_tensor();
      opt_->step();
    }
  }
  // The step's wait for the device: its loss and gradient norm, read once the
  // optimizer's kernels are queued (nothing inside the step waited).
  const double local = local_t.item<double>();
  const double norm = norm_t.defined() ? norm_t.item<double>() : 0.0;
  if (skipped) {
    warn_(fmt::format("step {}: inf/nan gradients at loss scale {}: step skipped on every rank", step, loss_scale));
  }
  if (scaler_) scaler_->update(skipped);

  // One all-reduce for the loss (sum, then / W: the same bits as an average)
  // and the stop flag (any rank's request stops every rank after this step).
  stop_local_ = o_.stop_requested ? o_.stop_requested() : 0;
  at::Tensor lt = at::tensor({local, static_cast<double>(stop_local_)}, at::TensorOptions().dtype(at::kDouble));
  {
    trace::Span span("loss all_reduce wait", "comm");
    scalars_->all_reduce(lt, comm::ReduceOp::kSum)->wait();
  }
  const double loss_sum = lt[0].item<double>();
  stop_ = lt[1].item<double>() > 0;
  StepRecord rec;
  rec.step = step;
  rec.loss = W_ > 1 ? loss_sum / static_cast<double>(W_) : loss_sum;
  rec.lr = lr;
  rec.grad_norm = norm;
  rec.loss_scale = loss_scale;
  rec.skipped = skipped;
  synchronize(device_);  // the optimizer's kernels belong to this step's time
  rec.step_time_s = seconds_since(t0);
  trace::record("step", "step", step_begin_us, trace::now_us(), -1, {}, step);
  rec.comm = sharded_->take_step_counters();
  rec.peak_mem_bytes = peak_memory_bytes(device_);
  const UnshardedMemory unsharded = sharded_->unsharded_memory();
  rec.unsharded_peak_bytes = unsharded.peak;
  rec.unsharded_bound_bytes = unsharded_bound_;
  check_unsharded_contract(step, unsharded);
  FSDP_CHECK(std::isfinite(rec.loss), "the loss became ", rec.loss, " at step ", step, " (lr ", lr,
             "); lower --lr or raise --warmup-steps, or clip harder with --clip-grad");
  ++interval_steps_;
  if ((step % o_.log.log_every == 0) || step == o_.step.max_steps - 1 || stop_) log_step(rec);
  summary_.steps.push_back(rec);
  step_ = step + 1;
  summary_.end_step = step_;
  return rec;
}

// The plan's bound is a contract (tests/fsdp/test_memory_contract.cpp): say so when it fails.
void Trainer::Impl::check_unsharded_contract(int64_t step, const UnshardedMemory& unsharded) {
  if (unsharded.peak <= unsharded_bound_ || contract_broken_) return;
  contract_broken_ = true;
  warn_(fmt::format("step {}: the engine held {} of unsharded buffers at once ({} parameters, {} gradients, {} in "
                    "reductions, {} accumulated), more than the plan's bound {}; the run goes on, but memory "
                    "planning is wrong for this configuration — please report it with --print-config's output",
                    step, format_bytes(unsharded.peak), format_bytes(unsharded.at_peak.params),
                    format_bytes(unsharded.at_peak.grads), format_bytes(unsharded.at_peak.reductions),
                    format_bytes(unsharded.at_peak.accumulated), format_bytes(unsharded_bound_)));
}

// The step line, the metrics record and the TensorBoard scalars of a logged
// step; fills in rec's rates over the steps since the previous logged one.
void Trainer::Impl::log_step(StepRecord& rec) {
  const int64_t step = rec.step;
  const double dt = seconds_since(interval_start_);
  seconds_per_step_ = dt / static_cast<double>(interval_steps_);
  rec.samples_per_s = static_cast<double>(global_batch_ * interval_steps_) / dt;
  rec.tokens_per_s = rec.samples_per_s * static_cast<double>(o_.data.seq_len);
  const double mfu = device_peak_flops_ > 0
                         ? rec.tokens_per_s / static_cast<double>(W_) * flops_per_token_ / device_peak_flops_
                         : -1;
  // The familiar prefix first (scripts grep it), then what people watch.
  say_(fmt::format("Batch {} Loss: {:.5f}, Speed: {:.2f} samples/sec, lr: {:.6f} | step {}/{}, {:.0f} tokens/s{}, "
                   "grad norm {:.4g}{}, peak mem {}, unsharded {} (plan {}), ETA {}",
                   step, rec.loss, rec.samples_per_s, rec.lr, step + 1, o_.step.max_steps, rec.tokens_per_s,
                   mfu >= 0 ? fmt::format(", MFU {:.1f}%", 100 * mfu) : std::string(), rec.grad_norm,
                   scaler_ ? fmt::format(", loss scale {:g}{}", rec.loss_scale, rec.skipped ? " (skipped)" : "") : "",
                   rec.peak_mem_bytes >= 0 ? format_bytes(rec.peak_mem_bytes) : std::string("?"),
                   format_bytes(rec.unsharded_peak_bytes), format_bytes(unsharded_bound_),
                   duration_text(seconds_per_step_ * static_cast<double>(o_.step.max_steps - step - 1))));
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", step},
                        {"loss", rec.loss},
                        {"lr", rec.lr},
                        {"grad_norm", rec.grad_norm},
                        {"samples_per_s", rec.samples_per_s},
                        {"tokens_per_s", rec.tokens_per_s},
                        {"step_time_s", rec.step_time_s},
                        {"peak_mem_bytes", rec.peak_mem_bytes},
                        {"unsharded_peak_bytes", rec.unsharded_peak_bytes},
                        {"unsharded_bound_bytes", rec.unsharded_bound_bytes},
                        {"allgather_bytes", rec.comm.allgather_bytes},
                        {"reduce_scatter_bytes", rec.comm.reduce_scatter_bytes},
                        {"allreduce_bytes", rec.comm.allreduce_bytes},
                        {"world_size", W_}};
    if (mfu >= 0) j["mfu"] = mfu;
    if (scaler_) {
      j["loss_scale"] = rec.loss_scale;
      j["skipped"] = rec.skipped;
    }
    write_metrics(j);
  }
  if (board_) {
    board_->scalars(step, {{"train/loss", rec.loss},
                           {"train/lr", rec.lr},
                           {"train/grad_norm", rec.grad_norm},
                           {"train/samples_per_s", rec.samples_per_s},
                           {"train/tokens_per_s", rec.tokens_per_s},
                           {"train/step_time_s", rec.step_time_s},
                           {"train/peak_mem_bytes", static_cast<double>(rec.peak_mem_bytes)},
                           {"train/unsharded_peak_bytes", static_cast<double>(rec.unsharded_peak_bytes)}});
  }
  interval_start_ = Clock::now();
  interval_steps_ = 0;
  sharded_->reset_unsharded_peak();  // the next logged figure covers the steps after this one
}

// Note [Traced steps]
// --profile-steps A:B traces steps A..B-1 on every rank (common/trace.h):
// the training thread's spans (step, data wait, each unit's forward and
// backward, gradient-free recomputation, the issue and the wait of each
// unit's all-gather and reduce-scatter, the optimizer, evaluation and
// checkpoint saves) and each collective lane's own spans, with bytes. The
// lanes run the collectives beside compute, so what a step waited for is
// the union of the training thread's "comm" spans: the exposed
// communication of the summary line. After step B-1 (or the last step run)
// the ranks' events are gathered to rank 0, which writes one file with one
// track group per rank (pid = rank).
void Trainer::Impl::start_trace_if_due() {
  const bool profiling = o_.log.profile_end > o_.log.profile_begin;
  if (profiling && !tracing_ && step_ >= o_.log.profile_begin && step_ < o_.log.profile_end) {
    trace::start();
    tracing_ = true;
  }
}

void Trainer::Impl::finish_trace() {
  tracing_ = false;
  const std::vector<trace::Event> events = trace::stop();
  const std::vector<std::string> all =
      checkpoint::all_gather_strings(*scalars_, trace_events_json(events, rank_).dump());
  if (!lead_) return;
  for (const trace::Event& e : events) {
    if (e.cat == "step" && e.thread == trace::this_thread()) say_(profile_summary(events, e));
  }
  nlohmann::json merged = nlohmann::json::array();
  size_t spans = 0;
  for (const std::string& r : all) {
    for (auto& e : nlohmann::json::parse(r)) {
      spans += e["ph"] == "X" ? 1 : 0;
      merged.push_back(std::move(e));
    }
  }
  const nlohmann::json file = {
      {"traceEvents", std::move(merged)},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"producer", "fsdp-train"}, {"steps", fmt::format("{}:{}", o_.log.profile_begin,
                                                                        o_.log.profile_end)},
                     {"world_size", W_}, {"model", cfg_.name}}}};
  write_file_atomically(o_.log.profile_file, file.dump(), "--profile-file");
  summary_.trace_file = o_.log.profile_file;
  say_(fmt::format("Wrote trace of steps {}..{} ({} spans, {} rank{}) to {}: open it in ui.perfetto.dev or "
                   "chrome://tracing", std::max(o_.log.profile_begin, start_step_),
                   std::min(o_.log.profile_end, summary_.end_step) - 1, spans, W_, W_ == 1 ? "" : "s",
                   o_.log.profile_file));
}

// The reason every rank reports: the largest request (e.g. the signal number).
int Trainer::Impl::agree_stop_reason() {
  at::Tensor why = at::full({1}, static_cast<double>(stop_local_), at::TensorOptions().dtype(at::kDouble));
  scalars_->all_reduce(why, comm::ReduceOp::kMax)->wait();
  return std::max(1, static_cast<int>(why.item<double>()));
}

TrainSummary Trainer::Impl::run() {
  if (conversion_) return convert_checkpoint(o_, rt_);
  FSDP_CHECK(!restored_, "Trainer::run runs the whole training from the start; restore() was called already");
  restore();
  if (o_.eval.only) {
    evaluate(/*max_windows=*/0);
    if (!o_.hf.export_dir.empty()) export_hf();
    return summary_;
  }
  if (step_ >= o_.step.max_steps) {
    say_(fmt::format("the checkpoint is at step {}, --max-steps is {}: nothing to train", step_, o_.step.max_steps));
  }
  begin_training();
  const auto run_start = Clock::now();
  while (step_ < o_.step.max_steps) {
    start_trace_if_due();
    train_step();
    const int64_t completed = step_;
    const bool last = completed == o_.step.max_steps;
    // Evaluation and checkpoint time is left out of the next Speed figure.
    const auto extra_start = Clock::now();
    if (val_dataset_ && o_.eval.every > 0 && (completed % o_.eval.every == 0 || last)) {
      evaluate(o_.eval.max_windows);
    }
    if (!o_.checkpoint.dir.empty() &&
        ((o_.checkpoint.every > 0 && completed % o_.checkpoint.every == 0) || last || stop_)) {
      save();
    }
    interval_start_ += Clock::now() - extra_start;
    if (tracing_ && (completed >= o_.log.profile_end || last || stop_)) finish_trace();
    const double eta = seconds_per_step_ > 0 ? seconds_per_step_ * static_cast<double>(o_.step.max_steps - completed)
                                             : std::numeric_limits<double>::quiet_NaN();
    console_.progress(completed, o_.step.max_steps, eta);
    if (stop_) {
      summary_.stop_reason = agree_stop_reason();
      break;
    }
  }
  loader_->stop();
  if (summary_.stop_reason != 0) {
    say_(fmt::format("stopped by {} after {} steps: {}", signal_name(summary_.stop_reason), summary_.end_step,
                     o_.checkpoint.dir.empty()
                         ? "no --checkpoint-dir, so the training state was NOT saved"
                         : fmt::format("checkpoint {} saved; continue with --resume --checkpoint-dir {}",
                                       checkpoint::checkpoint_name(summary_.end_step), o_.checkpoint.dir)));
  } else {
    if (!o_.checkpoint.dir.empty() && saved_at_ != summary_.end_step) save();  // resumed at the end
    if (!o_.hf.export_dir.empty()) export_hf();
  }
  say_(run_summary(o_, summary_, global_batch_, seconds_since(run_start)));
  return summary_;
}

Trainer::Trainer(TrainOptions options, comm::Runtime runtime)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(runtime))) {}
Trainer::~Trainer() = default;
void Trainer::restore() { impl_->restore(); }
StepRecord Trainer::train_step() { return impl_->train_step(); }
EvalRecord Trainer::evaluate(int64_t max_windows) { return impl_->evaluate(max_windows); }
std::string Trainer::save() { return impl_->save(); }
void Trainer::export_hf() { impl_->export_hf(); }
TrainSummary Trainer::run() { return impl_->run(); }
int64_t Trainer::step() const { return impl_->step(); }
bool Trainer::stop_requested() const { return impl_->stop_requested(); }
const TrainSummary& Trainer::summary() const { return impl_->summary(); }

TrainSummary train(const TrainOptions& options, const comm::Runtime& runtime) {
  return Trainer(options, runtime).run();
}

}  // namespace fsdp::train

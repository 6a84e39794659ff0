// fsdp-inspect: the sharding plan of a model without running it — units,
// flat-parameter sizes and padding, and per-rank memory — for any preset or
// Hugging Face config.json, 70B ones included (built on the meta device: no
// parameter memory is allocated and no process group is needed).
//
//   fsdp-inspect --model llama3.1-70b --world-size 64 --sharding full --mixed-precision bf16
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "cli_numbers.h"
#include "option_names.h"
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/common/memory.h"
#include "fsdp/common/output_file.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora.h"
#include "fsdp/models/registry.h"
#include "fsdp/nn/freeze.h"

namespace {

int run(int argc, char** argv) {
  std::string model = "tiny";
  int world_size = 8;
  int rank = 0;
  std::string sharding = "full";
  std::string wrap = "block";
  int hybrid = 0;
  std::string precision = "fp32";
  int limit = 2;
  bool offload = false;
  bool units = false;
  bool ckpt = false;
  std::string hf_config_out;
  std::string freeze;
  int64_t lora_rank = 0;
  std::string lora_targets = "q_proj,k_proj,v_proj,o_proj";

  CLI::App app{"fsdp-inspect: the FSDP sharding plan and per-rank memory of a model, without running it."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", model, "Preset, Hugging Face config.json, or a directory holding one")
      ->capture_default_str();
  app.add_option("--world-size", world_size, "Data-parallel processes")->capture_default_str();
  app.add_option("--rank", rank, "Rank whose shard offsets to show")->capture_default_str();
  app.add_option("--sharding", sharding, "full | grad-op | none | hybrid")->capture_default_str();
  app.add_option("--wrap", wrap, "block | size:N | root | all")->capture_default_str();
  app.add_option("--hybrid-shard-size", hybrid, "HYBRID: ranks per shard group")->capture_default_str();
  app.add_option("--mixed-precision", precision, "fp32 | bf16 | fp16 | bf16-pure")->capture_default_str();
  app.add_option("--limit-all-gathers", limit, "All-gathers issued ahead of use")->capture_default_str();
  app.add_flag("--cpu-offload", offload, "Shards and optimizer state in host memory");
  app.add_flag("--activation-checkpointing", ckpt, "Checkpoint every decoder layer");
  app.add_flag("--units", units, "List every unit");
  app.add_option("--freeze", freeze, "Plan with the parameters whose name this regex finds frozen (as fsdp-train)");
  app.add_option("--lora-rank", lora_rank, "Plan with LoRA adapters of this rank, the base frozen (0: none)");
  app.add_option("--lora-targets", lora_targets, "Linear layers that get adapters (comma-separated)")
      ->capture_default_str();
  app.add_option("--write-hf-config", hf_config_out,
                 "Also write the model's Hugging Face config.json to this file (e.g. for a transformers baseline)");
  fsdp::cli::strict_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "fsdp-inspect: error: " << e.what() << " (see fsdp-inspect --help)\n";
    return fsdp::kExitUsage;
  }

  FSDP_CHECK(world_size >= 1, "--world-size must be >= 1 (the number of processes), got ", world_size);
  FSDP_CHECK(rank >= 0 && rank < world_size, "--rank ", rank, " is outside [0, --world-size ", world_size,
             ") — give a rank below the world size");
  FSDP_CHECK(hybrid >= 0, "--hybrid-shard-size must be >= 1 (or 0: the world size), got ", hybrid);
  const fsdp::models::LlamaConfig cfg = fsdp::models::resolve_model_config(model);
  // Note [Output targets]: a device or FIFO is written in place, a regular file replaced atomically.
  if (!hf_config_out.empty()) fsdp::write_output_file(hf_config_out, cfg.to_hf_config_json() + "\n", "--write-hf-config");
  auto impl =
      std::make_shared<fsdp::models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  int64_t lora_params = 0;
  if (lora_rank != 0) {
    fsdp::models::LoraConfig lc;
    lc.rank = lora_rank;
    lc.alpha = 2.0 * static_cast<double>(lora_rank);
    lc.targets = fsdp::models::parse_lora_targets(lora_targets);
    fsdp::models::apply_lora(*impl, lc, 0);
    for (const auto& p : impl->named_parameters(true)) {
      if (fsdp::models::is_lora_parameter(p.key())) lora_params += p.value().numel();
    }
  }
  if (!freeze.empty()) fsdp::nn::freeze_matching(*impl, freeze);  // after LoRA, as fsdp-train
  fsdp::nn::Unit<fsdp::models::LlamaForCausalLMImpl> root(impl);
  fsdp::FsdpOptions o;
  o.strategy = fsdp::parse_sharding_strategy(sharding);
  o.wrap = fsdp::parse_wrap_policy(wrap, fsdp::models::llama_block_type());
  // As fsdp-train: "block" also makes the embedding and the head units.
  if (o.wrap.kind == fsdp::WrapPolicy::Kind::kByType) o.wrap.types = fsdp::models::llama_unit_types();
  o.hybrid_shard_size = hybrid > 0 ? hybrid : world_size;
  o.mixed_precision = fsdp::MixedPrecision::preset(precision);
  o.limit_all_gathers = limit;
  o.cpu_offload = offload;
  if (ckpt) o.checkpoint_types = {fsdp::models::llama_block_type()};
  fsdp::check_options(o, world_size);
  const bool pure = precision == "bf16-pure";
  const fsdp::ShardingPlan plan =
      fsdp::plan_sharding(root.ptr(), world_size, rank, o, pure ? at::kBFloat16 : at::kFloat);

  std::cout << cfg.summary() << "\n"
            << fmt::format("{} over {} ranks, wrap {}, {} (param {}, reduce {}, master {}){}\n",
                           fsdp::to_string(o.strategy), world_size, wrap, precision,
                           c10::toString(o.mixed_precision.param_dtype), c10::toString(o.mixed_precision.reduce_dtype),
                           c10::toString(o.mixed_precision.master_dtype), offload ? ", CPU offload" : "")
            << plan.describe();
  if (lora_rank != 0) {
    std::cout << fmt::format("  LoRA rank {} on {}: {} adapter parameters ({:.3f}% of the model's {})\n", lora_rank,
                             lora_targets, lora_params, 100.0 * static_cast<double>(lora_params) /
                                 static_cast<double>(cfg.num_parameters()), cfg.num_parameters());
  }
  if (cfg.moe()) {
    // Every rank holds 1/shard of every expert; a decoder layer gathers all E of
    // them, and each token computes with K.
    std::cout << fmt::format("  mixture of experts: {} experts per layer, {} per token: {} parameters, {} active per "
                             "token ({:.1f}%); per rank {} of them in shards\n",
                             cfg.num_local_experts, cfg.num_experts_per_tok, cfg.num_parameters(),
                             cfg.active_parameters(),
                             100.0 * static_cast<double>(cfg.active_parameters()) /
                                 static_cast<double>(cfg.num_parameters()),
                             (cfg.num_parameters() + plan.shard_size - 1) / plan.shard_size);
  }
  const int64_t resident = plan.param_shard_bytes + plan.grad_shard_bytes + plan.optimizer_bytes;
  std::cout << fmt::format("  total per rank without activations: {} ({} resident{} + {} during a step)\n",
                           fsdp::format_bytes(resident + plan.step_unsharded_bytes), fsdp::format_bytes(resident),
                           offload ? " in host memory" : "", fsdp::format_bytes(plan.step_unsharded_bytes));
  // The loss never holds a micro-batch's whole logits (models/chunked_loss.h):
  // what it takes does not grow with the batch beyond one chunk.
  const int64_t loss_rows = fsdp::models::default_loss_chunk_rows(cfg.vocab_size);
  std::cout << fmt::format("  loss: {} tokens per chunk of logits: at most {} during a step (one chunk's logits "
                           "and their gradient, the output head's gradient)\n",
                           loss_rows,
                           fsdp::format_bytes(fsdp::models::chunked_loss_bytes(loss_rows, cfg.vocab_size,
                                                                               cfg.hidden_size,
                                                                               o.mixed_precision.param_dtype)));
  // fsdp-inspect plans for any machine (a 70B model over 64 GPUs elsewhere), so a
  // plan beyond this machine is no error; fsdp-train refuses such a run.
  const int64_t here = fsdp::available_host_memory_bytes();
  if (!offload && here >= 0 && resident + plan.step_unsharded_bytes > here) {
    std::cerr << fmt::format("fsdp-inspect: note: one rank needs {} without activations, more than the {} of host "
                             "memory available here (fine when planning for GPUs or other machines; fsdp-train "
                             "--device cpu refuses such a run on this machine)\n",
                             fsdp::format_bytes(resident + plan.step_unsharded_bytes), fsdp::format_bytes(here));
  }
  if (units) {
    for (const auto& u : plan.units) {
      std::cout << fmt::format("  unit {:<24} {:>4} params {:>14} elements  padded {:>14}  shard {:>12} at {}{}{}\n",
                               u.name.empty() ? "<root>" : u.name, u.params.size(), u.numel, u.padded_numel,
                               u.shard_numel, u.shard_offset, u.checkpointed ? "  checkpointed" : "",
                               u.trainable ? "" : "  frozen");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fsdp::run_main("fsdp-inspect", [&] { return fsdp::cli::with_flag_names([&] { return run(argc, argv); }); });
}

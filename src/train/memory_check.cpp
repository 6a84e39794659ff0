// check_memory: whether a run fits this machine, before anything is allocated.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "fsdp/common/device.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/models/chunked_loss.h"
#include "train/checks.h"
#include "train/model_build.h"

namespace fsdp::train {

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
  if (o.mode == Mode::kConvert) return 0;  // a conversion holds one unit at a time
  return check_memory(o, world_size, local_world_size, this_rank, resolve_model_config(o));
}

int64_t check_memory(const TrainOptions& o, int world_size, int local_world_size,
                     std::optional<c10::Device> this_rank, const ModelConfigPtr& config) {
  const ModelConfig& cfg = *config;
  if (o.mode == Mode::kConvert) return 0;
  const bool eval_only = o.mode == Mode::kEvaluate;
  // A frozen base (LoRA, --freeze) has no gradient or optimizer state.
  const BuiltModel m = build_model(o.step, o.lora, o.freeze, o.param_groups, config, BuildOptions{});
  FsdpOptions fo = engine_options(o, &cfg, world_size);
  if (fo.hybrid_shard_size == 0) fo.hybrid_shard_size = local_world_size;
  const bool pure = fo.mixed_precision.master_dtype == at::kBFloat16;
  const ShardingPlan plan = plan_sharding(m.root, world_size, 0, fo, pure ? at::kBFloat16 : at::kFloat);
  // The sizes are bounded (the configs' limits, validate_options' products), except
  // what grows with a micro-batch: B x T x (elements per token) of the compute dtype.
  const int64_t elem = static_cast<int64_t>(c10::elementSize(fo.mixed_precision.param_dtype));
  const int64_t kHuge = std::numeric_limits<int64_t>::max() / 4;  // "more than any machine": no overflow below
  // A row's tokens: --seq-len, or an encoder-decoder's wider --target-len (the decoder's width).
  const bool wider_target = cfg.data_kind() == DataKind::kPairs && o.data.target_len > o.data.seq_len;
  const int64_t width = wider_target ? o.data.target_len : o.data.seq_len;
  const char* width_flag = wider_target ? "DataOptions::target_len" : "DataOptions::seq_len";
  const auto bytes_per_micro_batch = [&](int64_t elements_per_token) {
    const std::optional<int64_t> b = checked_product({o.step.batch_size, width, elements_per_token, elem});
    return std::min(b.value_or(kHuge), kHuge);
  };
  // The loss holds one chunk of logits at a time (models/chunked_loss.h).
  const int64_t loss_rows = models::loss_chunk_rows(o.step.loss_chunk_rows, cfg.vocab_size(), o.device.type());
  const std::optional<int64_t> tokens = checked_product({o.step.batch_size, width});
  const int64_t logit_bytes =
      std::min(models::chunked_loss_bytes(std::min(tokens.value_or(kHuge), loss_rows), cfg.vocab_size(),
                                          cfg.hidden_size(), fo.mixed_precision.param_dtype, o.step.kernels),
               kHuge);
  // Activations kept for backward, a lower bound per token (the family's count).
  const int64_t per_token = cfg.activation_elements_per_token(o.activation_checkpointing, eval_only);
  // What the checkpoint policy keeps beyond the layers' inputs (--ac-policy selective), in bytes per token.
  const int64_t kept_per_token =
      o.activation_checkpointing && !eval_only
          ? cfg.checkpoint_kept_bytes_per_token(o.fsdp.checkpoint_policy, fo.mixed_precision.param_dtype,
                                                o.device.type(), o.data.seq_len)
          : 0;
  const std::optional<int64_t> kept = checked_product({o.step.batch_size, o.data.seq_len, kept_per_token});
  const int64_t activation_bytes = std::min(bytes_per_micro_batch(per_token) + std::min(kept.value_or(kHuge), kHuge),
                                            kHuge);
  const int64_t shards = plan.param_shard_bytes + (eval_only ? 0 : plan.grad_shard_bytes + plan.optimizer_bytes);
  const int64_t unsharded = plan.unsharded_bound(o.step.grad_accum);
  const int64_t step = unsharded + logit_bytes + activation_bytes;
  const bool on_device = this_rank && this_rank->is_cuda();
  const bool cuda_run = o.device.is_cuda();
  // Host: everything on CPU runs; the offloaded shards with --cpu-offload on CUDA.
  const int64_t host = cuda_run ? (o.fsdp.cpu_offload ? shards : 0) : shards + step;
  const std::string parts = fmt::format(
      "parameter and gradient shards {}, optimizer state {}, unsharded units during a step {}, the loss's logits "
      "of one micro-batch {} (chunks of {} of its StepOptions::batch_size {} x {} {} tokens x vocab_size {}), "
      "activations {}",
      format_bytes(plan.param_shard_bytes + (eval_only ? 0 : plan.grad_shard_bytes)),
      format_bytes(eval_only ? 0 : plan.optimizer_bytes), format_bytes(unsharded), format_bytes(logit_bytes),
      loss_rows, o.step.batch_size, width_flag, width, cfg.vocab_size(), format_bytes(activation_bytes));
  const std::string fix = fmt::format("reduce StepOptions::batch_size or {}, add "
                                      "TrainOptions::activation_checkpointing, shard over more processes or "
                                      "machines, use FsdpOptions::cpu_offload, bf16 (FsdpOptions::mixed_precision) or a "
                                      "smaller model", width_flag);
  const int ranks = this_rank ? 1 : std::max(local_world_size, 1);
  if (host > 0) {
    const int64_t available = available_host_memory_bytes();
    const std::optional<int64_t> need = checked_mul(host, ranks);
    FSDP_CHECK(available < 0 || (need && *need <= available), "model '", cfg.name(), "' needs at least ",
               format_bytes(host), " of host memory per process (", parts, ")",
               ranks > 1 ? fmt::format(" x {} processes on this machine = {}", ranks,
                                       need ? format_bytes(*need) : std::string("beyond 64-bit integers"))
                         : std::string(),
               ", but this process has ", available_host_memory_text(), " — ", fix);
  }
  if (on_device) {
    const int64_t device_need = (o.fsdp.cpu_offload ? 0 : shards) + step;
    const int64_t free = free_memory_bytes(*this_rank);
    FSDP_CHECK(free < 0 || device_need <= free, "model '", cfg.name(), "' needs at least ", format_bytes(device_need),
               " on ", this_rank->str(), " (", parts, "), but it has ", format_bytes(free), " free — ", fix);
  }
  return unsharded;
}

}  // namespace fsdp::train

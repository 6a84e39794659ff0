// fsdp-train's spelling of the trainer's choices, and their translation into
// train::TrainOptions' typed fields. The library takes types (ShardingStrategy,
// MixedPrecision, at::ScalarType, ...); the words of the command line and of
// --config files belong here, with the messages that refuse the others.
//
// Every parse_* throws fsdp::UsageError naming the flag (or the value) and the
// accepted values; fsdp-train reports it with exit code 2 before any worker
// starts.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/train/options.h"

namespace fsdp::cli {

// The choices as given on the command line (or in --config), with
// fsdp-train's defaults; CLI11 binds its options to these, so --print-config
// shows the words the user wrote.
struct TrainFlags {
  std::string device = "cpu";                // --device
  std::string sharding = "full";             // --sharding
  std::string reshard_after_forward = "default";  // --reshard-after-forward
  std::string wrap = "block";                // --wrap
  std::string mixed_precision = "fp32";      // --mixed-precision
  std::string reduce_dtype;                  // --reduce-dtype; "": the preset's
  std::string all_gather_wire = "native";    // --all-gather-wire
  std::string reduce_scatter_wire = "native";  // --reduce-scatter-wire
  std::string backward_prefetch = "pre";     // --backward-prefetch
  std::string ac_policy = "tail";            // --ac-policy
  std::string kernels = "reference";         // --kernels
  std::string loss_scaling = "auto";         // --loss-scaling
  std::string export_dtype = "float32";      // --export-dtype
  std::string export_shard_size = "5GB";     // --export-shard-size
  std::string checkpoint_staging_limit = "16GiB";  // --checkpoint-staging-limit
  std::string lora_targets = "q_proj,k_proj,v_proj,o_proj";  // --lora-targets (models::parse_lora_targets)
  std::vector<std::string> lr_scales;        // --lr-scale REGEX=FACTOR, repeatable
};

// "cpu" | "cuda".
at::DeviceType parse_device(const std::string& s);
// "full" | "grad-op" | "none" | "hybrid", or PyTorch's FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD.
ShardingStrategy parse_sharding(const std::string& s);
// "block" | "size:N" (N >= 1) | "root" | "all".
train::WrapChoice parse_wrap(const std::string& s);
// The --mixed-precision preset ("fp32" | "bf16" | "fp16" | "bf16-pure", see
// MixedPrecision), its reduce dtype replaced by --reduce-dtype ("fp32" |
// "bf16" | "fp16") when that is not "".
MixedPrecision parse_mixed_precision(const std::string& preset, const std::string& reduce_dtype);
// "pre" | "post" | "none" (or BACKWARD_PRE, BACKWARD_POST).
BackwardPrefetch parse_backward_prefetch(const std::string& s);
// "auto" | "on" | "off".
train::LossScaling parse_loss_scaling(const std::string& s);
// "float32" | "bfloat16" | "float16" (or fp32, bf16, fp16).
at::ScalarType parse_export_dtype(const std::string& s);
// "5GB" (10^9), "500MB", "2GiB" (2^30), "1234" (bytes); "0": one file.
int64_t parse_export_shard_size(const std::string& s);

// "REGEX=FACTOR" -> {REGEX, FACTOR} (the last '=' splits). UsageError when
// there is no '=', an empty pattern, or a factor that is not a number > 0.
std::pair<std::string, double> parse_lr_scale(const std::string& s);

// Sets o.device and o.sharding's typed fields from `flags`: what a plan of the
// run needs (fsdp-inspect), a part of apply_train_flags.
void apply_sharding_flags(const TrainFlags& flags, train::TrainOptions& o);

// Sets the typed fields of `o` from `flags`. --export-shard-size is read only
// with --export-hf (o.hf.export_dir set), the only runs that use it;
// --checkpoint-staging-limit only with --async-checkpoint. With
// --init-adapter and no --lora-alpha, o.lora.alpha becomes the adapter's.
void apply_train_flags(const TrainFlags& flags, train::TrainOptions& o);

}  // namespace fsdp::cli

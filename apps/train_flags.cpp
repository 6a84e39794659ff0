#include "train_flags.h"

#include <cmath>
#include <typeindex>
#include <typeinfo>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/checkpoint/peft.h"
#include "fsdp/common/error.h"
#include "fsdp/common/memory.h"
#include "fsdp/models/lora.h"
#include "option_names.h"

namespace fsdp::cli {

at::DeviceType parse_device(const std::string& s) {
  if (s == "cpu") return at::kCPU;
  if (s == "cuda") return at::kCUDA;
  FSDP_CHECK(false, "--device '", s, "' is not one of: cpu, cuda");
  return at::kCPU;
}

ShardingStrategy parse_sharding(const std::string& s) { return parse_sharding_strategy(s); }

train::WrapChoice parse_wrap(const std::string& s) {
  // The engine's parser (its words and messages), with a stand-in block type:
  // the trainer fills in its model's.
  using Kind = train::WrapChoice::Kind;
  WrapPolicy p;
  with_flag_names([&] {
    p = parse_wrap_policy(s, std::type_index(typeid(void)));
    return 0;
  });
  switch (p.kind) {
    case WrapPolicy::Kind::kByType: return {Kind::kBlock, 0};
    case WrapPolicy::Kind::kSize: return {Kind::kSize, p.min_num_params};
    case WrapPolicy::Kind::kRootOnly: return {Kind::kRoot, 0};
    case WrapPolicy::Kind::kEveryUnit: return {Kind::kAll, 0};
  }
  return {};
}

MixedPrecision parse_mixed_precision(const std::string& preset, const std::string& reduce_dtype) {
  MixedPrecision mp = MixedPrecision::preset(preset);
  if (reduce_dtype.empty()) return mp;
  if (reduce_dtype == "fp32") {
    mp.reduce_dtype = at::kFloat;
  } else if (reduce_dtype == "bf16") {
    mp.reduce_dtype = at::kBFloat16;
  } else if (reduce_dtype == "fp16") {
    mp.reduce_dtype = at::kHalf;
  } else {
    FSDP_CHECK(false, "--reduce-dtype '", reduce_dtype, "' is not one of: fp32, bf16, fp16");
  }
  return mp;
}

BackwardPrefetch parse_backward_prefetch(const std::string& s) { return fsdp::parse_backward_prefetch(s); }

train::LossScaling parse_loss_scaling(const std::string& s) {
  if (s == "auto") return train::LossScaling::kAuto;
  if (s == "on") return train::LossScaling::kOn;
  if (s == "off") return train::LossScaling::kOff;
  FSDP_CHECK(false, "--loss-scaling '", s, "' is not one of: auto, on, off");
  return train::LossScaling::kAuto;
}

at::ScalarType parse_export_dtype(const std::string& s) { return checkpoint::parse_export_dtype(s); }

int64_t parse_export_shard_size(const std::string& s) {
  return parse_byte_size(s, "--export-shard-size", "one file");
}

std::pair<std::string, double> parse_lr_scale(const std::string& s) {
  const size_t eq = s.rfind('=');
  FSDP_CHECK(eq != std::string::npos && eq > 0, "--lr-scale '", s, "' must be REGEX=FACTOR, e.g. 'lora_B=4' or "
             "'embed_tokens=0.1' (parameters whose name the regex finds train at FACTOR x --lr)");
  const std::string factor = s.substr(eq + 1);
  size_t used = 0;
  double f = 0;
  try {
    f = std::stod(factor, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FSDP_CHECK(used == factor.size() && !factor.empty() && f > 0 && std::isfinite(f), "--lr-scale '", s,
             "': the factor '", factor, "' must be a number > 0, e.g. 0.1 or 4");
  return {s.substr(0, eq), f};
}

void apply_sharding_flags(const TrainFlags& flags, train::TrainOptions& o) {
  o.device = parse_device(flags.device);
  o.sharding.strategy = parse_sharding(flags.sharding);
  o.sharding.reshard_after_forward = parse_reshard_after_forward(flags.reshard_after_forward, "--reshard-after-forward");
  o.sharding.wrap = parse_wrap(flags.wrap);
  o.sharding.mixed_precision = parse_mixed_precision(flags.mixed_precision, flags.reduce_dtype);
  o.sharding.compression.all_gather = parse_wire_format(flags.all_gather_wire, "--all-gather-wire");
  o.sharding.compression.reduce_scatter = parse_wire_format(flags.reduce_scatter_wire, "--reduce-scatter-wire");
  o.sharding.backward_prefetch = parse_backward_prefetch(flags.backward_prefetch);
  const std::optional<nn::RecomputePolicy> ac_policy = nn::parse_recompute_policy(flags.ac_policy);
  FSDP_CHECK(ac_policy.has_value(), "--ac-policy '", flags.ac_policy, "' is not one of: full, tail, selective");
  FSDP_CHECK(o.sharding.activation_checkpointing || *ac_policy == nn::RecomputePolicy::kTail, "--ac-policy ",
             flags.ac_policy, " chooses what activation checkpointing recomputes: add --activation-checkpointing");
  o.sharding.ac_policy = *ac_policy;
}

void apply_train_flags(const TrainFlags& flags, train::TrainOptions& o) {
  apply_sharding_flags(flags, o);
  const std::optional<models::LayerKernels> kernels = models::parse_layer_kernels(flags.kernels);
  FSDP_CHECK(kernels.has_value(), "--kernels '", flags.kernels, "' is not one of: reference, fused");
  o.step.kernels = *kernels;
  o.sharding.loss_scaling = parse_loss_scaling(flags.loss_scaling);
  o.hf.export_dtype = parse_export_dtype(flags.export_dtype);
  if (!o.hf.export_dir.empty()) o.hf.export_shard_bytes = parse_export_shard_size(flags.export_shard_size);
  if (o.checkpoint.async) {
    o.checkpoint.staging_limit = parse_byte_size(flags.checkpoint_staging_limit, "--checkpoint-staging-limit",
                                                 "stage nothing: every save is written before training goes on");
  }
  o.lora.targets = models::parse_lora_targets(flags.lora_targets);
  o.param_groups.lr_scales.clear();
  for (const auto& s : flags.lr_scales) o.param_groups.lr_scales.push_back(parse_lr_scale(s));
  (void)optim::param_rule(o.param_groups);  // UsageError for a pattern that is not a regex
  // --init-adapter without --lora-alpha trains at the adapter's own alpha (the
  // trainer logs it); a different --lora-alpha is refused (models::check_adapter_alpha).
  if (o.lora.enabled() && !o.lora.init_adapter.empty() && o.lora.alpha == 0) {
    o.lora.alpha = checkpoint::read_peft_adapter_config(o.lora.init_adapter).alpha;
  }
}

}  // namespace fsdp::cli

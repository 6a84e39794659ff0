// FsdpOptions: names of the choices and the checks fully_shard makes. The
// messages name the options as this library spells them (FsdpOptions::wrap,
// ...); a program maps them to its own flags (fsdp-train: apps/option_names.h).
#include <algorithm>

#include "fsdp/common/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/plan.h"

namespace fsdp {

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard: return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard: return "NO_SHARD";
    case ShardingStrategy::kHybridShard: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& s) {
  if (s == "full" || s == "FULL_SHARD") return ShardingStrategy::kFullShard;
  if (s == "grad-op" || s == "SHARD_GRAD_OP") return ShardingStrategy::kShardGradOp;
  if (s == "none" || s == "NO_SHARD") return ShardingStrategy::kNoShard;
  if (s == "hybrid" || s == "HYBRID_SHARD") return ShardingStrategy::kHybridShard;
  FSDP_CHECK(false, "unknown sharding strategy '", s, "'; accepted: full, grad-op, none, hybrid");
  return ShardingStrategy::kFullShard;
}

const char* to_string(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kNone: return "none";
    case BackwardPrefetch::kPre: return "pre";
    case BackwardPrefetch::kPost: return "post";
  }
  return "?";
}

BackwardPrefetch parse_backward_prefetch(const std::string& s) {
  if (s == "none") return BackwardPrefetch::kNone;
  if (s == "pre" || s == "BACKWARD_PRE") return BackwardPrefetch::kPre;
  if (s == "post" || s == "BACKWARD_POST") return BackwardPrefetch::kPost;
  FSDP_CHECK(false, "unknown backward prefetch '", s, "'; accepted: pre, post, none");
  return BackwardPrefetch::kPre;
}

WrapPolicy parse_wrap_policy(const std::string& spec, std::type_index block_type) {
  if (spec == "block") return WrapPolicy::by_type({block_type});
  if (spec == "root") return WrapPolicy::root_only();
  if (spec == "all") return WrapPolicy::every_unit();
  if (spec.rfind("size:", 0) == 0) {
    const std::string num = spec.substr(5);
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FSDP_CHECK(!num.empty() && used == num.size() && n >= 1, "FsdpOptions::wrap ", spec,
               ": the minimum parameter count after 'size:' must be a positive integer, e.g. size:1000000");
    return WrapPolicy::size_based(n);
  }
  FSDP_CHECK(false, "FsdpOptions::wrap '", spec, "' is not one of: block, size:N, root, all");
  return {};
}

std::string to_string(const WrapPolicy& p) {
  switch (p.kind) {
    case WrapPolicy::Kind::kByType: return "block";
    case WrapPolicy::Kind::kSize: return "size:" + std::to_string(p.min_num_params);
    case WrapPolicy::Kind::kRootOnly: return "root";
    case WrapPolicy::Kind::kEveryUnit: return "all";
  }
  return "?";
}

std::string to_string(const std::optional<ReshardAfterForward>& r) {
  if (!r.has_value()) return "default";
  if (r->reshard && r->group != 0) return std::to_string(r->group);
  return r->reshard ? "true" : "false";
}

at::ScalarType parse_dtype_word(const std::string& s, const char* what) {
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
    if (s == dtype_word(t)) return t;
  }
  FSDP_CHECK(false, what, " '", s, "' is not one of: fp32, bf16, fp16");
  return at::kFloat;
}

const char* dtype_word(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return "?";
  }
}

std::string MixedPrecision::preset_name() const {
  for (const char* name : {"fp32", "bf16", "fp16", "bf16-pure"}) {
    MixedPrecision p = preset(name);
    p.reduce_dtype = reduce_dtype;
    if (p.param_dtype == param_dtype && p.buffer_dtype == buffer_dtype && p.master_dtype == master_dtype &&
        p.output_dtype == output_dtype && p.cast_forward_inputs == cast_forward_inputs) {
      return name;
    }
  }
  return "";
}

MixedPrecision MixedPrecision::preset(const std::string& name) {
  MixedPrecision m;
  if (name == "fp32") return m;
  if (name == "bf16") {
    m.param_dtype = at::kBFloat16;
    m.buffer_dtype = at::kBFloat16;
    return m;
  }
  if (name == "fp16") {
    m.param_dtype = at::kHalf;
    m.buffer_dtype = at::kHalf;
    return m;
  }
  if (name == "bf16-pure") {
    m.param_dtype = m.reduce_dtype = m.buffer_dtype = m.master_dtype = at::kBFloat16;
    return m;
  }
  FSDP_CHECK(false, "unknown mixed precision '", name, "'; accepted: fp32, bf16, fp16, bf16-pure");
  return m;
}

const char* to_string(WireFormat f) {
  switch (f) {
    case WireFormat::kNative: return "native";
    case WireFormat::kBf16: return "bf16";
    case WireFormat::kInt8: return "int8";
  }
  return "?";
}

WireFormat parse_wire_format(const std::string& s, const char* what) {
  if (s == "native") return WireFormat::kNative;
  if (s == "bf16") return WireFormat::kBf16;
  if (s == "int8") return WireFormat::kInt8;
  FSDP_CHECK(false, what, " '", s, "' is not one of: native, bf16, int8");
  return WireFormat::kNative;
}

std::optional<ReshardAfterForward> parse_reshard_after_forward(const std::string& s, const char* what) {
  if (s == "default") return std::nullopt;
  if (s == "true" || s == "True") return ReshardAfterForward(true);
  if (s == "false" || s == "False") return ReshardAfterForward(false);
  const bool digits = !s.empty() && s.size() <= 6 && s.find_first_not_of("0123456789") == std::string::npos;
  const int n = digits ? std::stoi(s) : 0;
  FSDP_CHECK(n >= 1, what, " '", s,
             "' is not one of: default (the sharding strategy's), true, false, or a number of ranks N >= 1 "
             "(a post-forward shard over groups of N ranks, ZeRO++'s hpZ: e.g. the processes of one node)");
  return ReshardAfterForward::to_group(n);
}

namespace detail {

void check_post_forward_group(int group, int shard_size, std::string_view who) {
  FSDP_CHECK(group >= 1 && (shard_size <= 0 || (group <= shard_size && shard_size % group == 0)), who, " = ", group,
             " must divide the shard-group size ", shard_size,
             " (the ranks each post-forward shard is spread over; e.g. the processes of one node)");
}

}  // namespace detail

void check_options(const FsdpOptions& o, int world_size) {
  FSDP_CHECK(o.wrap.kind != WrapPolicy::Kind::kSize || o.wrap.min_num_params >= 1,
             "FsdpOptions::wrap: a size-based policy needs min_num_params >= 1 (e.g. size:1000000), got ",
             o.wrap.min_num_params);
  FSDP_CHECK(o.limit_all_gathers >= 1, "FsdpOptions::limit_all_gathers must be >= 1 (all-gathers issued ahead of use), got ",
             o.limit_all_gathers);
  const MixedPrecision& mp = o.mixed_precision;
  for (at::ScalarType t : {mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype}) {
    FSDP_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf,
               "mixed precision dtypes must be float32, bfloat16 or float16; got ", t);
  }
  FSDP_CHECK(mp.master_dtype == at::kFloat || mp.master_dtype == at::kBFloat16,
             "the master (shard) dtype must be float32 or bfloat16 (pure bf16 training); got ", mp.master_dtype);
  FSDP_CHECK(!o.cpu_offload || o.device.is_cpu() || o.device.is_cuda(), "CPU offload needs a CPU or CUDA device, got ",
             o.device);
  const bool offloads = o.cpu_offload || std::any_of(o.unit_overrides.begin(), o.unit_overrides.end(),
                                                     [](const UnitOverride& u) { return u.options.cpu_offload == true; });
  FSDP_CHECK(o.pin_memory || offloads, "FsdpOptions::pin_memory chooses the host memory of offloaded shards "
             "(page-locked or not), and nothing is offloaded: set FsdpOptions::cpu_offload as well");
  FSDP_CHECK(!o.offload_checkpoint_inputs || o.checkpoint_all_units || !o.checkpoint_types.empty(),
             "FsdpOptions::offload_checkpoint_inputs needs activation checkpointing (FsdpOptions::checkpoint_types)");
  const CommCompression& c = o.compression;
  FSDP_CHECK(c.block_size >= 1 && c.block_size <= (int64_t{1} << 24),
             "FsdpOptions::compression.block_size must be in [1, 16777216] elements per scale, got ", c.block_size);
  FSDP_CHECK(o.device.is_cpu() || (c.all_gather != WireFormat::kInt8 && c.reduce_scatter == WireFormat::kNative),
             "FsdpOptions::compression: the int8 all-gather and the compressed reduce-scatter run on the CPU process "
             "group, the device is ", o.device,
             " — on CUDA use the bf16 all-gather, and FsdpOptions::mixed_precision.reduce_dtype bf16 for gradients");
  // A float16 reduction divides before and after the sum (FSDP's overflow guard), which a compressed
  // reduce-scatter, computing the mean itself, cannot: refused with the options, once, rather than by
  // every rank at its first reduction (issue 50). At one rank nothing is reduced.
  FSDP_CHECK(c.reduce_scatter == WireFormat::kNative || mp.reduce_dtype != at::kHalf || world_size == 1,
             "FsdpOptions::compression.reduce_scatter ", to_string(c.reduce_scatter),
             " computes the mean itself and cannot take an fp16 reduce dtype (FsdpOptions::mixed_precision."
             "reduce_dtype), which divides before and after the sum; reduce in fp32 or bf16, or keep the native "
             "reduce-scatter");
  if (o.strategy == ShardingStrategy::kHybridShard) {
    const int s = o.hybrid_shard_size;
    FSDP_CHECK(s >= 1, "HYBRID_SHARD needs a shard-group size >= 1 (FsdpOptions::hybrid_shard_size, default "
               "LOCAL_WORLD_SIZE); "
               "got ", s);
    FSDP_CHECK(world_size <= 0 || world_size % s == 0, "world size ", world_size,
               " is not a multiple of the hybrid shard size ", s,
               "; choose a FsdpOptions::hybrid_shard_size that divides the world size");
  }
  // FSDP2's int (Note [Post-forward shards]): a divisor of the shard group;
  // NO_SHARD's units are replicated and keep no shard.
  if (o.reshard_after_forward && o.reshard_after_forward->reshard && o.reshard_after_forward->group != 0 &&
      o.strategy != ShardingStrategy::kNoShard) {
    const int shard = o.strategy == ShardingStrategy::kHybridShard ? o.hybrid_shard_size : world_size;
    detail::check_post_forward_group(o.reshard_after_forward->group, shard, "FsdpOptions::reshard_after_forward");
  }
}

}  // namespace fsdp

// fsdp-train's words for the trainer's choices (apps/train_flags.h): each word
// gives the typed value the trainer used to derive from it, each bad word the
// message fsdp-train has always printed for it, and the command line's
// defaults are TrainOptions' defaults.
#include <gtest/gtest.h>

#include <optional>
#include <tuple>

#include "support/errors.h"
#include "option_names.h"
#include "train/model_build.h"
#include "train_flags.h"

namespace fsdp::cli {
namespace {

using testing::usage_error_of;
using Kind = train::WrapChoice::Kind;

train::TrainOptions options_of(const TrainFlags& flags) {
  train::TrainOptions o;
  apply_train_flags(flags, o);
  return o;
}

bool same(const MixedPrecision& a, const MixedPrecision& b) {
  return a.param_dtype == b.param_dtype && a.reduce_dtype == b.reduce_dtype && a.buffer_dtype == b.buffer_dtype &&
         a.master_dtype == b.master_dtype;
}

TEST(TrainFlags, DefaultsAreTheTrainOptionsDefaults) {
  train::TrainOptions parsed;
  parsed.hf.export_dir = "out";   // so that --export-shard-size is read too
  parsed.checkpoint.async = true;  // and --checkpoint-staging-limit
  apply_train_flags(TrainFlags{}, parsed);
  const train::TrainOptions defaults;
  EXPECT_EQ(parsed.device, defaults.device);
  EXPECT_EQ(parsed.sharding.strategy, defaults.sharding.strategy);
  EXPECT_EQ(parsed.sharding.wrap.kind, defaults.sharding.wrap.kind);
  EXPECT_TRUE(same(parsed.sharding.mixed_precision, defaults.sharding.mixed_precision));
  EXPECT_EQ(parsed.sharding.backward_prefetch, defaults.sharding.backward_prefetch);
  EXPECT_EQ(parsed.sharding.ac_policy, defaults.sharding.ac_policy);
  EXPECT_EQ(parsed.step.kernels, defaults.step.kernels);
  EXPECT_EQ(parsed.sharding.loss_scaling, defaults.sharding.loss_scaling);
  EXPECT_EQ(parsed.hf.export_dtype, defaults.hf.export_dtype);
  EXPECT_EQ(parsed.hf.export_shard_bytes, defaults.hf.export_shard_bytes);
  EXPECT_EQ(parsed.checkpoint.staging_limit, defaults.checkpoint.staging_limit);
}

TEST(TrainFlags, WordsGiveTheirValues) {
  EXPECT_EQ(parse_device("cpu"), at::kCPU);
  EXPECT_EQ(parse_device("cuda"), at::kCUDA);
  EXPECT_EQ(parse_sharding("full"), ShardingStrategy::kFullShard);
  EXPECT_EQ(parse_sharding("grad-op"), ShardingStrategy::kShardGradOp);
  EXPECT_EQ(parse_sharding("none"), ShardingStrategy::kNoShard);
  EXPECT_EQ(parse_sharding("hybrid"), ShardingStrategy::kHybridShard);
  EXPECT_EQ(parse_sharding("HYBRID_SHARD"), ShardingStrategy::kHybridShard);
  EXPECT_EQ(parse_wrap("block").kind, Kind::kBlock);
  EXPECT_EQ(parse_wrap("root").kind, Kind::kRoot);
  EXPECT_EQ(parse_wrap("all").kind, Kind::kAll);
  const train::WrapChoice size = parse_wrap("size:1000000");
  EXPECT_EQ(size.kind, Kind::kSize);
  EXPECT_EQ(size.min_num_params, 1000000);
  EXPECT_TRUE(same(parse_mixed_precision("bf16", ""), MixedPrecision::preset("bf16")));
  EXPECT_TRUE(same(parse_mixed_precision("bf16-pure", ""), MixedPrecision::preset("bf16-pure")));
  const MixedPrecision bf16_reduce = parse_mixed_precision("bf16", "bf16");
  EXPECT_EQ(bf16_reduce.param_dtype, at::kBFloat16);
  EXPECT_EQ(bf16_reduce.reduce_dtype, at::kBFloat16);
  EXPECT_EQ(bf16_reduce.master_dtype, at::kFloat);
  EXPECT_EQ(parse_mixed_precision("bf16-pure", "fp32").reduce_dtype, at::kFloat);
  EXPECT_EQ(parse_mixed_precision("fp32", "fp16").reduce_dtype, at::kHalf);
  EXPECT_EQ(parse_backward_prefetch("pre"), BackwardPrefetch::kPre);
  EXPECT_EQ(parse_backward_prefetch("post"), BackwardPrefetch::kPost);
  EXPECT_EQ(parse_backward_prefetch("none"), BackwardPrefetch::kNone);
  EXPECT_EQ(parse_loss_scaling("auto"), train::LossScaling::kAuto);
  EXPECT_EQ(parse_loss_scaling("on"), train::LossScaling::kOn);
  EXPECT_EQ(parse_loss_scaling("off"), train::LossScaling::kOff);
  EXPECT_EQ(parse_export_dtype("float32"), at::kFloat);
  EXPECT_EQ(parse_export_dtype("bf16"), at::kBFloat16);
  EXPECT_EQ(parse_export_dtype("float16"), at::kHalf);
  EXPECT_EQ(parse_export_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_export_shard_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_export_shard_size("0"), 0);
}

// --reshard-after-forward: FSDP2's bool or int, or the strategy's default.
TEST(TrainFlags, ReshardAfterForwardIsFsdp2sBoolOrInt) {
  const char* flag = "--reshard-after-forward";
  EXPECT_FALSE(parse_reshard_after_forward("default", flag).has_value());
  EXPECT_FALSE(options_of(TrainFlags{}).sharding.reshard_after_forward.has_value());
  for (const auto& [word, reshard, group] :
       {std::tuple{"true", true, 0}, {"True", true, 0}, {"false", false, 0}, {"2", true, 2}, {"1", true, 1}}) {
    const std::optional<ReshardAfterForward> r = parse_reshard_after_forward(word, flag);
    ASSERT_TRUE(r.has_value()) << word;
    EXPECT_EQ(r->reshard, reshard) << word;
    EXPECT_EQ(r->group, group) << word;
  }
  TrainFlags flags;
  flags.reshard_after_forward = "4";
  const train::TrainOptions o = options_of(flags);
  ASSERT_TRUE(o.sharding.reshard_after_forward.has_value());
  EXPECT_EQ(o.sharding.reshard_after_forward->group, 4);
  for (const char* bad : {"0", "-1", "yes", "", "2x", "1e3", "9999999", " 2"}) {
    EXPECT_EQ(usage_error_of([&] { parse_reshard_after_forward(bad, flag); }),
              std::string("--reshard-after-forward '") + bad +
                  "' is not one of: default (the sharding strategy's), true, false, or a number of ranks N >= 1 "
                  "(a post-forward shard over groups of N ranks, ZeRO++'s hpZ: e.g. the processes of one node)")
        << bad;
  }
}

// The engine refuses a group that does not divide the shard group, in the flag's terms
// where the program speaks (FULL_SHARD: the world; HYBRID: the shard group; NO_SHARD: unused).
TEST(TrainFlags, ReshardAfterForwardMustDivideTheShardGroup) {
  FsdpOptions o;
  o.reshard_after_forward = ReshardAfterForward::to_group(2);
  check_options(o, 4);
  check_options(o, 2);
  EXPECT_EQ(in_flag_terms(usage_error_of([&] { check_options(o, 3); })),
            "--reshard-after-forward = 2 must divide the shard-group size 3 (the ranks each post-forward shard is "
            "spread over; e.g. the processes of one node)");
  o.strategy = ShardingStrategy::kHybridShard;
  o.hybrid_shard_size = 4;
  check_options(o, 8);
  o.reshard_after_forward = ReshardAfterForward::to_group(8);
  EXPECT_CONTAINS(in_flag_terms(usage_error_of([&] { check_options(o, 8); })),
                  "--reshard-after-forward = 8 must divide the shard-group size 4");
  o.strategy = ShardingStrategy::kNoShard;
  check_options(o, 3);
  o.strategy = ShardingStrategy::kFullShard;
  o.reshard_after_forward = ReshardAfterForward(false);
  check_options(o, 3);
}

// The messages fsdp-train printed when the trainer parsed these words itself.
TEST(TrainFlags, BadWordsKeepTheirMessages) {
  EXPECT_EQ(usage_error_of([] { parse_device("tpu"); }), "--device 'tpu' is not one of: cpu, cuda");
  EXPECT_EQ(usage_error_of([] { parse_sharding("half"); }),
            "unknown sharding strategy 'half'; accepted: full, grad-op, none, hybrid");
  EXPECT_EQ(usage_error_of([] { parse_wrap("leaves"); }), "--wrap 'leaves' is not one of: block, size:N, root, all");
  EXPECT_EQ(usage_error_of([] { parse_wrap(""); }), "--wrap '' is not one of: block, size:N, root, all");
  for (const char* bad : {"size:0", "size:-5", "size:abc", "size:", "size:18446744073709551616", "size:0x10"}) {
    EXPECT_EQ(usage_error_of([&] { parse_wrap(bad); }),
              std::string("--wrap ") + bad +
                  ": the minimum parameter count after 'size:' must be a positive integer, e.g. size:1000000");
  }
  EXPECT_EQ(usage_error_of([] { parse_mixed_precision("fp8", ""); }),
            "unknown mixed precision 'fp8'; accepted: fp32, bf16, fp16, bf16-pure");
  EXPECT_EQ(usage_error_of([] { parse_mixed_precision("bf16", "fp64"); }),
            "--reduce-dtype 'fp64' is not one of: fp32, bf16, fp16");
  EXPECT_EQ(usage_error_of([] { parse_backward_prefetch("later"); }),
            "unknown backward prefetch 'later'; accepted: pre, post, none");
  EXPECT_EQ(usage_error_of([] { parse_loss_scaling("maybe"); }), "--loss-scaling 'maybe' is not one of: auto, on, off");
  EXPECT_EQ(usage_error_of([] { parse_export_dtype("int8"); }),
            "--export-dtype 'int8' is not one of: float32, bfloat16, float16");
  EXPECT_EQ(usage_error_of([] { parse_export_shard_size("5XB"); }),
            "--export-shard-size '5XB': unknown unit 'XB'; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, "
            "TiB (powers of 1024)");
}

// --ac-policy: its three words, a bad one, and a policy without the checkpointing it chooses for.
TEST(TrainFlags, AcPolicyChoosesWhatCheckpointingRecomputes) {
  for (const auto& [word, policy] : {std::pair{"full", nn::RecomputePolicy::kFull},
                                     {"tail", nn::RecomputePolicy::kTail},
                                     {"selective", nn::RecomputePolicy::kSelective}}) {
    TrainFlags flags;
    flags.ac_policy = word;
    train::TrainOptions o;
    o.sharding.activation_checkpointing = true;
    apply_train_flags(flags, o);
    EXPECT_EQ(o.sharding.ac_policy, policy) << word;
    EXPECT_EQ(train::engine_options(o, nullptr, 1).checkpoint_policy, policy) << word;
  }
  TrainFlags flags;
  flags.ac_policy = "some";
  train::TrainOptions o;
  o.sharding.activation_checkpointing = true;
  EXPECT_EQ(usage_error_of([&] { apply_train_flags(flags, o); }),
            "--ac-policy 'some' is not one of: full, tail, selective");
  flags.ac_policy = "selective";
  o.sharding.activation_checkpointing = false;
  EXPECT_EQ(usage_error_of([&] { apply_train_flags(flags, o); }),
            "--ac-policy selective chooses what activation checkpointing recomputes: add --activation-checkpointing");
}

TEST(TrainFlags, KernelsChooseTheLayersImplementation) {
  TrainFlags flags;
  flags.kernels = "fused";
  EXPECT_EQ(options_of(flags).step.kernels, models::LayerKernels::kFused);
  flags.kernels = "reference";
  EXPECT_EQ(options_of(flags).step.kernels, models::LayerKernels::kReference);
  flags.kernels = "fast";
  EXPECT_EQ(usage_error_of([&] { options_of(flags); }), "--kernels 'fast' is not one of: reference, fused");
}

// As before the words moved here: a bad --export-shard-size is refused only
// when there is an export to split.
TEST(TrainFlags, ExportShardSizeIsReadOnlyWithAnExport) {
  TrainFlags flags;
  flags.export_shard_size = "5XB";
  train::TrainOptions o;
  apply_train_flags(flags, o);
  EXPECT_EQ(o.hf.export_shard_bytes, train::TrainOptions{}.hf.export_shard_bytes);
  o.hf.export_dir = "out";
  EXPECT_CONTAINS(usage_error_of([&] { apply_train_flags(flags, o); }), "--export-shard-size '5XB'");
  flags.export_shard_size = "1MB";
  apply_train_flags(flags, o);
  EXPECT_EQ(o.hf.export_shard_bytes, 1'000'000);
}

// The same for --checkpoint-staging-limit, read only with --async-checkpoint.
TEST(TrainFlags, StagingLimitIsReadOnlyWithAsyncCheckpoint) {
  TrainFlags flags;
  flags.checkpoint_staging_limit = "lots";
  train::TrainOptions o;
  apply_train_flags(flags, o);
  EXPECT_EQ(o.checkpoint.staging_limit, train::TrainOptions{}.checkpoint.staging_limit);
  o.checkpoint.async = true;
  EXPECT_CONTAINS(usage_error_of([&] { apply_train_flags(flags, o); }), "--checkpoint-staging-limit 'lots'");
  flags.checkpoint_staging_limit = "500MiB";
  apply_train_flags(flags, o);
  EXPECT_EQ(o.checkpoint.staging_limit, int64_t{500} << 20);
}

}  // namespace
}  // namespace fsdp::cli

namespace fsdp::cli {

// --lr-scale REGEX=FACTOR (repeatable): the last '=' splits, so a pattern may hold one.
TEST(TrainFlags, LrScalesParseAndRefuseBadValues) {
  EXPECT_EQ(parse_lr_scale("lora_B=4"), (std::pair<std::string, double>{"lora_B", 4.0}));
  EXPECT_EQ(parse_lr_scale("a=b=0.5"), (std::pair<std::string, double>{"a=b", 0.5}));
  TrainFlags flags;
  flags.lr_scales = {"embed=0.1", "lora_B=16"};
  train::TrainOptions o;
  apply_train_flags(flags, o);
  ASSERT_EQ(o.param_groups.lr_scales.size(), 2u);
  EXPECT_EQ(o.param_groups.lr_scales[1], (std::pair<std::string, double>{"lora_B", 16.0}));
  for (const char* bad : {"lora_B", "=2", "lora_B=", "lora_B=0", "lora_B=-1", "lora_B=x", "lora_B=2x", "a=inf"}) {
    EXPECT_NE(usage_error_of([&] { parse_lr_scale(bad); }).find("--lr-scale '" + std::string(bad) + "'"),
              std::string::npos)
        << bad;
  }
  flags.lr_scales = {"lora_(=2"};  // not a regex
  EXPECT_NE(usage_error_of([&] { apply_train_flags(flags, o); }).find("'lora_(' is not a valid regular expression"),
            std::string::npos);
}

}  // namespace fsdp::cli

namespace fsdp::cli {

// The engine names its options (FsdpOptions::...); the programs say their
// flags instead, in every place a name occurs.
TEST(OptionNames, EngineTermsBecomeFlags) {
  EXPECT_EQ(in_flag_terms("[rank 0/2] HYBRID_SHARD needs a shard-group size >= 1 (FsdpOptions::hybrid_shard_size, "
                          "default LOCAL_WORLD_SIZE); choose a FsdpOptions::hybrid_shard_size that divides it"),
            "[rank 0/2] HYBRID_SHARD needs a shard-group size >= 1 (--hybrid-shard-size, default LOCAL_WORLD_SIZE); "
            "choose a --hybrid-shard-size that divides it");
  EXPECT_EQ(in_flag_terms("FsdpOptions::offload_checkpoint_inputs needs activation checkpointing "
                          "(FsdpOptions::checkpoint_types)"),
            "--offload-activations needs activation checkpointing (--activation-checkpointing)");
  EXPECT_EQ(in_flag_terms("FsdpOptions::limit_all_gathers must be >= 1"), "--limit-all-gathers must be >= 1");
  EXPECT_EQ(in_flag_terms("no option here"), "no option here");
  // A UsageError through with_flag_names keeps its type, in flag terms.
  EXPECT_EQ(usage_error_of([] {
              with_flag_names([]() -> int {
                check_options([] {
                  FsdpOptions o;
                  o.limit_all_gathers = 0;
                  return o;
                }(), 2);
                return 0;
              });
            }),
            "--limit-all-gathers must be >= 1 (all-gathers issued ahead of use), got 0");
}

}  // namespace fsdp::cli

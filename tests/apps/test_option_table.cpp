// fsdp-train's option table (apps/train_options_table.h): each row binds a
// typed member of TrainOptions and reads its words with the library's own
// parse, so each word gives its typed value, each bad word the library's
// message in the flag's terms, and each default shown is the member's default
// written back by the library's to_string.
#include <gtest/gtest.h>

#include <optional>
#include <tuple>
#include <vector>

#include "fsdp/checkpoint/hf.h"
#include "fsdp/comm/rendezvous.h"
#include "fsdp/data/dataset.h"
#include "fsdp/models/lora.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/optim/lr_schedule.h"
#include "option_names.h"
#include "support/errors.h"
#include "train/model_build.h"
#include "train_options_table.h"

namespace fsdp::cli {
namespace {

using testing::usage_error_of;

// fsdp-train's command line, parsed into a TrainTargets (errors in flag terms).
TrainTargets parse(std::vector<std::string> args) {
  TrainTargets t;
  CLI::App app("fsdp-train");
  register_train_options(app, t);
  args.insert(args.begin(), "fsdp-train");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  with_flag_names([&] {
    app.parse(static_cast<int>(argv.size()), argv.data());
    return 0;
  });
  return t;
}

const OptionRow& row_of(const std::string& flag) {
  for (const OptionRow& row : train_option_table()) {
    if (row.name() == flag) return row;
  }
  ADD_FAILURE() << "no row " << flag;
  return train_option_table().front();
}

// The message a bad word gets from the row's own parse (past CLI11's check of
// the choices, which comes first on the command line), in flag terms.
std::string words_error(const std::string& flag, const std::string& word) {
  TrainTargets t;
  const OptionTarget target = row_of(flag).target(t);
  const WordsTarget* w = std::get_if<WordsTarget>(&target);
  if (w == nullptr) {
    ADD_FAILURE() << flag << " is not a row in words";
    return "";
  }
  return usage_error_of([&] { with_flag_names([&] { return w->set(word, true), 0; }); });
}

bool same(const MixedPrecision& a, const MixedPrecision& b) {
  return a.param_dtype == b.param_dtype && a.reduce_dtype == b.reduce_dtype && a.buffer_dtype == b.buffer_dtype &&
         a.master_dtype == b.master_dtype;
}

TEST(OptionTable, NothingGivenIsTheTrainOptionsDefaults) {
  const train::TrainOptions parsed = parse({}).o;
  const train::TrainOptions defaults;
  EXPECT_EQ(parsed.device, defaults.device);
  EXPECT_EQ(parsed.fsdp.strategy, defaults.fsdp.strategy);
  EXPECT_EQ(parsed.fsdp.wrap.kind, WrapPolicy::Kind::kByType);
  EXPECT_TRUE(parsed.fsdp.wrap.types.empty());  // the model's blocks
  EXPECT_TRUE(same(parsed.fsdp.mixed_precision, defaults.fsdp.mixed_precision));
  EXPECT_EQ(parsed.fsdp.backward_prefetch, defaults.fsdp.backward_prefetch);
  EXPECT_EQ(parsed.fsdp.checkpoint_policy, defaults.fsdp.checkpoint_policy);
  EXPECT_EQ(parsed.step.kernels, defaults.step.kernels);
  EXPECT_EQ(parsed.step.fp8_linear, models::Fp8Linear::kOff);
  EXPECT_EQ(parsed.step.loss_scaling, defaults.step.loss_scaling);
  EXPECT_EQ(parsed.hf.export_dtype, defaults.hf.export_dtype);
  EXPECT_EQ(parsed.hf.export_shard_bytes, defaults.hf.export_shard_bytes);
  EXPECT_EQ(parsed.checkpoint.staging_limit, defaults.checkpoint.staging_limit);
  EXPECT_EQ(parsed.lora.targets, defaults.lora.targets);
  EXPECT_EQ(parsed.data.format, defaults.data.format);
  EXPECT_EQ(parsed.data.token_dtype, defaults.data.token_dtype);
}

// Every row in words shows its member's default in the library's words, and
// that word, given, is the default again (so --print-config's output parses
// back to the same run).
TEST(OptionTable, EachDefaultShownParsesBackToItself) {
  int checked = 0;
  for (const OptionRow& row : train_option_table()) {
    TrainTargets t;
    const OptionTarget target = row.target(t);
    const WordsTarget* w = std::get_if<WordsTarget>(&target);
    if (w == nullptr || (row.traits & kShowDefault) == 0) continue;
    const std::string shown = w->get();
    w->set(shown, true);
    EXPECT_EQ(w->get(), shown) << row.name();
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

// Every row bound to the trainer's options names the field it binds, and the
// programs map that name to the row's flag.
TEST(OptionTable, EveryTrainerRowNamesItsField) {
  for (const OptionRow& row : train_option_table()) {
    TrainTargets t;
    if (row.field.empty()) continue;
    EXPECT_NE(row.field.find("::"), std::string::npos) << row.name() << ": " << row.field;
    EXPECT_EQ(in_flag_terms(row.field + " is bad"), row.name() + " is bad") << row.field;
  }
  EXPECT_EQ(row_of("--seq-len").field, "DataOptions::seq_len");
  EXPECT_EQ(row_of("--reduce-dtype").field, "FsdpOptions::mixed_precision.reduce_dtype");
  EXPECT_EQ(row_of("--activation-checkpointing").field, "TrainOptions::activation_checkpointing");
  EXPECT_EQ(row_of("--nproc-per-node").field, "");  // the launcher's own
}

TEST(OptionTable, WordsGiveTheirValues) {
  EXPECT_EQ(parse({"--device", "cuda"}).o.device, at::Device(at::kCUDA));
  EXPECT_FALSE(parse({"--device", "cuda"}).o.device.has_index());  // each rank on its local rank's GPU
  EXPECT_EQ(parse({"--device", "cuda:3"}).o.device, at::Device(at::kCUDA, 3));
  EXPECT_EQ(parse({"--device", "cuda:127"}).o.device, at::Device(at::kCUDA, 127));
  EXPECT_EQ(parse({"--sharding", "grad-op"}).o.fsdp.strategy, ShardingStrategy::kShardGradOp);
  EXPECT_EQ(parse({"--sharding", "none"}).o.fsdp.strategy, ShardingStrategy::kNoShard);
  EXPECT_EQ(parse({"--sharding", "HYBRID_SHARD"}).o.fsdp.strategy, ShardingStrategy::kHybridShard);
  EXPECT_EQ(parse({"--wrap", "root"}).o.fsdp.wrap.kind, WrapPolicy::Kind::kRootOnly);
  EXPECT_EQ(parse({"--wrap", "all"}).o.fsdp.wrap.kind, WrapPolicy::Kind::kEveryUnit);
  const WrapPolicy size = parse({"--wrap", "size:1000000"}).o.fsdp.wrap;
  EXPECT_EQ(size.kind, WrapPolicy::Kind::kSize);
  EXPECT_EQ(size.min_num_params, 1000000);
  EXPECT_TRUE(same(parse({"--mixed-precision", "bf16-pure"}).o.fsdp.mixed_precision, MixedPrecision::preset("bf16-pure")));
  EXPECT_EQ(parse({"--backward-prefetch", "post"}).o.fsdp.backward_prefetch, BackwardPrefetch::kPost);
  EXPECT_EQ(parse({"--loss-scaling", "on"}).o.step.loss_scaling, train::LossScaling::kOn);
  EXPECT_EQ(parse({"--export-dtype", "bf16"}).o.hf.export_dtype, at::kBFloat16);
  EXPECT_EQ(parse({"--export-shard-size", "2GiB"}).o.hf.export_shard_bytes, int64_t{2} << 30);
  EXPECT_EQ(parse({"--export-shard-size", "0"}).o.hf.export_shard_bytes, 0);
  EXPECT_EQ(parse({"--checkpoint-staging-limit", "500MiB"}).o.checkpoint.staging_limit, int64_t{500} << 20);
  EXPECT_EQ(parse({"--all-gather-wire", "int8"}).o.fsdp.compression.all_gather, WireFormat::kInt8);
  EXPECT_EQ(parse({"--reduce-scatter-wire", "bf16"}).o.fsdp.compression.reduce_scatter, WireFormat::kBf16);
  EXPECT_EQ(parse({"--lora-targets", "q_proj,down_proj"}).o.lora.targets,
            (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_EQ(parse({"--data-format", "jsonl"}).o.data.format, data::DataFormat::kJsonl);
  EXPECT_EQ(parse({"--token-dtype", "u32"}).o.data.token_dtype, data::TokenDtype::kUint32);
  EXPECT_EQ(parse({"--kernels", "fused"}).o.step.kernels, models::LayerKernels::kFused);
  EXPECT_EQ(parse({}).o.step.attention_backend, nn::AttentionBackend::kFlash);
  EXPECT_EQ(parse({"--attention-backend", "cudnn"}).o.step.attention_backend, nn::AttentionBackend::kCudnn);
  EXPECT_EQ(parse({"--fp8-linear", "rowwise"}).o.step.fp8_linear, models::Fp8Linear::kRowwise);
}

// --reduce-dtype replaces the preset's reduce dtype wherever it is written:
// the rows' callbacks run in the table's order, not the command line's.
TEST(OptionTable, ReduceDtypeOverridesThePresetInEitherOrder) {
  for (const auto& args : {std::vector<std::string>{"--mixed-precision", "bf16", "--reduce-dtype", "bf16"},
                           std::vector<std::string>{"--reduce-dtype", "bf16", "--mixed-precision", "bf16"}}) {
    const MixedPrecision mp = parse(args).o.fsdp.mixed_precision;
    EXPECT_EQ(mp.param_dtype, at::kBFloat16);
    EXPECT_EQ(mp.reduce_dtype, at::kBFloat16);
    EXPECT_EQ(mp.master_dtype, at::kFloat);
  }
  EXPECT_EQ(parse({"--mixed-precision", "bf16-pure", "--reduce-dtype", "fp32"}).o.fsdp.mixed_precision.reduce_dtype,
            at::kFloat);
  EXPECT_EQ(parse({"--reduce-dtype", "fp16"}).o.fsdp.mixed_precision.reduce_dtype, at::kHalf);
}

// --reshard-after-forward: FSDP2's bool or int, or the strategy's default.
TEST(OptionTable, ReshardAfterForwardIsFsdp2sBoolOrInt) {
  EXPECT_FALSE(parse({}).o.fsdp.reshard_after_forward.has_value());
  EXPECT_FALSE(parse({"--reshard-after-forward", "default"}).o.fsdp.reshard_after_forward.has_value());
  for (const auto& [word, reshard, group] :
       {std::tuple{"true", true, 0}, {"True", true, 0}, {"false", false, 0}, {"2", true, 2}, {"1", true, 1}}) {
    const std::optional<ReshardAfterForward> r = parse({"--reshard-after-forward", word}).o.fsdp.reshard_after_forward;
    ASSERT_TRUE(r.has_value()) << word;
    EXPECT_EQ(r->reshard, reshard) << word;
    EXPECT_EQ(r->group, group) << word;
  }
  for (const char* bad : {"0", "-1", "yes", "", "2x", "1e3", "9999999", " 2"}) {
    EXPECT_EQ(words_error("--reshard-after-forward", bad),
              std::string("--reshard-after-forward '") + bad +
                  "' is not one of: default (the sharding strategy's), true, false, or a number of ranks N >= 1 "
                  "(a post-forward shard over groups of N ranks, ZeRO++'s hpZ: e.g. the processes of one node)")
        << bad;
  }
}

// The engine refuses a group that does not divide the shard group, in the flag's terms
// where the program speaks (FULL_SHARD: the world; HYBRID: the shard group; NO_SHARD: unused).
TEST(OptionTable, ReshardAfterForwardMustDivideTheShardGroup) {
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

// The library's messages for bad words, in the flags' terms.
TEST(OptionTable, BadWordsGetTheLibrarysMessageInFlagTerms) {
  for (const char* bad : {"tpu", "cpu:0", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "cuda:128", "cuda:01", "CUDA"}) {
    EXPECT_EQ(words_error("--device", bad),
              std::string("--device '") + bad + "' is not one of: cpu, cuda, cuda:N (N in 0..127: every rank on GPU N)");
  }
  EXPECT_EQ(words_error("--sharding", "half"), "unknown sharding strategy 'half'; accepted: full, grad-op, none, hybrid");
  EXPECT_EQ(words_error("--wrap", "leaves"), "--wrap 'leaves' is not one of: block, size:N, root, all");
  EXPECT_EQ(words_error("--wrap", ""), "--wrap '' is not one of: block, size:N, root, all");
  for (const char* bad : {"size:0", "size:-5", "size:abc", "size:", "size:18446744073709551616", "size:0x10"}) {
    EXPECT_EQ(words_error("--wrap", bad),
              std::string("--wrap ") + bad +
                  ": the minimum parameter count after 'size:' must be a positive integer, e.g. size:1000000");
  }
  EXPECT_EQ(words_error("--mixed-precision", "fp8"), "unknown mixed precision 'fp8'; accepted: fp32, bf16, fp16, bf16-pure");
  EXPECT_EQ(words_error("--reduce-dtype", "fp64"), "--reduce-dtype 'fp64' is not one of: fp32, bf16, fp16");
  EXPECT_EQ(words_error("--backward-prefetch", "later"), "unknown backward prefetch 'later'; accepted: pre, post, none");
  EXPECT_EQ(words_error("--loss-scaling", "maybe"), "--loss-scaling 'maybe' is not one of: auto, on, off");
  EXPECT_EQ(words_error("--export-dtype", "int8"), "--export-dtype 'int8' is not one of: float32, bfloat16, float16");
  EXPECT_EQ(words_error("--export-shard-size", "5XB"),
            "--export-shard-size '5XB': unknown unit 'XB'; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, "
            "TiB (powers of 1024)");
  EXPECT_CONTAINS(words_error("--checkpoint-staging-limit", "lots"), "--checkpoint-staging-limit 'lots'");
  EXPECT_EQ(words_error("--kernels", "fast"), "--kernels 'fast' is not one of: reference, fused");
  EXPECT_EQ(words_error("--attention-backend", "cuDNN"), "--attention-backend 'cuDNN' is not one of: flash, cudnn");
  EXPECT_EQ(words_error("--fp8-linear", "bogus"), "--fp8-linear 'bogus' is not one of: off, rowwise");
  EXPECT_EQ(words_error("--ac-policy", "some"), "--ac-policy 'some' is not one of: full, tail, selective");
  // A bad value is refused wherever it is given, whether or not the run uses it.
  EXPECT_CONTAINS(usage_error_of([] { parse({"--export-shard-size", "5XB"}); }), "--export-shard-size '5XB'");
}

// --ac-policy: its three words, and a policy without the checkpointing it chooses for.
TEST(OptionTable, AcPolicyChoosesWhatCheckpointingRecomputes) {
  for (const auto& [word, policy] : {std::pair{"full", nn::RecomputePolicy::kFull},
                                     {"tail", nn::RecomputePolicy::kTail},
                                     {"selective", nn::RecomputePolicy::kSelective}}) {
    const train::TrainOptions o = parse({"--activation-checkpointing", "--ac-policy", word}).o;
    EXPECT_TRUE(o.activation_checkpointing);
    EXPECT_EQ(o.fsdp.checkpoint_policy, policy) << word;
    EXPECT_EQ(train::engine_options(o, nullptr, 1).checkpoint_policy, policy) << word;
  }
  const train::TrainOptions o = parse({"--ac-policy", "selective"}).o;
  EXPECT_EQ(usage_error_of([&] { with_flag_names([&] { return train::engine_options(o, nullptr, 1), 0; }); }),
            "--ac-policy selective chooses what activation checkpointing recomputes: turn on "
            "--activation-checkpointing");
}

// An option added as one row (docs/training.md, "Adding an option"): the
// engine's own field, so its use is the engine's, and its check the engine's.
TEST(OptionTable, NoPinMemoryIsFsdp2sCpuOffloadPolicyPinMemory) {
  EXPECT_TRUE(parse({"--cpu-offload"}).o.fsdp.pin_memory);
  const train::TrainOptions o = parse({"--cpu-offload", "--no-pin-memory"}).o;
  EXPECT_FALSE(o.fsdp.pin_memory);
  EXPECT_FALSE(train::engine_options(o, nullptr, 2).pin_memory);  // what fully_shard gets
  const train::TrainOptions alone = parse({"--no-pin-memory"}).o;
  EXPECT_EQ(usage_error_of([&] { with_flag_names([&] { return train::engine_options(alone, nullptr, 2), 0; }); }),
            "--no-pin-memory chooses the host memory of offloaded shards (page-locked or not), and nothing is "
            "offloaded: set --cpu-offload as well");
}

// --lr-scale REGEX=FACTOR (repeatable): the last '=' splits, so a pattern may hold one.
TEST(OptionTable, LrScalesParseAndRefuseBadValues) {
  EXPECT_EQ(optim::parse_lr_scale("lora_B=4"), (std::pair<std::string, double>{"lora_B", 4.0}));
  EXPECT_EQ(optim::parse_lr_scale("a=b=0.5"), (std::pair<std::string, double>{"a=b", 0.5}));
  const train::TrainOptions o = parse({"--lr-scale", "embed=0.1", "--lr-scale", "lora_B=16"}).o;
  ASSERT_EQ(o.param_groups.lr_scales.size(), 2u);
  EXPECT_EQ(o.param_groups.lr_scales[1], (std::pair<std::string, double>{"lora_B", 16.0}));
  for (const char* bad : {"lora_B", "=2", "lora_B=", "lora_B=0", "lora_B=-1", "lora_B=x", "lora_B=2x", "a=inf"}) {
    EXPECT_CONTAINS(words_error("--lr-scale", bad), "--lr-scale '" + std::string(bad) + "'");
  }
  optim::ParamGroupOptions groups;
  groups.lr_scales = {{"lora_(", 2.0}};  // not a regex: refused by validate_options
  EXPECT_CONTAINS(usage_error_of([&] { optim::param_rule(groups); }), "'lora_(' is not a valid regular expression");
}

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
  EXPECT_EQ(in_flag_terms("FsdpOptions::mixed_precision.reduce_dtype bf16"), "--reduce-dtype bf16");
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

// Outside TrainOptions the library names the struct fields and parameters its
// functions take (LoraConfig::rank, LrSchedule::min_lr, "freeze_matching:
// pattern"); each is a row's `also`, so the programs still say the flag.
TEST(OptionNames, LibraryFieldsBecomeFlags) {
  models::LoraConfig lora;
  lora.rank = 0;
  const std::string rank = usage_error_of([&] { models::check_lora_config(lora); });
  EXPECT_CONTAINS(rank, "LoraConfig::rank 0 must be >= 1");
  EXPECT_CONTAINS(in_flag_terms(rank), "--lora-rank 0 must be >= 1");
  optim::LrSchedule schedule;
  schedule.min_lr = 2 * schedule.lr;
  EXPECT_CONTAINS(in_flag_terms(usage_error_of([&] { schedule.validate(); })), "--min-lr must be in [0, --lr=");
  EXPECT_CONTAINS(in_flag_terms(usage_error_of([] { checkpoint::parse_export_dtype("int4"); })),
                  "--export-dtype 'int4' is not one of");
  EXPECT_CONTAINS(in_flag_terms(usage_error_of([] { data::parse_token_dtype("u8"); })), "unknown --token-dtype \"u8\"");
  EXPECT_CONTAINS(in_flag_terms(usage_error_of([] { comm::choose_backend("mpi", false); })), "unknown --backend 'mpi'");
  EXPECT_EQ(in_flag_terms("freeze_matching: pattern 'x'; check_checkpoint_dir: dir /c; LaunchOptions::nproc 2"),
            "--freeze 'x'; --checkpoint-dir /c; --nproc-per-node 2");
  // Every other name maps to its row's flag, as its field does.
  for (const OptionRow& row : train_option_table()) {
    for (const std::string& name : row.also) EXPECT_EQ(in_flag_terms(name + " is bad"), row.name() + " is bad") << name;
  }
}

// A run's Failure (exit 1) through with_flag_names stays a Failure, in flag terms.
TEST(OptionNames, FailuresBecomeFlagsToo) {
  try {
    with_flag_names([]() -> int { FSDP_FAIL("a collective timed out; InitOptions::timeout (FSDP_TIMEOUT) sets "
                                            "this"); });
    ADD_FAILURE() << "nothing thrown";
  } catch (const UsageError& e) {
    ADD_FAILURE() << "a Failure became a UsageError: " << e.what();
  } catch (const Failure& e) {
    EXPECT_EQ(std::string(e.what()), "a collective timed out; --timeout (FSDP_TIMEOUT) sets this");
  }
}

}  // namespace
}  // namespace fsdp::cli

// The step-time model (fsdp/estimate.h) against schedules worked out by hand
// on the toy model, its invariants over the option matrix, its cluster files,
// and the per-unit FLOPs it is fed for Llama models.
#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/common/error.h"
#include "fsdp/estimate.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/registry.h"
#include "toy_models.h"

namespace fsdp {
namespace {

using testing::ToyConfig;

// The toy model: root (w_in 7x5, w_out 3x7: 56 elements) and three blocks of
// 195 elements (196 padded over 2 ranks: 784 bytes fp32).
std::shared_ptr<nn::UnitBase> toy() { return testing::make_toy(ToyConfig{}, /*meta=*/true, 0).ptr(); }

// Block: forward 1 s, backward 2 s; root: 0.1 s and 0.2 s.
UnitCompute toy_cost(const std::vector<UnitInfo>& entries) {
  if (entries.front().name.empty()) return {0.1, 0.2, -1};
  return {1.0, 2.0, -1};
}

// Two nodes of one process; a node's link moves 392 bytes per second, so a
// block's all-gather or reduce-scatter (each rank sends 392 bytes) takes 1 s
// alone on the network and the root's (112 bytes) 2/7 s. AdamW: 1 ms per element.
ClusterSpec two_nodes() {
  ClusterSpec c;
  c.name = "toy";
  c.nodes = 2;
  c.procs_per_node = 1;
  c.inter = {392, 0};
  c.intra = {1e12, 0};
  c.algorithm = CollectiveAlgorithm::kMesh;
  c.execution = Execution::kHost;
  c.optimizer_s_per_element = 1e-3;
  return c;
}

FsdpOptions options(ShardingStrategy s) {
  FsdpOptions o;
  o.strategy = s;
  o.wrap = WrapPolicy::every_unit();
  return o;
}

constexpr double kRoot = 112.0 / 392.0;  // the root's all-gather and reduce-scatter, seconds

TEST(Estimate, FullShardScheduleWorkedOutByHand) {
  // Forward: root gathered (exposed 2/7), then per block a gather exposed (1)
  // and its forward (1); the root's own forward 0.1. Backward: the root's 0.2;
  // block 3 gathered (exposed 1) with block 2 prefetched behind it; block 3's
  // backward (2), its reduce-scatter then shares the network with block 1's
  // prefetch (both take 2 s instead of 1); blocks 2 and 1 find their
  // parameters ready; the last reduce-scatter (1) and the root's (2/7) are
  // waited for at the end of backward. AdamW: 322 shard elements.
  const StepEstimate e =
      estimate_step(toy(), options(ShardingStrategy::kFullShard), two_nodes(), StepWorkload{}, toy_cost);
  const double compute = 3 * 1.0 + 0.1 + 0.2 + 3 * 2.0;
  const double exposed = kRoot + 3 * 1.0 + 1.0 + 1.0 + kRoot;
  const double optimizer = 322 * 1e-3;
  EXPECT_NEAR(e.compute_s, compute, 1e-9);
  EXPECT_NEAR(e.exposed_comm_s, exposed, 1e-9);
  EXPECT_NEAR(e.optimizer_s, optimizer, 1e-9);
  EXPECT_NEAR(e.step_time_s, compute + exposed + optimizer, 1e-9);
  ASSERT_EQ(e.units.size(), 4u);
  EXPECT_NEAR(e.units[1].all_gather_s, 1.0, 1e-12);
  EXPECT_NEAR(e.units[1].reduce_s, 1.0, 1e-12);
  EXPECT_EQ(e.units[0].gathers, 1);  // the root: gathered once
  EXPECT_EQ(e.units[1].gathers, 2);  // blocks: again in backward
  EXPECT_EQ(e.units[1].gather_bytes, 784);
}

TEST(Estimate, ConcurrentCollectivesShareTheLink) {
  // Blocks' backward 0.5 s, the root free: in backward the all-gathers of
  // blocks 2 and 1 (prefetched) share the network with the reduce-scatters of
  // blocks 3 and 2, each at half rate while both run. Waited for: 2/7 and 3 in
  // forward as above; block 3's gather 1; block 2's 1 (its second half shared);
  // block 1's 1.5 (shared with two reduce-scatters); block 1's reduce-scatter 1
  // and the root's 2/7 at the end of backward.
  const auto cost = [](const std::vector<UnitInfo>& e) {
    return e.front().name.empty() ? UnitCompute{0, 0, -1} : UnitCompute{1.0, 0.5, -1};
  };
  const StepEstimate e = estimate_step(toy(), options(ShardingStrategy::kFullShard), two_nodes(), StepWorkload{}, cost);
  const double exposed = kRoot + 3 * 1.0 + 1.0 + 1.0 + 1.5 + 1.0 + kRoot;
  EXPECT_NEAR(e.exposed_comm_s, exposed, 1e-9);
  EXPECT_NEAR(e.step_time_s, 4.5 + 0.322 + exposed, 1e-9);
}

TEST(Estimate, HostCpuPerByteIsSpentOnTheTrainingThread) {
  // Every byte a process sends or receives costs it 1 ms on the host: the
  // root's gather and reduce-scatter move 2 x 112 bytes each, a block's 2 x 392,
  // and blocks are gathered twice: 224 + 6 x 784 + 3 x 784 + 224 bytes.
  ClusterSpec c = two_nodes();
  c.host_cpu_s_per_byte = 1e-3;
  const StepEstimate e = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_NEAR(e.comm_cpu_s, (224 + 9 * 784 + 224) * 1e-3, 1e-9);
  EXPECT_NEAR(e.step_time_s, e.compute_s + e.comm_cpu_s + e.optimizer_s + e.exposed_comm_s, 1e-9);
  c.execution = Execution::kDevice;  // a GPU's bytes cost the host nothing
  EXPECT_EQ(estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost).comm_cpu_s, 0);
}

TEST(Estimate, ShardGradOpKeepsParametersThroughBackward) {
  // Forward as FULL_SHARD; backward gathers nothing: the reduce-scatters of
  // blocks 3 and 2 hide under the next backward, block 1's (1) and the
  // root's (2/7) are waited for.
  const StepEstimate e =
      estimate_step(toy(), options(ShardingStrategy::kShardGradOp), two_nodes(), StepWorkload{}, toy_cost);
  EXPECT_NEAR(e.exposed_comm_s, kRoot + 3 * 1.0 + 1.0 + kRoot, 1e-9);
  EXPECT_EQ(e.units[1].gathers, 1);
}

TEST(Estimate, ForwardPrefetchHidesForwardGathers) {
  FsdpOptions o = options(ShardingStrategy::kFullShard);
  const StepEstimate plain = estimate_step(toy(), o, two_nodes(), StepWorkload{}, toy_cost);
  o.forward_prefetch = true;
  const StepEstimate pre = estimate_step(toy(), o, two_nodes(), StepWorkload{}, toy_cost);
  // Block 1's gather is still exposed; blocks 2 and 3 were gathered while the previous computed.
  EXPECT_NEAR(plain.exposed_comm_s - pre.exposed_comm_s, 2.0, 1e-9);
}

TEST(Estimate, OneProcessCommunicatesNothing) {
  ClusterSpec c = two_nodes();
  c.nodes = 1;
  const StepEstimate e = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_EQ(e.exposed_comm_s, 0);
  EXPECT_EQ(e.comm_s, 0);
  EXPECT_NEAR(e.step_time_s, 9.3 + (3 * 195 + 56) * 1e-3, 1e-9);
}

TEST(Estimate, HybridShardsWithinANodeAndAllReducesAcrossNodes) {
  ClusterSpec c = two_nodes();
  c.procs_per_node = 2;
  FsdpOptions o = options(ShardingStrategy::kHybridShard);  // hybrid_shard_size 0: one node
  const StepEstimate e = estimate_step(toy(), o, c, StepWorkload{}, toy_cost);
  EXPECT_EQ(e.shard_size, 2);
  EXPECT_EQ(e.replicas, 2);
  // Shard groups inside a node: loopback only (1e12 B/s): next to nothing.
  EXPECT_LT(e.units[1].all_gather_s, 1e-6);
  // A block's gradient shard (98 fp32 = 392 bytes) all-reduced with the other
  // node: each process sends half of it in the reduce-scatter and half in the
  // all-gather, both processes of a node at once: 784 bytes over the link.
  EXPECT_NEAR(e.units[1].replica_all_reduce_s, 2.0, 1e-12);
  // FULL_SHARD over the same 4 ranks crosses the slow link with every all-gather instead.
  const StepEstimate full = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_GT(full.units[1].all_gather_s, 0.5);
}

// FSDP2's reshard_after_forward read from the schedule: HYBRID with false
// (FSDP1's _HYBRID_SHARD_ZERO2) gathers each block once a step; an int (hpZ)
// over the ranks of one node makes backward's gathers stay inside the node,
// where FULL_SHARD's cross the slow link again.
TEST(Estimate, PerUnitReshardChangesWhatIsGatheredAndWhere) {
  ClusterSpec c = two_nodes();
  c.procs_per_node = 2;
  c.intra = {1e12, 0};
  FsdpOptions zero2 = options(ShardingStrategy::kHybridShard);
  zero2.hybrid_shard_size = 2;
  zero2.reshard_after_forward = ReshardAfterForward(false);
  const StepEstimate z = estimate_step(toy(), zero2, c, StepWorkload{}, toy_cost);
  EXPECT_EQ(z.units[1].gathers, 1);
  const StepEstimate full = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  FsdpOptions hpz = options(ShardingStrategy::kFullShard);
  hpz.reshard_after_forward = ReshardAfterForward::to_group(2);  // the node's two processes
  const StepEstimate h = estimate_step(toy(), hpz, c, StepWorkload{}, toy_cost);
  EXPECT_EQ(h.units[1].gathers, 2);
  EXPECT_EQ(full.units[1].gathers, 2);
  EXPECT_LT(h.exposed_comm_s, full.exposed_comm_s - 0.5);  // backward's gathers no longer cross the link
  EXPECT_EQ(h.units[1].all_gather_s, full.units[1].all_gather_s);  // forward's gather is the same
}

TEST(Estimate, StepIsComputePlusOptimizerPlusExposedOnTheHost) {
  // On the host every second of the step is compute, the optimizer, or a wait.
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    for (auto p : {BackwardPrefetch::kNone, BackwardPrefetch::kPre, BackwardPrefetch::kPost}) {
      for (bool fwd : {false, true}) {
        for (bool ckpt : {false, true}) {
          for (int accum : {1, 3}) {
            FsdpOptions o = options(s);
            o.backward_prefetch = p;
            o.forward_prefetch = fwd;
            o.checkpoint_all_units = ckpt;
            ClusterSpec c = two_nodes();
            c.procs_per_node = 2;
            c.intra = {2000, 1e-3};
            c.inter.latency_s = 1e-2;
            c.host_cpu_s_per_byte = 1e-5;
            StepWorkload w;
            w.grad_accum = accum;
            const StepEstimate e = estimate_step(toy(), o, c, w, toy_cost);
            SCOPED_TRACE(::testing::Message() << to_string(s) << " prefetch " << to_string(p) << " fwd " << fwd
                                              << " ckpt " << ckpt << " accum " << accum);
            EXPECT_NEAR(e.step_time_s, e.compute_s + e.comm_cpu_s + e.optimizer_s + e.exposed_comm_s, 1e-9);
            EXPECT_NEAR(e.compute_s, accum * (9.3 + (ckpt ? 3.0 : 0.0)), 1e-9);
            EXPECT_GE(e.exposed_comm_s, 0);
            EXPECT_LE(e.exposed_comm_s, e.comm_s + 1e-9);
          }
        }
      }
    }
  }
}

TEST(Estimate, ScalingEfficiencyAgainstOneNode) {
  ClusterSpec c = two_nodes();
  c.procs_per_node = 2;
  c.intra = {1e12, 0};
  c.optimizer_s_per_element = 0;  // (smaller shards on more ranks would make the optimizer faster)
  const StepEstimate slow = estimate_scaling(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_LT(slow.scaling_efficiency, 0.8);  // every gather crosses the slow link
  c.inter.bytes_per_s = 1e12;
  const StepEstimate fast = estimate_scaling(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_NEAR(fast.scaling_efficiency, 1.0, 1e-6);
  EXPECT_NEAR(fast.tokens_per_s, 4 * fast.tokens_per_s_per_process, 1e-9);
}

TEST(Estimate, MfuFromThePeak) {
  ClusterSpec c = two_nodes();
  StepWorkload w;
  w.batch_size = 2;
  w.seq_len = 10;
  w.model_flops_per_token = 100;
  EXPECT_LT(estimate_step(toy(), options(ShardingStrategy::kFullShard), c, w, toy_cost).mfu, 0);  // no peak: unknown
  c.peak_flops = 1000;
  const StepEstimate e = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, w, toy_cost);
  EXPECT_NEAR(e.mfu, 20.0 / e.step_time_s * 100 / 1000, 1e-12);
}

TEST(Estimate, RingAndMeshVolumes) {
  // One 8-process node, NVLink-like: a ring moves S (W-1)/W per process, so does a mesh.
  ClusterSpec c = two_nodes();
  c.nodes = 1;
  c.procs_per_node = 8;
  c.intra = {1000, 0};
  c.algorithm = CollectiveAlgorithm::kRing;
  FsdpOptions o = options(ShardingStrategy::kFullShard);
  const StepEstimate ring = estimate_step(toy(), o, c, StepWorkload{}, toy_cost);
  // The block pads to 200 elements over 8 ranks: 800 bytes; 7/8 of it at 1000 B/s.
  EXPECT_NEAR(ring.units[1].all_gather_s, 800.0 * 7 / 8 / 1000, 1e-12);
  c.algorithm = CollectiveAlgorithm::kMesh;
  const StepEstimate mesh = estimate_step(toy(), o, c, StepWorkload{}, toy_cost);
  EXPECT_NEAR(mesh.units[1].all_gather_s, 800.0 * 7 / 8 / 1000, 1e-12);
  // Two such nodes: a ring's node link carries S (W-1)/W, a mesh's g S (n-1)/n = 8 x (S/16) x 8 = 4 S.
  c.nodes = 2;
  c.inter = {1000, 0};
  const StepEstimate mesh2 = estimate_step(toy(), o, c, StepWorkload{}, toy_cost);  // 208 padded: 832 bytes
  EXPECT_NEAR(mesh2.units[1].all_gather_s, 8 * (832.0 / 16) * 8 / 1000, 1e-12);
  c.algorithm = CollectiveAlgorithm::kRing;
  const StepEstimate ring2 = estimate_step(toy(), o, c, StepWorkload{}, toy_cost);
  EXPECT_NEAR(ring2.units[1].all_gather_s, 832.0 * 15 / 16 / 1000, 1e-12);
}

TEST(Estimate, ClusterFiles) {
  const ClusterSpec p5 = cluster_preset("p5.48xlarge", at::kBFloat16);
  EXPECT_EQ(p5.procs_per_node, 8);
  EXPECT_NEAR(p5.peak_flops, 989.4e12, 1e9);
  EXPECT_NEAR(cluster_preset("h100", at::kFloat).peak_flops, 66.9e12, 1e9);
  EXPECT_FALSE(p5.notes.empty());
  // Note [Device roofline]: the H200's products as measured, attention and memory as stated.
  const ClusterSpec h200 = cluster_preset("h200", at::kBFloat16);
  EXPECT_NEAR(h200.matmul_flops, 791.6e12, 1e9);
  EXPECT_NEAR(h200.attention_flops, 0.35 * 989.4e12, 1e9);
  EXPECT_NEAR(h200.memory_bytes_per_s, 0.8 * 4.8e12, 1e6);
  const ClusterSpec h200_back = cluster_from_json(cluster_to_json(h200), ClusterSpec{}, "test");
  EXPECT_NEAR(h200_back.matmul_flops, h200.matmul_flops, 1e3);
  EXPECT_NEAR(h200_back.attention_flops, h200.attention_flops, 1e3);
  EXPECT_NEAR(h200_back.memory_bytes_per_s, h200.memory_bytes_per_s, 1e-3);
  EXPECT_THROW(cluster_from_json(R"({"memory_gbyte_per_s": -1})", ClusterSpec{}, "f.json"), UsageError);
  // FP8 products: the data sheet's dense FP8 peak (1978.9) at the bf16 fraction; the A100 has none.
  EXPECT_NEAR(h200.fp8_matmul_flops, 1978.9e12 * 791.6 / 989.4, 1e9);
  EXPECT_EQ(cluster_preset("a100", at::kBFloat16).fp8_matmul_flops, 0);
  EXPECT_NEAR(cluster_from_json(cluster_to_json(h200), ClusterSpec{}, "test").fp8_matmul_flops, h200.fp8_matmul_flops,
              1e3);
  EXPECT_NEAR(cluster_from_json(R"({"fp8_matmul_tflops": 1234.5})", ClusterSpec{}, "f.json").fp8_matmul_flops,
              1234.5e12, 1e3);
  try {
    cluster_from_json(R"({"fp8_matmul_tflops": -1})", ClusterSpec{}, "f.json");
    ADD_FAILURE() << "a negative fp8_matmul_tflops was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("f.json: 'fp8_matmul_tflops' must be in [0, "), std::string::npos) << what;
    EXPECT_NE(what.find("got -1"), std::string::npos) << what;
  }
  EXPECT_THROW(cluster_from_json(R"({"matmul_tflops": "fast"})", ClusterSpec{}, "f.json"), UsageError);
  const ClusterSpec back = cluster_from_json(cluster_to_json(p5), ClusterSpec{}, "test");
  EXPECT_EQ(back.procs_per_node, 8);
  EXPECT_NEAR(back.inter.bytes_per_s, p5.inter.bytes_per_s, 1);
  EXPECT_EQ(back.algorithm, CollectiveAlgorithm::kRing);
  EXPECT_THROW(cluster_preset("dgx-9000", at::kFloat), UsageError);
  EXPECT_THROW(cluster_from_json(R"({"nodes": 2, "inter_gbps": 3})", ClusterSpec{}, "f.json"), UsageError);
  EXPECT_THROW(cluster_from_json(R"({"nodes": "two"})", ClusterSpec{}, "f.json"), UsageError);
  EXPECT_THROW(cluster_from_json(R"({"inter": {"gbit_per_s": -1}})", ClusterSpec{}, "f.json"), UsageError);
  EXPECT_THROW(cluster_from_json("[1", ClusterSpec{}, "f.json"), UsageError);
  const ClusterSpec partial = cluster_from_json(R"({"inter": {"gbit_per_s": 0.1}})", p5, "f.json");
  EXPECT_NEAR(partial.inter.bytes_per_s, 0.1e9 / 8, 1e-3);
  EXPECT_EQ(partial.procs_per_node, 8);  // the rest from the base
  ClusterSpec bad = two_nodes();
  bad.inter.bytes_per_s = 0;
  EXPECT_THROW(estimate_step(toy(), options(ShardingStrategy::kFullShard), bad, StepWorkload{}, toy_cost), UsageError);
}

// A third of the training FLOPs per token, unit by unit: the per-unit counts
// the presets' estimate uses add up to the count MFU uses.
TEST(Estimate, LlamaUnitFlopsAddUpToTheModelCount) {
  for (const char* name : {"tiny", "llama3.1-8b", "llama3.2-1b", "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    const models::LlamaConfig cfg = models::resolve_model_config(name);
    auto m = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
    std::vector<std::pair<std::string, std::vector<int64_t>>> params;
    for (const auto& p : m->named_parameters(true)) params.emplace_back(p.key(), p.value().sizes().vec());
    const int64_t T = 512;
    EXPECT_NEAR(3 * cfg.forward_flops_per_token(params, T) / cfg.training_flops_per_token(T), 1.0, 1e-12);
  }
}

// Note [Counted work]: what Llama's unit_work counts agrees with the FLOPs MFU
// counts (products: 6 x the matrix weights; attention: the causal half of its
// 12 L H Dh T, backward 2.5 x forward), and each recompute policy runs the
// forward less what it skips.
TEST(Estimate, LlamaCountedWorkAgreesWithTheFlopCount) {
  for (const char* name : {"tiny", "llama3.2-1b"}) {
    SCOPED_TRACE(name);
    const models::LlamaConfig cfg = models::resolve_model_config(name);
    auto m = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
    std::vector<std::pair<std::string, std::vector<int64_t>>> all, layer;
    for (const auto& p : m->named_parameters(true)) {
      all.emplace_back(p.key(), p.value().sizes().vec());
      if (p.key().rfind("model.layers.0.", 0) == 0) layer.emplace_back(p.key(), p.value().sizes().vec());
    }
    models::WorkShape shape;
    shape.seq_len = 512;
    shape.tokens = 4 * shape.seq_len;
    shape.loss_chunk_rows = 1024;
    const double N = static_cast<double>(shape.tokens), T = static_cast<double>(shape.seq_len);
    const double L = static_cast<double>(cfg.num_hidden_layers), H = static_cast<double>(cfg.num_attention_heads);
    const double D = static_cast<double>(cfg.hidden_size), F = static_cast<double>(cfg.intermediate_size);
    const double attention = 12 * L * H * static_cast<double>(cfg.dh()) * T;
    const models::UnitWork w = *cfg.unit_work(all, true, shape);
    EXPECT_NEAR((w.forward.product_flops + w.backward.product_flops) / N,
                cfg.training_flops_per_token(shape.seq_len) - attention, 1e-6);
    EXPECT_NEAR((w.forward.attention_flops + w.backward.attention_flops) / N, attention * 7 / 12, 1e-6);
    EXPECT_GT(w.forward.memory_bytes, 0);
    EXPECT_GT(w.backward.memory_bytes, w.forward.memory_bytes);
    EXPECT_EQ(w.recompute.product_flops + w.recompute.memory_bytes, 0);  // not checkpointed
    // A checkpointed layer, each policy.
    shape.checkpointed = true;
    shape.policy = nn::RecomputePolicy::kFull;
    const models::UnitWork full = *cfg.unit_work(layer, true, shape);
    EXPECT_EQ(full.recompute.product_flops, full.forward.product_flops);
    EXPECT_EQ(full.recompute.memory_bytes, full.forward.memory_bytes);
    shape.policy = nn::RecomputePolicy::kTail;
    const models::UnitWork tail = *cfg.unit_work(layer, true, shape);
    EXPECT_NEAR(full.recompute.product_flops - tail.recompute.product_flops, 2 * D * F * N, 1e-3);  // down_proj
    EXPECT_NEAR(full.recompute.memory_bytes - tail.recompute.memory_bytes, 3 * 2 * D * N, 1e-3);   // its residual
    EXPECT_EQ(tail.recompute.attention_flops, tail.forward.attention_flops);
    shape.policy = nn::RecomputePolicy::kSelective;
    const models::UnitWork sel = *cfg.unit_work(layer, true, shape);
    const double qkvo = 2 * (2 * D * H * static_cast<double>(cfg.dh()) +
                             2 * D * static_cast<double>(cfg.num_key_value_heads * cfg.dh()));
    EXPECT_NEAR(tail.recompute.product_flops - sel.recompute.product_flops, qkvo * N, 1e-3);
    EXPECT_EQ(sel.recompute.attention_flops, sel.forward.attention_flops);  // CUDA recomputes attention
  }
  EXPECT_FALSE(models::resolve_model_config("tiny-mixtral").unit_work({}, true, models::WorkShape{}).has_value());
}

// Layer 0 of a Llama preset's parameters (names and shapes as the plan gives them).
std::vector<std::pair<std::string, std::vector<int64_t>>> layer_params(const models::LlamaConfig& cfg,
                                                                      const std::string& prefix) {
  auto m = std::make_shared<models::LlamaForCausalLMImpl>(cfg, at::TensorOptions().device(at::kMeta), 0);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : m->named_parameters(true)) {
    if (p.key().rfind(prefix, 0) == 0) out.emplace_back(p.key(), p.value().sizes().vec());
  }
  return out;
}

// One micro-batch of 2 x 64 tokens.
models::WorkShape micro_batch() {
  models::WorkShape shape;
  shape.seq_len = 64;
  shape.tokens = 128;
  return shape;
}

// Note [Counted work], --fp8-linear rowwise: on tiny's o_proj (M = K = 128)
// for N = 128 tokens, the quantization's bytes worked out by hand.
TEST(Estimate, Fp8LinearCountWorkedOutByHand) {
  const models::LlamaConfig cfg = models::resolve_model_config("tiny");  // D 128, F 384, H 4, Hkv 2, Dh 32
  const std::vector<std::pair<std::string, std::vector<int64_t>>> o_proj = {
      {"model.layers.0.self_attn.o_proj.weight", {128, 128}}};
  models::WorkShape shape = micro_batch();
  const models::UnitWork bf16 = *cfg.unit_work(o_proj, true, shape);
  shape.fp8_linears = true;
  const models::UnitWork fp8 = *cfg.unit_work(o_proj, true, shape);
  // Products: forward's and d x in FP8 (2 M K N = 4,194,304 each), d W in bf16.
  EXPECT_EQ(bf16.forward.product_flops, 4194304);
  EXPECT_EQ(fp8.forward.product_flops, 0);
  EXPECT_EQ(fp8.forward.fp8_product_flops, 4194304);
  EXPECT_EQ(fp8.backward.fp8_product_flops, 4194304);
  EXPECT_EQ(fp8.backward.product_flops, 4194304);
  EXPECT_EQ(bf16.backward.product_flops, 2 * 4194304);
  // bf16 quantization, one kernel: 2a + 1 = 5 bytes per element, 4 per row. Forward: x, 128 rows of 128
  // (128 x (5 x 128 + 4) = 82,432), and W, 128 rows of 128 (the same): 164,864.
  EXPECT_DOUBLE_EQ(fp8.forward.memory_bytes - bf16.forward.memory_bytes, 164864);
  // Backward: d y as x (82,432), W^T made contiguous (2 x 2 x 128 x 128 = 65,536) and quantized (82,432).
  EXPECT_DOUBLE_EQ(fp8.backward.memory_bytes - bf16.backward.memory_bytes, 230400);
  // fp32 compute: 9 bytes per element, and _scaled_mm's bf16 output cast to fp32 (6 bytes per element
  // of y: 98,304): 2 x 128 x (9 x 128 + 4) + 98,304.
  shape.activation_bytes = 4;
  const models::UnitWork fp32 = *cfg.unit_work(o_proj, true, shape);
  shape.fp8_linears = false;
  EXPECT_DOUBLE_EQ(fp32.forward.memory_bytes - cfg.unit_work(o_proj, true, shape)->forward.memory_bytes, 394240);
  // A frozen weight runs in the compute dtype (LinearImpl::runs_fp8), as the head does.
  shape.activation_bytes = 2;
  shape.fp8_linears = true;
  const models::UnitWork frozen = *cfg.unit_work(o_proj, false, shape);
  EXPECT_EQ(frozen.forward.fp8_product_flops + frozen.backward.fp8_product_flops, 0);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> head = {{"lm_head.weight", {512, 128}}};
  EXPECT_EQ(cfg.unit_work(head, true, shape)->forward.fp8_product_flops, 0);
  shape.fp8_linears = false;
  EXPECT_EQ(cfg.unit_work(head, true, shape)->forward.product_flops, 2 * 3 * 512 * 128 * 128);
}

// A whole layer in FP8: every decoder product moves to the FP8 class, and
// recomputation runs tail's 6, full's 7 and selective's 2 products in FP8.
TEST(Estimate, Fp8LinearLayerAndRecomputePolicies) {
  const models::LlamaConfig cfg = models::resolve_model_config("tiny");
  const auto layer = layer_params(cfg, "model.layers.0.");
  models::WorkShape shape = micro_batch();
  const models::UnitWork bf16 = *cfg.unit_work(layer, true, shape);
  shape.fp8_linears = true;
  const models::UnitWork fp8 = *cfg.unit_work(layer, true, shape);
  EXPECT_EQ(fp8.forward.product_flops, 0);
  EXPECT_EQ(fp8.forward.fp8_product_flops, bf16.forward.product_flops);
  EXPECT_EQ(fp8.backward.fp8_product_flops + fp8.backward.product_flops, bf16.backward.product_flops);
  EXPECT_EQ(fp8.forward.attention_flops, bf16.forward.attention_flops);
  // Per token, each product 2 x its weight: q, o 128 x 128; k, v 64 x 128; gate, up, down 384 x 128.
  const double N = 128, q = 2 * 128 * 128, kv = 2 * 64 * 128, mlp = 2 * 384 * 128;
  shape.checkpointed = true;
  for (const auto& [policy, products] :
       {std::pair{nn::RecomputePolicy::kFull, 2 * q + 2 * kv + 3 * mlp},
        std::pair{nn::RecomputePolicy::kTail, 2 * q + 2 * kv + 2 * mlp},  // all but down_proj
        std::pair{nn::RecomputePolicy::kSelective, 2 * mlp}}) {           // gate and up
    SCOPED_TRACE(nn::to_string(policy));
    shape.policy = policy;
    const models::UnitWork w = *cfg.unit_work(layer, true, shape);
    EXPECT_EQ(w.recompute.fp8_product_flops, products * N);
    EXPECT_EQ(w.recompute.product_flops, 0);
    for (bool fused : {false, true}) {  // the fused kernels change no product's count
      models::WorkShape b = shape;
      b.fp8_linears = false;
      b.kernels = fused ? models::LayerKernels::kFused : models::LayerKernels::kReference;
      EXPECT_EQ(cfg.unit_work(layer, true, b)->recompute.product_flops, products * N);
    }
  }
}

// Note [Counted work], --kernels fused: what the fused kernels save on tiny
// (a = 2 bytes, D 128, F 384, H 4, Hkv 2, Dh 32, V 512), per token.
TEST(Estimate, FusedKernelsCountWorkedOutByHand) {
  const models::LlamaConfig cfg = models::resolve_model_config("tiny");
  const auto layer = layer_params(cfg, "model.layers.0.");
  models::WorkShape shape = micro_batch();
  const models::UnitWork ref = *cfg.unit_work(layer, true, shape);
  shape.kernels = models::LayerKernels::kFused;
  const models::UnitWork fused = *cfg.unit_work(layer, true, shape);
  const double N = 128;
  EXPECT_EQ(fused.forward.product_flops, ref.forward.product_flops);
  EXPECT_EQ(fused.backward.product_flops, ref.backward.product_flops);
  EXPECT_EQ(fused.backward.attention_flops, ref.backward.attention_flops);
  // Forward: two norms (28 + 4a - 2a) D = 8,192; rotary over q and k (10a - 2a) 192 = 3,072; SwiGLU
  // (5a - 3a) F = 1,536; v copied out of the q|k|v product, -2a Hkv Dh = -256.
  EXPECT_DOUBLE_EQ(ref.forward.memory_bytes - fused.forward.memory_bytes, (8192 + 3072 + 1536 - 256) * N);
  // Backward: norms 2 (76 + 8a - 5a) D = 20,992; rotary (17a - 2a) 192 = 5,760; SwiGLU (9a - 7a) F = 1,536;
  // q, k, v's input: the sum 6a D against the split undone 2a (H + 2 Hkv) Dh, 512; gate and up's:
  // 3a D against 4a F, -2,304.
  EXPECT_DOUBLE_EQ(ref.backward.memory_bytes - fused.backward.memory_bytes, (20992 + 5760 + 1536 + 512 - 2304) * N);
  // The loss: (44 + 2a) against 3a per row of the vocabulary, 42 x 512 per token.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> head = {{"lm_head.weight", {512, 128}}};
  shape.kernels = models::LayerKernels::kReference;
  const double ref_loss = cfg.unit_work(head, true, shape)->forward.memory_bytes;
  shape.kernels = models::LayerKernels::kFused;
  EXPECT_DOUBLE_EQ(ref_loss - cfg.unit_work(head, true, shape)->forward.memory_bytes, 42 * 512 * N);
  // With FP8 linears the products run apart: the reference's sums of the shared input's gradients return.
  shape.fp8_linears = true;
  const models::UnitWork both = *cfg.unit_work(layer, true, shape);
  shape.kernels = models::LayerKernels::kReference;
  const models::UnitWork fp8_ref = *cfg.unit_work(layer, true, shape);
  // And k, v and up reuse the quantization of their shared input: 3 x (5 x 128 + 4) per token.
  EXPECT_DOUBLE_EQ(fp8_ref.forward.memory_bytes - both.forward.memory_bytes, (8192 + 3072 + 1536 + 3 * 644) * N);
  EXPECT_DOUBLE_EQ(fp8_ref.backward.memory_bytes - both.backward.memory_bytes, (20992 + 5760 + 1536) * N);
}

// Note [Device roofline]: with a memory bandwidth, every gather's cast of the
// shard and every reduction's copy into the gradient shard are memory-bound
// compute, counted per collective the schedule issues.
TEST(Estimate, EngineCastsAreMemoryBoundCompute) {
  ClusterSpec c = two_nodes();
  const StepEstimate plain = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  EXPECT_EQ(plain.compute_classes.total(), 0);
  c.memory_bytes_per_s = 1e6;
  const StepEstimate e = estimate_step(toy(), options(ShardingStrategy::kFullShard), c, StepWorkload{}, toy_cost);
  // A block: 196 padded elements, 98 per rank, fp32 shard into fp32 (4 + 4 bytes) per gather, the
  // gradient (4 + 4) per reduction; the root 56 elements, 28 per rank.
  double expected = 0;
  for (const UnitEstimate& u : e.units) {
    const double shard = u.name.empty() ? 28 : 98;
    expected += (u.gathers + 1) * shard * 8 / 1e6;
  }
  EXPECT_NEAR(e.compute_classes.memory_s, expected, 1e-12);
  EXPECT_NEAR(e.compute_s - plain.compute_s, expected, 1e-12);
}

}  // namespace
}  // namespace fsdp

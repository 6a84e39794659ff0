#include "fsdp/models/llama_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"

namespace fsdp::models {

std::optional<int64_t> LlamaConfig::layer_window(int64_t layer) const {
  if (model_type == "mistral" || model_type == "mixtral") return sliding_window;
  if (per_layer_attention() && layer >= 0 && layer < static_cast<int64_t>(layer_types.size()) &&
      layer_types[static_cast<size_t>(layer)] == "sliding_attention") {
    return sliding_window;
  }
  return std::nullopt;
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t D = hidden_size, F = intermediate_size, H = num_attention_heads, Hkv = num_key_value_heads;
  const int64_t Dh = dh(), L = num_hidden_layers, V = vocab_size;
  const int64_t attention = D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + (qkv_bias() ? (H + 2 * Hkv) * Dh : 0) +
                            (o_bias() ? D : 0) + (qk_norm() ? 2 * Dh : 0);
  const int64_t mlp = moe() ? num_local_experts * 3 * D * F + num_local_experts * D : 3 * D * F;
  const int64_t norms = 2 * D;
  return V * D + L * (attention + mlp + norms) + D + (tie_word_embeddings ? 0 : V * D);
}

int64_t LlamaConfig::active_parameters() const {
  if (!moe()) return num_parameters();
  // The E - K experts a token does not visit, in every layer.
  return num_parameters() - num_hidden_layers * (num_local_experts - num_experts_per_tok) * 3 * hidden_size *
                                intermediate_size;
}

double LlamaConfig::training_flops_per_token(int64_t seq_len) const {
  const double D = static_cast<double>(hidden_size), F = static_cast<double>(intermediate_size);
  const double H = static_cast<double>(num_attention_heads), Hkv = static_cast<double>(num_key_value_heads);
  const double Dh = static_cast<double>(dh()), L = static_cast<double>(num_hidden_layers);
  // Per token: the dense MLP, or K experts plus the (E, D) router.
  const double mlp = moe() ? static_cast<double>(num_experts_per_tok) * 3 * D * F +
                                 static_cast<double>(num_local_experts) * D
                           : 3 * D * F;
  const double matmul_weights = L * (D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + mlp) +
                                D * static_cast<double>(vocab_size);
  return 6 * matmul_weights + 12 * L * H * Dh * static_cast<double>(seq_len);
}

double LlamaConfig::forward_flops_per_token(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                            int64_t seq_len) const {
  double flops = 0;
  for (const auto& [name, shape] : params) {
    if (shape.size() != 2) continue;  // norms, biases: no matrix product
    double numel = static_cast<double>(shape[0]) * static_cast<double>(shape[1]);
    if (ends_with(name, "embed_tokens.weight")) {
      if (!tie_word_embeddings) continue;  // a lookup; tied, it is also the LM head
    } else if (name.find(".experts.") != std::string::npos && moe()) {
      numel *= static_cast<double>(num_experts_per_tok) / static_cast<double>(num_local_experts);
    }
    flops += 2 * numel;
    if (ends_with(name, "self_attn.q_proj.weight")) {
      flops += 4 * static_cast<double>(num_attention_heads) * static_cast<double>(dh()) * static_cast<double>(seq_len);
    }
  }
  return flops;
}

// Note [Counted work]
// What unit_work counts, per token of a micro-batch unless said; a = bytes of
// an activation element (bf16: 2), fp32 statistics 4. Memory-bound kernels are
// taken to read their inputs and write their outputs once (the roofline's
// floor) except where a kernel is known to read more (the vocabulary's softmax).
// The operations are those llama.cpp, layers.cpp (RMSNorm: --kernels
// reference, the default), chunked_loss.cpp and the engine run; backward
// counts what autograd's formulas for them read and write.
//  products      2 x each 2-D weight forward; backward twice that (input and
//                weight gradients), once for frozen weights. The untied
//                embedding table is a lookup. The head's products all run in
//                the loss's forward (Note [Chunked cross-entropy]): logits,
//                d hidden and, when trainable, d W; none in its backward.
//  attention     causal flash attention: 2 x H x Dh x T forward (half of the
//                two T x T products), backward 2.5 x that (it recomputes the
//                scores: five products against two).
//  RMSNorm (n)   forward (28 + 4a) n: cast to fp32 (a + 4), square (8), mean
//                (4), scale (8), cast back (4 + a), times the weight (2a).
//                Backward (76 + 8a) n: the weight's product (2a) and its
//                gradient (product and reduction over rows, 4a), cast (a + 4),
//                the scale's two gradients (8; 12 + 4 reduced), the mean's
//                (4), the square's (x.pow(1), times 2, times the gradient:
//                28), the sum of x's two gradients (12), cast back (4 + a).
//  rotary (e)    q (H x Dh) and k (Hkv x Dh): forward 10a e (x cos 2a, the
//                negated half a, cat 2a, x sin 2a, sum 3a); backward 17a e
//                (x sin 2a, negated half a, each half's narrow backward:
//                zeros and copy 4a, their sum 3a, x cos 2a, its sum 3a, and
//                the gradient, laid out per head, copied back to the
//                product's (B, T, H x Dh) layout by the view's backward 2a).
//  attention's   backward only: d q summed in fp32 (zeroed 4, converted
//  memory        4 + a), the dot of d out and out (2a), and with grouped
//                heads d k, d v formed per query head and summed over the
//                group (read 2a H Dh, write 2a Hkv Dh).
//  residual      each of the two: forward 3a D; backward the sum of the
//                residual's two gradients 3a D. q, k, v share their input
//                (two sums, 6a D), gate and up theirs (3a D).
//  SwiGLU (F)    forward 5a F (silu 2a, product 3a); backward 9a F.
//  embedding     forward 2a D (rows gathered); backward 2a D and, per
//                micro-batch, the (V, D) gradient zeroed (a V D); tied and
//                trainable, that and the loss's d W summed (3a V D).
//  loss (V)      per row of the vocabulary: logits cast to fp32 (a + 4),
//                log-softmax (16: a 128k row exceeds shared memory, so the
//                kernel reads it three times: max, sum, output), zeros for
//                nll's gradient (4), log-softmax backward (16: the gradient
//                read twice), cast back (4 + a) — all in the loss's forward.
//                Per micro-batch: d W summed over chunks in fp32 (12 V D per
//                chunk after the first), rounded once ((4 + a) V D); backward
//                scales d hidden (2a D) and d W (2a V D) by the upstream gradient.
//  gradients     per trainable element P: the engine's flat gradient zeroed
//                (a) and each weight's gradient added into it (3a).
// --kernels fused (LayerKernels::kFused) replaces, per element:
//  RMSNorm (n)   at::_fused_rms_norm: forward 2a n (x read, y written);
//                backward 5a n (d x's kernel reads d y and x and writes d x,
//                the weight's gradient kernel reads d y and x again). Its fp32
//                statistic, one per row, is not counted.
//  rotary (e)    one kernel each way (Note [Rotary as one elementwise
//                kernel]): forward 2a e, backward 2a e.
//  SwiGLU (F)    forward 3a F (gate and up read, the product written);
//                backward 7a F (d gate: d out, gate, up read, written 4a; d
//                up: d out, gate read, written 3a).
//  shared input  q|k|v and gate|up run as one product each (Note [Fused
//                products over the flat parameter]): no sums of the shared
//                input's gradients (the 6a D and 3a D above); instead the outputs'
//                split is undone in backward by a concatenation of their
//                gradients (2a (H + 2 Hkv) Dh, 4a F), and forward copies v
//                out of the q|k|v output (2a Hkv Dh). Where an FP8 linear, a
//                LoRA adapter or a frozen weight keeps the products apart, the
//                reference's sums stay.
//  loss (V)      the gradient written over the logits by one online-softmax
//                kernel (Note [Fused cross-entropy]): each row read twice
//                and written once, 3a per row of the vocabulary, in place of
//                (44 + 2a). (The CPU's fp32 runs LibTorch's operations, about
//                12a; the roofline counts the kernel.)
// --fp8-linear rowwise (WorkShape::fp8_linears; Note [FP8 rowwise linears]
// in src/models/fp8.cpp) runs each trainable decoder product (q, k, v, o,
// gate, up, down; both sizes multiples of 16) with e4m3 operands: forward's
// product and backward's d x are FP8 products (fp8_product_flops, 2 x the
// weight each), d W stays in the compute dtype (product_flops). Every
// operand is quantized per row by one kernel (fp8.cpp's quantize_rowwise,
// Note [Row kernels]): read twice and written in e4m3, q = 2a + 1 bytes per
// element (5 in bf16), and its fp32 inverse scale, 4 per row. Forward
// quantizes x (q K + 4 per token; under --kernels fused once for q, k and
// v and once for gate and up, Note [One quantization of a shared input]) and
// W (q M K + 4 M per micro-batch); backward d y (q M + 4 per token), W^T
// made contiguous (2a M K) and quantized (q M K + 4 K per micro-batch).
// _scaled_mm writes bf16: in fp32 compute its output is cast ((2 + a) per
// element, forward's y and backward's d x). The head, the embedding and
// frozen or adapted weights run as without FP8.
// Recomputation (checkpointed layers) is the forward minus what the policy
// skips (Note [Recompute policy]): tail skips down_proj and the residual sum
// after it; selective also q, k, v and o's products (on CUDA attention is
// recomputed under every policy), with their FP8 quantization.
namespace {

// The bytes quantize_rowwise's kernel moves for a (rows, cols) operand of `a` bytes per element.
double fp8_quantized_bytes(double rows, double cols, double a) { return (2 * a + 1) * rows * cols + 4 * rows; }

// Whether the product of weight `name` reuses another's quantization of its
// input (Note [One quantization of a shared input]): under --kernels fused, k
// and v reuse q's when q runs in FP8 (`q_fp8`), up reuses gate's (`gate_fp8`).
bool reuses_fp8_input(const std::string& name, bool q_fp8, bool gate_fp8) {
  return (q_fp8 && (ends_with(name, "self_attn.k_proj.weight") || ends_with(name, "self_attn.v_proj.weight"))) ||
         (gate_fp8 && ends_with(name, "mlp.up_proj.weight"));
}

}  // namespace

std::optional<UnitWork> LlamaConfig::unit_work(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                               bool trainable, const WorkShape& shape) const {
  if (moe()) return std::nullopt;
  const double a = static_cast<double>(shape.activation_bytes);
  const double N = static_cast<double>(shape.tokens), T = static_cast<double>(shape.seq_len);
  const double H = static_cast<double>(num_attention_heads), Hkv = static_cast<double>(num_key_value_heads);
  const double Dh = static_cast<double>(dh()), D = static_cast<double>(hidden_size);
  const double V = static_cast<double>(vocab_size), F = static_cast<double>(intermediate_size);
  const bool full = shape.policy == nn::RecomputePolicy::kFull;
  const bool selective = shape.policy == nn::RecomputePolicy::kSelective;
  const bool fused = shape.kernels == LayerKernels::kFused;
  bool adapted = false;  // a LoRA adapter: its linears run neither fused nor in FP8
  for (const auto& [name, s] : params) adapted = adapted || name.find(".lora_") != std::string::npos;
  // models::fp8_linear_applies and LinearImpl::runs_fp8: a trainable weight
  // without an adapter, both sizes multiples of 16.
  const auto runs_fp8 = [&](int64_t out, int64_t in) {
    return shape.fp8_linears && trainable && !adapted && out % 16 == 0 && in % 16 == 0;
  };
  // products_fusable: the q|k|v and gate|up products fuse unless FP8 or an adapter keeps them apart.
  const bool fused_qkv = fused && !adapted && !runs_fp8(num_attention_heads * dh(), hidden_size);
  const bool fused_gate_up = fused && !adapted && !runs_fp8(intermediate_size, hidden_size);
  UnitWork w;
  // Per-token work of forward and backward; `recomputed`: also in backward's second forward.
  const auto add = [&](OpWork fwd, OpWork bwd, bool recomputed) {
    w.forward += fwd;
    w.backward += bwd;
    if (shape.checkpointed && recomputed) w.recompute += fwd;
  };
  const auto bytes = [](double b) { return OpWork{0, 0, b}; };
  const auto rms_norm = [&](double n) {
    if (fused) {
      add(bytes(2 * a * n), bytes(5 * a * n), true);
    } else {
      add(bytes((28 + 4 * a) * n), bytes((76 + 8 * a) * n), true);
    }
  };
  const auto rotary = [&](double e) {
    if (fused) {
      add(bytes(2 * a * e), bytes(2 * a * e), true);
    } else {
      add(bytes(10 * a * e), bytes(17 * a * e), true);
    }
  };
  for (const auto& [name, s] : params) {
    const bool matrix = s.size() == 2;
    const double rows = s.empty() ? 0 : static_cast<double>(s[0]);
    const double numel = matrix ? rows * static_cast<double>(s[1]) : rows;
    const bool embedding = ends_with(name, "embed_tokens.weight");
    const bool head = ends_with(name, "lm_head.weight") || (embedding && tie_word_embeddings);
    if (trainable) w.backward.memory_bytes += 4 * a * numel / N;  // the flat gradient
    if (ends_with(name, "layernorm.weight") || ends_with(name, "model.norm.weight")) rms_norm(rows);
    if (ends_with(name, "q_norm.weight")) rms_norm(H * Dh);
    if (ends_with(name, "k_norm.weight")) rms_norm(Hkv * Dh);
    if (embedding) {
      add(bytes(2 * a * D), bytes(2 * a * D), true);
      if (trainable) w.backward.memory_bytes += (a + (tie_word_embeddings ? 3 * a : 0)) * V * D / N;
    }
    if (head) {
      // The chunked loss (Note [Chunked cross-entropy]): everything in its forward.
      w.forward += OpWork{2 * numel * (trainable ? 3 : 2), 0, (fused ? 3 * a : 44 + 2 * a) * V};
      const double chunks = std::ceil(N / static_cast<double>(std::max<int64_t>(1, shape.loss_chunk_rows)));
      if (trainable) {
        if (a < 4) w.forward.memory_bytes += ((chunks - 1) * 12 + 4 + a) * V * D / N;
        w.backward.memory_bytes += 2 * a * V * D / N;
      }
      w.backward.memory_bytes += 2 * a * D;
      continue;
    }
    const bool down = ends_with(name, "mlp.down_proj.weight");
    const bool kept = ends_with(name, "self_attn.q_proj.weight") || ends_with(name, "self_attn.k_proj.weight") ||
                      ends_with(name, "self_attn.v_proj.weight") || ends_with(name, "self_attn.o_proj.weight");
    const bool decoder_product = kept || down || ends_with(name, "mlp.gate_proj.weight") ||
                                 ends_with(name, "mlp.up_proj.weight");
    if (matrix && !embedding) {
      const double f = 2 * numel;
      const bool recomputed = full || (!down && !(selective && kept));
      if (decoder_product && runs_fp8(s[0], s[1])) {
        const double M = rows, K = static_cast<double>(s[1]);
        const double cast = a > 2 ? 2 + a : 0;  // _scaled_mm's bf16 output into a wider compute dtype
        const bool reuses = reuses_fp8_input(name, fused && runs_fp8(num_attention_heads * dh(), hidden_size),
                                             fused && runs_fp8(intermediate_size, hidden_size));
        const double input = reuses ? 0 : fp8_quantized_bytes(1, K, a);
        OpWork fwd{0, 0, input + fp8_quantized_bytes(M, K, a) / N + cast * M, f};
        OpWork bwd{f, 0, fp8_quantized_bytes(1, M, a) + (2 * a * M * K + fp8_quantized_bytes(K, M, a)) / N + cast * K,
                   f};
        add(fwd, bwd, recomputed);
      } else {
        add({f, 0, 0}, {(trainable ? 2 : 1) * f, 0, 0}, recomputed);
      }
    }
    if (ends_with(name, "self_attn.q_proj.weight")) {
      const double attn = 2 * H * Dh * T;
      const double grouped = Hkv < H ? 2 * a * H * Dh + 2 * a * Hkv * Dh : 0;
      // The shared input's gradients: summed (reference), or the fused product's split undone.
      const double shared = fused_qkv ? 2 * a * (H + 2 * Hkv) * Dh : 6 * a * D;
      add({0, attn, 0}, {0, 2.5 * attn, (8 + a) * H * Dh + 2 * a * H * Dh + grouped + shared}, true);
      if (fused_qkv) add(bytes(2 * a * Hkv * Dh), {}, true);  // v copied out of the q|k|v output
      rotary(rows);
    }
    if (ends_with(name, "self_attn.k_proj.weight")) rotary(rows);
    if (ends_with(name, "self_attn.o_proj.weight")) add(bytes(3 * a * rows), bytes(3 * a * rows), true);
    if (ends_with(name, "mlp.gate_proj.weight")) {
      const double shared = fused_gate_up ? 4 * a * F : 3 * a * D;
      add(bytes((fused ? 3 : 5) * a * rows), bytes((fused ? 7 : 9) * a * rows + shared), true);
    }
    if (down) add(bytes(3 * a * rows), bytes(3 * a * rows), full);
  }
  for (OpWork* p : {&w.forward, &w.backward, &w.recompute}) {
    p->product_flops *= N;
    p->fp8_product_flops *= N;
    p->attention_flops *= N;
    p->memory_bytes *= N;
  }
  return w;
}

// Note [Config size limits]
// A config.json is input: vocab_size 1e12 or hidden_size 2^40 would otherwise be
// found only when the first tensor of that size is allocated (1e15 bytes, an
// allocator error and a backtrace), and products such as D*H*Dh*L can overflow
// int64 (num_parameters). Every size has a limit far above published models and
// the total parameter count is computed in 128-bit arithmetic and bounded, so
// everything after validate() computes in int64 safely. Memory is a separate,
// later check (the trainer compares the sharding plan with the machine's memory).
void LlamaConfig::check_size_limits() const {
  const std::string who = "model config '" + name + "': ";
  auto limit = [&](const char* field, int64_t v, int64_t max, const char* why) {
    FSDP_CHECK(v <= max, who, field, " = ", v, " is above the limit ", max, " (", why, ") — check config.json");
  };
  limit("hidden_size", hidden_size, kMaxHiddenSize, "the largest published models have 25,600");
  limit("intermediate_size", intermediate_size, kMaxIntermediateSize, "the largest published models have 53,248");
  limit("num_attention_heads", num_attention_heads, kMaxHeads, "the largest published models have 128");
  limit("num_key_value_heads", num_key_value_heads, kMaxHeads, "the largest published models have 128");
  limit("head_dim", head_dim, kMaxHeads, "the largest published models have 256");
  limit("num_hidden_layers", num_hidden_layers, kMaxLayers, "the largest published models have 126");
  limit("vocab_size", vocab_size, kMaxVocabSize, "token ids are 32-bit; published vocabularies have up to ~256k");
  limit("max_position_embeddings", max_position_embeddings, kMaxPositions, "positions are 32-bit");
  limit("num_local_experts", num_local_experts, kMaxExperts, "the largest published MoE models have 384 experts");
  limit("num_experts_per_tok", num_experts_per_tok, kMaxExperts, "published MoE models route to at most 10");
  if (hidden_size <= 0 || intermediate_size <= 0 || num_attention_heads <= 0 || num_key_value_heads <= 0 ||
      num_hidden_layers <= 0 || vocab_size <= 0 || head_dim < 0 || num_local_experts < 0) {
    return;  // validate() names the non-positive field
  }
  // num_parameters()'s formula in 128 bits: the sizes above keep it far from overflowing.
  using Wide = __int128;
  const Wide D = hidden_size, F = intermediate_size, H = num_attention_heads, Hkv = num_key_value_heads;
  const Wide Dh = head_dim > 0 ? head_dim : hidden_size / num_attention_heads, L = num_hidden_layers, V = vocab_size;
  const Wide E = num_local_experts > 0 ? num_local_experts : 1;
  const Wide per_layer =
      D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + (H + 2 * Hkv) * Dh + D + 2 * Dh + E * (3 * D * F + D) + 2 * D;
  const Wide total = V * D + L * per_layer + D + V * D;
  FSDP_CHECK(total <= kMaxParameters, who, "the sizes describe about ",
             static_cast<double>(total), " parameters, above the limit ", static_cast<double>(kMaxParameters),
             " (hidden_size ", hidden_size, ", intermediate_size ", intermediate_size, ", num_hidden_layers ",
             num_hidden_layers, ", vocab_size ", vocab_size, ") — check config.json");
}

void LlamaConfig::validate() const {
  check_size_limits();
  const std::string who = "model config '" + name + "': ";
  auto positive = [&](const char* field, int64_t v) {
    FSDP_CHECK(v > 0, who, field, " = ", v, " must be positive — set it in config.json or pick a preset");
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("num_hidden_layers", num_hidden_layers);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  FSDP_CHECK(model_type == "llama" || model_type == "mistral" || model_type == "mixtral" || model_type == "qwen2" ||
                 model_type == "qwen3",
             who, "model_type '", model_type,
             "' is not supported — use \"llama\", \"mistral\", \"mixtral\", \"qwen2\" or \"qwen3\"");
  FSDP_CHECK(head_dim >= 0, who, "head_dim = ", head_dim, " must be positive (or 0 for hidden_size / num_attention_heads)");
  if (head_dim == 0) {
    FSDP_CHECK(hidden_size % num_attention_heads == 0, who, "hidden_size (D=", hidden_size,
               ") is not a multiple of num_attention_heads (H=", num_attention_heads, ") — set head_dim explicitly");
  }
  FSDP_CHECK(dh() % 2 == 0, who, "head_dim (Dh=", dh(), ") must be even for rotary embeddings");
  FSDP_CHECK(num_attention_heads % num_key_value_heads == 0, who, "num_attention_heads (H=", num_attention_heads,
             ") must be a multiple of num_key_value_heads (Hkv=", num_key_value_heads,
             ") — grouped-query attention shares each kv head among H/Hkv query heads");
  FSDP_CHECK(rms_norm_eps > 0, who, "rms_norm_eps = ", rms_norm_eps, " must be positive (Llama uses 1e-5 or 1e-6)");
  FSDP_CHECK(rope_theta > 0, who, "rope_theta = ", rope_theta, " must be positive (Llama 2: 10000, Llama 3: 500000)");
  FSDP_CHECK(initializer_range >= 0, who, "initializer_range = ", initializer_range, " must be >= 0");
  if (rope_scaling) {
    const RopeScaling& s = *rope_scaling;
    FSDP_CHECK(s.factor > 0, who, "rope_scaling.factor = ", s.factor, " must be positive (Llama 3.1: 8)");
    FSDP_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor, who,
               "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor = ", s.low_freq_factor,
               ", high_freq_factor = ", s.high_freq_factor, " (Llama 3.1: 1 and 4)");
    FSDP_CHECK(s.original_max_position_embeddings > 0, who, "rope_scaling.original_max_position_embeddings = ",
               s.original_max_position_embeddings, " must be positive (Llama 3.1: 8192)");
  }
  if (sliding_window) {
    FSDP_CHECK(model_type != "llama", who, "sliding_window = ", *sliding_window, " is set for model_type 'llama', "
               "which has no sliding window — remove it (Mistral, Qwen2 and Qwen3 configs have one)");
    FSDP_CHECK(*sliding_window > 0, who, "sliding_window = ", *sliding_window,
               " must be positive (the number of keys a query sees, itself included), or null for full attention");
  }
  if (per_layer_attention()) {
    FSDP_CHECK(static_cast<int64_t>(layer_types.size()) == num_hidden_layers, who, "layer_types has ",
               layer_types.size(), " entries but num_hidden_layers = ", num_hidden_layers,
               " — give one \"full_attention\" or \"sliding_attention\" per layer (or leave layer_types out)");
    for (size_t i = 0; i < layer_types.size(); ++i) {
      const std::string& t = layer_types[i];
      FSDP_CHECK(t == "full_attention" || t == "sliding_attention", who, "layer_types[", i, "] = '", t,
                 "' is not supported — only \"full_attention\" and \"sliding_attention\" are implemented");
      FSDP_CHECK(t == "full_attention" || sliding_window.has_value(), who, "layer_types[", i,
                 "] is \"sliding_attention\" but there is no window (use_sliding_window false or sliding_window "
                 "null) — set use_sliding_window and sliding_window, or make the layer \"full_attention\"");
    }
  } else {
    FSDP_CHECK(layer_types.empty(), who, "layer_types is set for model_type '", model_type,
               "', which attends alike in every layer — remove it");
  }
  FSDP_CHECK(!attention_bias || model_type == "qwen3", who, "attention_bias = true is only implemented for qwen3 "
             "(Llama and Mistral projections here have no bias; Qwen2's q/k/v biases are always on)");
  if (moe()) {
    FSDP_CHECK(num_local_experts >= 1, who, "num_local_experts (E) = ", num_local_experts,
               " must be positive for model_type 'mixtral' — set the number of experts per layer (Mixtral-8x7B: 8)");
    FSDP_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= num_local_experts, who,
               "num_experts_per_tok (K) = ", num_experts_per_tok, " must lie in [1, num_local_experts (E) = ",
               num_local_experts, "] — each token is routed to K of the E experts (Mixtral-8x7B: 2 of 8)");
    FSDP_CHECK(router_aux_loss_coef >= 0 && std::isfinite(router_aux_loss_coef), who, "router_aux_loss_coef = ",
               router_aux_loss_coef, " must be a finite number >= 0 (Mixtral-8x7B: 0.02; 0 trains without the "
               "load-balancing loss)");
    FSDP_CHECK(router_jitter_noise == 0.0, who, "router_jitter_noise = ", router_jitter_noise,
               " is not supported — router input noise is not implemented; set it to 0.0 (published Mixtral configs "
               "use 0.0)");
  } else {
    FSDP_CHECK(num_local_experts == 0 && num_experts_per_tok == 0, who, "num_local_experts = ", num_local_experts,
               " and num_experts_per_tok = ", num_experts_per_tok, " are set for model_type '", model_type,
               "', which has no experts — remove them, or use model_type \"mixtral\" for a mixture of experts");
  }
  if (pad_token_id) {
    FSDP_CHECK(*pad_token_id >= 0 && *pad_token_id < vocab_size, who, "pad_token_id = ", *pad_token_id,
               " is not a row of the embedding [0, vocab_size=", vocab_size,
               ") — use the id of the padding token, or null if the model has none");
  }
}

std::string LlamaConfig::summary() const {
  char params[32];
  const double n = static_cast<double>(num_parameters());
  if (n >= 1e9) {
    std::snprintf(params, sizeof(params), "%.2fB", n / 1e9);
  } else {
    std::snprintf(params, sizeof(params), "%.2fM", n / 1e6);
  }
  std::ostringstream os;
  os << (name.empty() ? model_type : name) << ": " << (model_type == "llama" ? "" : model_type + " ")
     << "D=" << hidden_size << " L=" << num_hidden_layers
     << " H=" << num_attention_heads << " Hkv=" << num_key_value_heads << " Dh=" << dh() << " F=" << intermediate_size
     << " V=" << vocab_size << " max_pos=" << max_position_embeddings << " rope_theta=" << rope_theta;
  if (rope_scaling) os << " rope_scaling=llama3(factor=" << rope_scaling->factor << ")";
  if (tie_word_embeddings) os << " tied";
  if (qkv_bias()) os << (o_bias() ? " qkvo_bias" : " qkv_bias");
  if (qk_norm()) os << " qk_norm";
  if (moe()) os << " experts=" << num_local_experts << " top" << num_experts_per_tok;
  if (sliding_window) {
    int64_t sliding = 0;
    for (int64_t i = 0; i < num_hidden_layers; ++i) sliding += layer_window(i).has_value() ? 1 : 0;
    os << " window=" << *sliding_window << " (" << sliding << "/" << num_hidden_layers << " layers)";
  }
  if (pad_token_id) os << " pad=" << *pad_token_id;
  os << " " << params << " params";
  if (moe()) {
    const double a = static_cast<double>(active_parameters());
    char active[32];
    std::snprintf(active, sizeof(active), a >= 1e9 ? "%.2fB" : "%.2fM", a >= 1e9 ? a / 1e9 : a / 1e6);
    os << " (" << active << " active per token)";
  }
  return os.str();
}

std::string LlamaConfig::to_hf_config_json() const {
  // nlohmann::json keeps keys sorted, as transformers' save_pretrained writes
  // them (json.dumps(sort_keys=True)). The keys are those transformers 5
  // writes for LlamaConfig / MistralConfig / MixtralConfig / Qwen2Config /
  // Qwen3Config, less "transformers_version" (we are not transformers) and
  // "dtype" (the exporter knows the weights' dtype).
  nlohmann::json j;
  const bool llama = model_type == "llama";
  const bool qwen = per_layer_attention();
  j["architectures"] = {model_type == "mistral" ? "MistralForCausalLM"
                        : model_type == "mixtral" ? "MixtralForCausalLM"
                        : model_type == "qwen2"  ? "Qwen2ForCausalLM"
                        : model_type == "qwen3"  ? "Qwen3ForCausalLM"
                                                 : "LlamaForCausalLM"};
  if (llama) {  // only LlamaConfig has these keys
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (model_type == "qwen3") j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id ? nlohmann::json(*bos_token_id) : nlohmann::json(nullptr);
  if (eos_token_id.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (eos_token_id.size() == 1) {
    j["eos_token_id"] = eos_token_id[0];
  } else {
    j["eos_token_id"] = eos_token_id;
  }
  // Qwen2Config has no head_dim field (transformers reads one from
  // config.json, else uses D / H): written only when it differs, so that
  // transformers reads back the attributes of the source config.
  if (model_type != "qwen2" || dh() * num_attention_heads != hidden_size) j["head_dim"] = dh();
  j["hidden_act"] = "silu";
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = initializer_range;
  j["intermediate_size"] = intermediate_size;
  if (qwen) {
    j["layer_types"] = layer_types;
    j["max_window_layers"] = max_window_layers;
    // transformers keeps sliding_window only when use_sliding_window is true.
    j["use_sliding_window"] = sliding_window.has_value();
  }
  j["max_position_embeddings"] = max_position_embeddings;
  j["model_type"] = model_type;
  j["num_attention_heads"] = num_attention_heads;
  if (moe()) j["num_experts_per_tok"] = num_experts_per_tok;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  if (moe()) {
    j["num_local_experts"] = num_local_experts;
    j["output_router_logits"] = output_router_logits;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["router_jitter_noise"] = router_jitter_noise;
  }
  j["pad_token_id"] = pad_token_id ? nlohmann::json(*pad_token_id) : nlohmann::json(nullptr);
  j["rms_norm_eps"] = rms_norm_eps;
  nlohmann::json rope = {{"rope_theta", rope_theta}, {"rope_type", rope_scaling ? "llama3" : "default"}};
  if (rope_scaling) {
    rope["factor"] = rope_scaling->factor;
    rope["low_freq_factor"] = rope_scaling->low_freq_factor;
    rope["high_freq_factor"] = rope_scaling->high_freq_factor;
    rope["original_max_position_embeddings"] = rope_scaling->original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  if (!llama) j["sliding_window"] = sliding_window ? nlohmann::json(*sliding_window) : nlohmann::json(nullptr);
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["use_cache"] = true;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

namespace {

// A window that never cuts a sequence the config accepts (W >= its
// max_position_embeddings) is no window.
std::string effective_window(const LlamaConfig& c, int64_t layer) {
  const std::optional<int64_t> w = c.layer_window(layer);
  return w && *w < c.max_position_embeddings ? std::to_string(*w) : std::string("none");
}

std::string optional_id(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string("none"); }

}  // namespace

std::string llama_config_mismatch(const LlamaConfig& a, const LlamaConfig& b) {
  auto diff = [](const char* field, const auto& x, const auto& y) -> std::string {
    if (x == y) return "";
    std::ostringstream os;
    os << std::boolalpha << field << " " << x << " vs " << y;
    return os.str();
  };
  for (const std::string& d :
       {diff("model_type", a.model_type, b.model_type), diff("attention_bias", a.attention_bias, b.attention_bias),
        diff("pad_token_id", optional_id(a.pad_token_id), optional_id(b.pad_token_id)),
        diff("hidden_size", a.hidden_size, b.hidden_size),
        diff("intermediate_size", a.intermediate_size, b.intermediate_size),
        diff("num_attention_heads", a.num_attention_heads, b.num_attention_heads),
        diff("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads),
        diff("head_dim", a.dh(), b.dh()), diff("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers),
        diff("vocab_size", a.vocab_size, b.vocab_size), diff("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps),
        diff("rope_theta", a.rope_theta, b.rope_theta),
        diff("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings),
        diff("num_local_experts", a.num_local_experts, b.num_local_experts),
        diff("num_experts_per_tok", a.num_experts_per_tok, b.num_experts_per_tok),
        diff("rope_scaling", std::string(a.rope_scaling.has_value() ? "llama3" : "none"),
             std::string(b.rope_scaling.has_value() ? "llama3" : "none"))}) {
    if (!d.empty()) return d;
  }
  if (a.rope_scaling && b.rope_scaling) {
    const auto& x = *a.rope_scaling;
    const auto& y = *b.rope_scaling;
    for (const std::string& d :
         {diff("rope_scaling.factor", x.factor, y.factor),
          diff("rope_scaling.low_freq_factor", x.low_freq_factor, y.low_freq_factor),
          diff("rope_scaling.high_freq_factor", x.high_freq_factor, y.high_freq_factor),
          diff("rope_scaling.original_max_position_embeddings", x.original_max_position_embeddings,
               y.original_max_position_embeddings)}) {
      if (!d.empty()) return d;
    }
  }
  for (int64_t i = 0; i < a.num_hidden_layers; ++i) {
    const std::string d = diff(("sliding window of layer " + std::to_string(i)).c_str(), effective_window(a, i),
                               effective_window(b, i));
    if (!d.empty()) return d;
  }
  return "";
}

}  // namespace fsdp::models

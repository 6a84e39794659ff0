#include "fsdp/models/llama.h"

#include <cmath>
#include <limits>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/models/fused_products.h"
#include "fsdp/models/kernels.h"

namespace fsdp::models {
namespace {

// HF's rotate_half: the pair of element j is element j + Dh/2 (halves, not
// interleaved): (x1, x2) -> (-x2, x1).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
}

// x (B, n, T, Dh); cos, sin (T, Dh) broadcast over B and n.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// (B, Hkv, T, Dh) -> (B, Hkv*n_rep, T, Dh); query head h reads kv head h / n_rep.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), Dh = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, n_rep, T, Dh}).reshape({B, Hkv * n_rep, T, Dh});
}

// Validates a batch: on the host, with a clear error; on a device, without
// waiting for it. See LlamaForCausalLMImpl::forward / loss.
void check_batch(const LlamaConfig& cfg, const at::Tensor& tokens, const at::Tensor* targets) {
  FSDP_CHECK(tokens.defined() && tokens.dim() == 2, "model '", cfg.name, "': tokens must be a (B, T) tensor, got ",
             tokens.defined() ? tokens.sizes() : at::IntArrayRef{}, " — batch token ids as (batch, sequence)");
  FSDP_CHECK(tokens.scalar_type() == at::kLong, "model '", cfg.name, "': tokens must be int64, got ",
             tokens.scalar_type(), " — convert with tokens.to(torch::kLong)");
  const int64_t T = tokens.size(1);
  FSDP_CHECK(T >= 1 && T <= cfg.max_position_embeddings, "model '", cfg.name, "': sequence length T=", T,
             " is outside [1, max_position_embeddings=", cfg.max_position_embeddings,
             "] — use shorter sequences (or a config with a larger max_position_embeddings)");
  if (targets != nullptr) {
    FSDP_CHECK(targets->defined() && targets->sizes() == tokens.sizes(), "model '", cfg.name,
               "': targets must have the tokens' shape ", tokens.sizes(), ", got ",
               targets->defined() ? targets->sizes() : at::IntArrayRef{});
    FSDP_CHECK(targets->scalar_type() == at::kLong, "model '", cfg.name, "': targets must be int64, got ",
               targets->scalar_type(), " — convert with targets.to(torch::kLong)");
  }
  if (tokens.is_meta()) return;  // shapes only

  std::vector<at::Tensor> stats;
  auto tok = at::aminmax(tokens);
  stats.push_back(std::get<0>(tok));
  stats.push_back(std::get<1>(tok));
  if (targets != nullptr) {
    // Ignored positions count as 0 so they do not affect the range.
    auto tgt = at::aminmax(targets->masked_fill(targets->eq(kIgnoreIndex), 0));
    stats.push_back(std::get<0>(tgt));
    stats.push_back(std::get<1>(tgt));
  }
  const int64_t V = cfg.vocab_size;
  if (!tokens.is_cpu()) {
    // On an accelerator the check must not wait for the device (no host
    // synchronization inside a step, docs/design.md "GPU specifics"): it is
    // asserted there, asynchronously. A failure stops the process with the
    // message printed by the device. The trainer validates its data on the
    // host before training, against the same vocab_size.
    const at::Tensor v = at::stack(stats);
    at::Tensor ok = v[0].ge(0).logical_and(v[1].lt(V));
    if (targets != nullptr) ok = ok.logical_and(v[2].ge(0)).logical_and(v[3].lt(V));
    at::_assert_async(ok, "token ids or targets outside [0, vocab_size) (targets may also be the ignore index)");
    return;
  }
  const at::Tensor host = at::stack(stats);  // on the host already: no wait
  const int64_t* v = host.data_ptr<int64_t>();
  FSDP_CHECK(v[0] >= 0 && v[1] < V, "model '", cfg.name, "': token ids must lie in [0, vocab_size=", V,
             "), got min ", v[0], " max ", v[1],
             " — the tokenizer does not match the model: use a model whose vocab_size exceeds every id (>= ",
             std::max<int64_t>(v[1] + 1, V), ") or the model's own tokenizer");
  if (targets != nullptr) {
    FSDP_CHECK(v[2] >= 0 && v[3] < V, "model '", cfg.name, "': targets must lie in [0, vocab_size=", V, ") or equal ",
               kIgnoreIndex, " (ignored), got min ", v[2], " max ", v[3],
               " — the tokenizer does not match the model, or padding uses an id other than ", kIgnoreIndex);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Rotary embedding

at::Tensor llama_rope_inv_freq(const LlamaConfig& cfg, at::Device device) {
  // Mirrors transformers' fp32 arithmetic op by op (Python's `s / t` on a
  // tensor is t.reciprocal() * s, and `s ** t` is tensor(s, float32) ** t), so
  // the tables agree bit for bit with HF on the same LibTorch. Every tensor is
  // made on `device`; the scalars are kernel arguments, not host tensors.
  const int64_t dim = cfg.dh();
  const auto on = at::TensorOptions().device(device);
  const at::Tensor exponent = at::arange(0, dim, 2, on.dtype(at::kLong)).to(at::kFloat) / dim;
  const at::Tensor base = at::scalar_tensor(cfg.rope_theta, on.dtype(at::kFloat));
  at::Tensor inv_freq = at::pow(base, exponent).reciprocal() * 1.0;
  if (!cfg.rope_scaling) return inv_freq;

  const RopeScaling& s = *cfg.rope_scaling;
  const double factor = s.factor;
  const double low_freq_factor = s.low_freq_factor;
  const double high_freq_factor = s.high_freq_factor;
  const int64_t old_context_len = s.original_max_position_embeddings;
  const double low_freq_wavelen = static_cast<double>(old_context_len) / low_freq_factor;
  const double high_freq_wavelen = static_cast<double>(old_context_len) / high_freq_factor;

  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  // Wavelengths above low_freq_wavelen: divide by factor; below high_freq_wavelen: keep.
  at::Tensor inv_freq_llama = at::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  // In between: interpolate with a smooth factor.
  const at::Tensor smooth_factor =
      ((wavelen.reciprocal() * old_context_len) - low_freq_factor) / (high_freq_factor - low_freq_factor);
  const at::Tensor smoothed_inv_freq =
      (at::rsub(smooth_factor, 1) * inv_freq_llama) / factor + smooth_factor * inv_freq_llama;
  const at::Tensor is_medium_freq = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
}

at::Tensor sliding_window_mask(int64_t seq_len, int64_t window, at::Device device) {
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor i = pos.unsqueeze(1);  // (T, 1) query
  const at::Tensor j = pos.unsqueeze(0);  // (1, T) key
  // transformers' and_masks(sliding_window_overlay(W), causal_mask_function):
  // kv_idx > q_idx - W and kv_idx <= q_idx.
  return j.le(i).logical_and(j.gt(i - window));  // (T, T) bool
}

std::pair<at::Tensor, at::Tensor> llama_rope_cos_sin(const at::Tensor& inv_freq, int64_t seq_len,
                                                     at::ScalarType dtype, at::Device device) {
  FSDP_ASSERT(inv_freq.device() == device, "rotary table on ", inv_freq.device(), " for a forward on ", device,
              ": compute it there (llama_rope_inv_freq), a copy would be a host wait per forward");
  const at::Tensor f32 = inv_freq.to(at::kFloat);
  const at::Tensor pos = at::arange(seq_len, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat);
  const at::Tensor freqs = at::outer(pos, f32);        // (T, Dh/2)
  const at::Tensor emb = at::cat({freqs, freqs}, -1);  // (T, Dh)
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

// ---------------------------------------------------------------------------
// Modules

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& cfg, const at::TensorOptions& options, int64_t layer)
    : n_heads_(cfg.num_attention_heads),
      n_kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.dh()),
      window_(cfg.layer_window(layer)) {
  const int64_t D = cfg.hidden_size;
  // Registration order = HF's named_parameters order (q, k, v, o, then qwen3's norms).
  q_proj_ = register_module("q_proj", Linear(D, n_heads_ * head_dim_, cfg.qkv_bias(), options));
  k_proj_ = register_module("k_proj", Linear(D, n_kv_heads_ * head_dim_, cfg.qkv_bias(), options));
  v_proj_ = register_module("v_proj", Linear(D, n_kv_heads_ * head_dim_, cfg.qkv_bias(), options));
  o_proj_ = register_module("o_proj", Linear(n_heads_ * head_dim_, D, cfg.o_bias(), options));
  if (cfg.qk_norm()) {
    q_norm_ = register_module("q_norm", RMSNorm(head_dim_, cfg.rms_norm_eps, options));
    k_norm_ = register_module("k_norm", RMSNorm(head_dim_, cfg.rms_norm_eps, options));
  }
}

void LlamaAttentionImpl::set_kernel(AttentionKernel kernel) { kernel_ = kernel; }

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const AttentionMasks& masks) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t H = n_heads_, Hkv = n_kv_heads_, Dh = head_dim_;
  constexpr nn::ProductRole kKept = nn::ProductRole::kKept;
  at::Tensor q, k, v;  // (B, T, n * Dh) each
  if (kernels_ == LayerKernels::kFused) {  // Note [Fused products over the flat parameter]
    std::vector<at::Tensor> qkv = fused_linears(x, {q_proj_.get(), k_proj_.get(), v_proj_.get()}, /*kept=*/true);
    q = std::move(qkv[0]);
    k = std::move(qkv[1]);
    // Attention saves v for backward: as a view it would hold the whole
    // q|k|v output until then, where the reference holds v's share. A copy
    // of v's share instead (fused peak <= reference peak).
    v = qkv[2].contiguous();
  } else {
    q = q_proj_->forward_marked(x, kKept);
    k = k_proj_->forward_marked(x, kKept);
    v = v_proj_->forward_marked(x, kKept);
  }
  q = q.view({B, T, H, Dh});    // (B, T, H, Dh)
  k = k.view({B, T, Hkv, Dh});  // (B, T, Hkv, Dh)
  if (q_norm_) {  // qwen3: RMSNorm over Dh of every head, before RoPE
    q = q_norm_(q);
    k = k_norm_(k);
  }
  q = q.transpose(1, 2);                                            // (B, H, T, Dh)
  k = k.transpose(1, 2);                                            // (B, Hkv, T, Dh)
  v = v.view({B, T, Hkv, Dh}).transpose(1, 2);                      // (B, Hkv, T, Dh)
  if (kernels_ == LayerKernels::kFused) {  // Note [Rotary as one elementwise kernel]
    q = fused_rotary(q, cos, sin);
    k = fused_rotary(k, cos, sin);
  } else {
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
  }

  // Note [Sliding-window mask]: the band where the window can cut.
  const bool banded = window_.has_value() && T >= *window_;
  if (banded) {
    FSDP_ASSERT(masks.sliding.defined() && masks.sliding.dim() == 2 && masks.sliding.size(0) == T &&
                    masks.sliding.size(1) == T,
                "layer with window ", *window_, " at T=", T, " needs the (T, T) sliding-window mask");
  }
  at::Tensor out;  // (B, H, T, Dh)
  if (kernel_ == AttentionKernel::kSdpa && !banded) {
    // Query head h reads kv head h / (H / Hkv) inside the kernel (enable_gqa):
    // no repeated copy of k and v. Default scale 1/sqrt(Dh). Exactly
    // at::scaled_dot_product_attention, marked for selective checkpointing.
    out = nn::causal_attention(q, k, v, /*enable_gqa=*/Hkv != H);
  } else if (kernel_ == AttentionKernel::kSdpa) {
    // With a mask: repeated k and v, as transformers (Note [Sliding-window mask]).
    out = at::scaled_dot_product_attention(q, repeat_kv(k, H / Hkv), repeat_kv(v, H / Hkv), masks.sliding,
                                           /*dropout_p=*/0.0, /*is_causal=*/false, /*scale=*/std::nullopt,
                                           /*enable_gqa=*/false);
  } else {
    k = repeat_kv(k, H / Hkv);  // (B, H, T, Dh)
    v = repeat_kv(v, H / Hkv);  // (B, H, T, Dh)
    // HF "eager": scores in the activation dtype, softmax in fp32, cast back.
    at::Tensor scores = at::matmul(q, k.transpose(2, 3)) * std::pow(static_cast<double>(Dh), -0.5);  // (B, H, T, T)
    const at::Tensor hidden =  // (T, T) bool, true where the key is not visible
        banded ? masks.sliding.logical_not()
               : at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
    const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    out = at::matmul(probs, v);
  }
  return o_proj_->forward_marked(out.transpose(1, 2).reshape({B, T, H * Dh}), kKept);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& cfg, const at::TensorOptions& options) {
  const int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  gate_proj_ = register_module("gate_proj", Linear(D, F, /*bias=*/false, options));
  up_proj_ = register_module("up_proj", Linear(D, F, /*bias=*/false, options));
  down_proj_ = register_module("down_proj", Linear(F, D, /*bias=*/false, options));
}

at::Tensor LlamaMLPImpl::swiglu(const at::Tensor& x) {
  if (kernels_ == LayerKernels::kFused) {  // Note [Fused products over the flat parameter]
    const std::vector<at::Tensor> gate_up = fused_linears(x, {gate_proj_.get(), up_proj_.get()}, /*kept=*/false);
    return fused_swiglu(gate_up[0], gate_up[1]);
  }
  return at::silu(gate_proj_(x)) * up_proj_(x);
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) { return down_proj_(swiglu(x)); }

at::Tensor LlamaMLPImpl::forward_marked(const at::Tensor& x, nn::ProductRole down) {
  return down_proj_->forward_marked(swiglu(x), down);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& cfg, const at::TensorOptions& options,
                                             int64_t layer) {
  // Registration order = HF's named_parameters order.
  self_attn_ = register_module("self_attn", LlamaAttention(cfg, options, layer));
  if (cfg.moe()) {
    block_sparse_moe_ = register_module("block_sparse_moe", MixtralSparseMoeBlock(cfg, options));
  } else {
    mlp_ = register_module("mlp", LlamaMLP(cfg, options));
  }
  input_layernorm_ = register_module("input_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const AttentionMasks& masks) {
  if (moe()) return forward(x, cos, sin, masks, WithRouterLogits{}).at(0);
  const at::Tensor h = x + self_attn_->forward(input_layernorm_(x), cos, sin, masks);
  // down_proj's output reaches the layer's output only through this sum.
  return h + mlp_->forward_marked(post_attention_layernorm_(h), nn::ProductRole::kTail);
}

std::vector<at::Tensor> LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                                       const at::Tensor& sin, const AttentionMasks& masks,
                                                       WithRouterLogits) {
  FSDP_ASSERT(moe(), "router logits asked of a decoder layer without experts");
  const at::Tensor h = x + self_attn_->forward(input_layernorm_(x), cos, sin, masks);
  auto [moe_out, router_logits] = block_sparse_moe_(post_attention_layernorm_(h));
  return {h + moe_out, router_logits};
}

at::Tensor LlamaEmbeddingImpl::forward(const at::Tensor& hidden, const at::Tensor& targets, HeadLoss how) {
  return chunked_cross_entropy(hidden, weight(), targets, how.reduction, how.chunk_rows, nullptr, how.kernels);
}

at::Tensor LlamaEmbeddingImpl::forward(const at::Tensor& hidden, HeadLogits) { return at::linear(hidden, weight()); }

at::Tensor LlamaHeadImpl::forward(const at::Tensor& hidden, const at::Tensor& targets, HeadLoss how) {
  if (has_lora()) {
    const LowRankHead lora{lora_down(hidden), lora_B(), lora_scaling()};
    return chunked_cross_entropy(hidden, weight(), targets, how.reduction, how.chunk_rows, &lora, how.kernels);
  }
  return chunked_cross_entropy(hidden, weight(), targets, how.reduction, how.chunk_rows, nullptr, how.kernels);
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& cfg, const at::TensorOptions& options) {
  embed_tokens_ = LlamaEmbedding(
      std::make_shared<LlamaEmbeddingImpl>(cfg.vocab_size, cfg.hidden_size, options, cfg.pad_token_id));
  register_module("embed_tokens", embed_tokens_.ptr());
  layers_ = register_module("layers", torch::nn::ModuleList());
  blocks_.reserve(cfg.num_hidden_layers);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    if (cfg.layer_window(i)) window_ = cfg.layer_window(i);  // one W for every sliding layer
    LlamaBlock block(std::make_shared<LlamaDecoderLayerImpl>(cfg, options, i));
    layers_->push_back(block.ptr());
    blocks_.push_back(std::move(block));
  }
  norm_ = register_module("norm", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, options));
  rope_cfg_ = cfg;
  moe_ = cfg.moe();
}

// Note [Rotary table on the device]
// The table was a CPU member copied to the hidden states' device in every
// forward: on CUDA a blocking host-to-device copy, which the no-host-sync
// test (sync debug "error") refuses and which made every step wait for the
// device once more. It is computed on the device instead, by the same
// operations (a few tiny kernels, once per device), and kept there.
const at::Tensor& LlamaModelImpl::inv_freq(at::Device device) {
  if (!inv_freq_.defined() || inv_freq_.device() != device) inv_freq_ = llama_rope_inv_freq(rope_cfg_, device);
  return inv_freq_;
}

at::Tensor LlamaModelImpl::forward_with_router_logits(const at::Tensor& tokens,
                                                     std::vector<at::Tensor>& router_logits) {
  FSDP_ASSERT(moe_, "router logits asked of a model without experts");
  at::Tensor h = embed_tokens_(tokens);  // (B, T, D)
  const int64_t T = tokens.size(1);
  auto [cos, sin] = llama_rope_cos_sin(inv_freq(h.device()), T, h.scalar_type(), h.device());
  AttentionMasks masks;
  if (window_ && T >= *window_) masks.sliding = sliding_window_mask(T, *window_, h.device());
  for (auto& block : blocks_) {
    // The router logits leave the unit as an output, so they carry autograd
    // edges (and, when checkpointed, are recomputed) like the hidden state.
    std::vector<at::Tensor> outs = block(h, cos, sin, masks, WithRouterLogits{});
    h = std::move(outs.at(0));
    router_logits.push_back(std::move(outs.at(1)));
  }
  return norm_(h);
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens) {
  if (moe_) {
    std::vector<at::Tensor> dropped;
    return forward_with_router_logits(tokens, dropped);
  }
  at::Tensor h = embed_tokens_(tokens);  // (B, T, D)
  // Once per forward, shared by every layer; (T, Dh) each.
  const int64_t T = tokens.size(1);
  auto [cos, sin] = llama_rope_cos_sin(inv_freq(h.device()), T, h.scalar_type(), h.device());
  // Once per forward, shared by every sliding layer (Note [Sliding-window mask]).
  AttentionMasks masks;
  if (window_ && T >= *window_) masks.sliding = sliding_window_mask(T, *window_, h.device());
  for (auto& block : blocks_) h = block(h, cos, sin, masks);
  return norm_(h);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& cfg, const at::TensorOptions& options, uint64_t seed)
    : cfg_(cfg) {
  cfg_.validate();
  model_ = register_module("model", LlamaModel(cfg_, options));
  if (!cfg_.tie_word_embeddings) {
    lm_head_ = LlamaHead(std::make_shared<LlamaHeadImpl>(cfg_.hidden_size, cfg_.vocab_size, options));
    register_module("lm_head", lm_head_.ptr());
  }
  if (options.device().type() != at::kMeta) nn::init_module(*this, llama_init_rule(cfg_), seed);
}

const at::Tensor& LlamaForCausalLMImpl::output_weight() const {
  const LlamaModelImpl& model = *model_;
  return cfg_.tie_word_embeddings ? model.embed_tokens().weight() : lm_head_->impl_ptr()->weight();
}

at::Tensor LlamaForCausalLMImpl::project(const at::Tensor& hidden) {
  // Through the head's unit (lm_head's own forward, so that a LoRA adapter on
  // it takes part), or the embedding's when tied.
  return lm_head_ ? lm_head_(hidden) : model_->embed_unit()(hidden, HeadLogits{});
}

at::Tensor LlamaForCausalLMImpl::logits_unchecked(const at::Tensor& tokens) {
  return project(model_(tokens));  // (B, T, V)
}

void LlamaForCausalLMImpl::set_loss_chunk_rows(int64_t rows) {
  FSDP_CHECK(rows >= 0, "model '", cfg_.name, "': the loss's chunk of rows must be >= 0 (0: chosen from the "
             "vocabulary), got ", rows);
  loss_chunk_rows_ = rows;
}

int64_t LlamaForCausalLMImpl::loss_chunk_rows(at::DeviceType device) const {
  return models::loss_chunk_rows(loss_chunk_rows_, cfg_.vocab_size, device);
}

at::Tensor LlamaForCausalLMImpl::head_loss(const at::Tensor& hidden, const at::Tensor& targets,
                                           LossReduction reduction) {
  const at::Tensor h = hidden.reshape({-1, cfg_.hidden_size});  // (N, D)
  const at::Tensor t = targets.reshape({-1});                    // (N)
  const HeadLoss how{reduction, loss_chunk_rows(h.device().type()), loss_kernels_};
  return lm_head_ ? lm_head_(h, t, how) : model_->embed_unit()(h, t, how);
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens) {
  check_batch(cfg_, tokens, nullptr);
  return logits_unchecked(tokens);
}

std::vector<at::Tensor> RouterOutputs::pack() const {
  std::vector<at::Tensor> out = {logits, aux_loss};
  out.insert(out.end(), router_logits.begin(), router_logits.end());
  return out;
}

RouterOutputs RouterOutputs::unpack(std::vector<at::Tensor> tensors) {
  FSDP_ASSERT(tensors.size() >= 3, "RouterOutputs::unpack: expected logits, aux_loss and >= 1 router logits, got ",
              tensors.size(), " tensors");
  RouterOutputs r;
  r.logits = std::move(tensors[0]);
  r.aux_loss = std::move(tensors[1]);
  r.router_logits.assign(std::make_move_iterator(tensors.begin() + 2), std::make_move_iterator(tensors.end()));
  return r;
}

std::vector<at::Tensor> LlamaForCausalLMImpl::forward(const at::Tensor& tokens, WithRouterLogits) {
  FSDP_CHECK(cfg_.moe(), "model '", cfg_.name, "': router logits asked of model_type '", cfg_.model_type,
             "', which has no experts — only mixtral models route tokens");
  check_batch(cfg_, tokens, nullptr);
  RouterOutputs r;
  r.logits = project(model_->forward_with_router_logits(tokens, r.router_logits));  // (B, T, V)
  r.aux_loss = load_balancing_loss(r.router_logits, cfg_.num_local_experts, cfg_.num_experts_per_tok);
  return r.pack();
}

at::Tensor LlamaForCausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  check_batch(cfg_, tokens, &targets);
  if (cfg_.moe()) {
    std::vector<at::Tensor> router_logits;
    const at::Tensor ce =
        head_loss(model_->forward_with_router_logits(tokens, router_logits), targets, LossReduction::kMean);
    if (cfg_.router_aux_loss_coef == 0.0) return ce;
    // transformers: loss += router_aux_loss_coef * aux_loss.
    return ce + cfg_.router_aux_loss_coef *
                    load_balancing_loss(router_logits, cfg_.num_local_experts, cfg_.num_experts_per_tok);
  }
  return head_loss(model_(tokens), targets, LossReduction::kMean);
}

at::Tensor LlamaForCausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets, LossReduction reduction) {
  if (reduction == LossReduction::kMean) return loss(tokens, targets);
  check_batch(cfg_, tokens, &targets);
  return head_loss(model_(tokens), targets, LossReduction::kSum);
}

std::vector<std::string> LlamaForCausalLMImpl::unit_call_order() const {
  std::vector<std::string> order = {"model.embed_tokens"};
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) order.push_back("model.layers." + std::to_string(i));
  order.push_back("");  // model.norm, the root's own
  order.push_back(cfg_.tie_word_embeddings ? "model.embed_tokens" : "lm_head");
  return order;
}

void LlamaForCausalLMImpl::set_attention_kernel(AttentionKernel kernel) {
  for (const auto& block : model_->layers()) block->impl_ptr()->self_attn().set_kernel(kernel);
}

LlamaForCausalLM build_llama(const LlamaConfig& cfg, const at::TensorOptions& options, uint64_t seed) {
  return LlamaForCausalLM(cfg, options, seed);
}

nn::InitRuleFn llama_init_rule(const LlamaConfig& cfg) {
  const double stddev = cfg.initializer_range;
  // transformers zeroes the padding row of the embedding (nn.Embedding's
  // padding_idx); tied, the output head shares it.
  const int64_t D = cfg.hidden_size;
  const int64_t pad_begin = cfg.pad_token_id ? *cfg.pad_token_id * D : 0;
  const int64_t pad_end = cfg.pad_token_id ? pad_begin + D : 0;
  return [stddev, pad_begin, pad_end](const std::string& name) -> nn::InitRule {
    if (ends_with(name, "norm.weight")) return nn::InitRule::ones();
    if (ends_with(name, "_proj.bias")) return nn::InitRule::zeros();
    if (ends_with(name, "embed_tokens.weight")) return nn::InitRule::normal(stddev).with_zeros(pad_begin, pad_end);
    if (ends_with(name, "_proj.weight") || ends_with(name, "lm_head.weight")) {
      return nn::InitRule::normal(stddev);
    }
    // Mixtral's router and expert Linears (transformers: normal(0, initializer_range)).
    if (ends_with(name, "block_sparse_moe.gate.weight") || ends_with(name, ".w1.weight") ||
        ends_with(name, ".w2.weight") || ends_with(name, ".w3.weight")) {
      return nn::InitRule::normal(stddev);
    }
    FSDP_ASSERT(false, "llama_init_rule: no rule for parameter '", name, "'");
    return nn::InitRule::zeros();
  };
}

int64_t llama_kept_bytes_per_token(const LlamaConfig& cfg, int64_t layer, nn::RecomputePolicy policy,
                                   at::ScalarType dtype, at::DeviceType device, int64_t seq_len,
                                   AttentionKernel kernel) {
  if (policy != nn::RecomputePolicy::kSelective) return 0;
  const int64_t H = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads, Dh = cfg.dh(), D = cfg.hidden_size;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  // Products with a bias are recomputed (nn::linear); o's bias comes with cfg.o_bias().
  int64_t products = 0;
  if (!cfg.qkv_bias()) products += (H + 2 * Hkv) * Dh;
  if (!cfg.o_bias()) products += D;
  const std::optional<int64_t> window = cfg.layer_window(layer);
  const bool banded = window.has_value() && seq_len >= *window;
  const bool attention = device == at::kCPU && kernel == AttentionKernel::kSdpa && !banded;
  return products * elem + (attention ? H * Dh * elem + H * static_cast<int64_t>(sizeof(float)) : 0);
}

std::type_index llama_block_type() { return std::type_index(typeid(LlamaDecoderLayerImpl)); }

std::vector<std::type_index> llama_unit_types() {
  return {llama_block_type(), std::type_index(typeid(LlamaEmbeddingImpl)), std::type_index(typeid(LlamaHeadImpl))};
}

}  // namespace fsdp::models

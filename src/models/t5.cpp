#include "fsdp/models/t5.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"

namespace fsdp::models {
namespace {

// The most negative finite value of `dtype`: transformers' masks
// (torch.finfo(dtype).min where a key is hidden).
double lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case at::kHalf: return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case at::kDouble: return std::numeric_limits<double>::lowest();
    default: return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

// keep (bool, broadcastable) -> 0 where kept, lowest(dtype) where hidden.
at::Tensor additive_mask(const at::Tensor& keep, at::ScalarType dtype) {
  return at::zeros(keep.sizes(), keep.options().dtype(dtype)).masked_fill(keep.logical_not(), lowest(dtype));
}

void check_ids(const T5Config& cfg, const at::Tensor& t, const char* what, bool ignore_ok) {
  FSDP_CHECK(t.defined() && t.dim() == 2 && t.scalar_type() == at::kLong, "model '", cfg.name, "': ", what,
             " must be a (B, T) int64 tensor, got ", t.defined() ? t.sizes() : at::IntArrayRef{}, " ",
             t.defined() ? c10::toString(t.scalar_type()) : "undefined");
  FSDP_CHECK(t.size(1) >= 1, "model '", cfg.name, "': ", what, " must hold at least one token per row");
  if (t.is_meta()) return;
  const at::Tensor v = ignore_ok ? t.masked_fill(t.eq(kIgnoreIndex), 0) : t;
  if (!t.is_cpu()) {  // no host synchronization inside a step (llama.cpp's check_batch says why)
    auto [lo, hi] = at::aminmax(v);
    at::_assert_async(lo.ge(0).logical_and(hi.lt(cfg.vocab_size)), "T5 token ids outside [0, vocab_size)");
    return;
  }
  auto [lo, hi] = at::aminmax(v);
  const int64_t a = lo.item<int64_t>(), b = hi.item<int64_t>();
  FSDP_CHECK(a >= 0 && b < cfg.vocab_size, "model '", cfg.name, "': ", what, " must lie in [0, vocab_size=",
             cfg.vocab_size, ")", ignore_ok ? " or be the ignore index -100" : "", ", got min ", a, " max ", b,
             " — the tokenizer does not match the model");
}

}  // namespace

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional, int64_t num_buckets,
                                       int64_t max_distance) {
  // transformers' arithmetic, op by op (the same kernels give the same buckets).
  at::Tensor buckets = at::zeros_like(relative_position);
  at::Tensor rel = relative_position;
  if (bidirectional) {
    num_buckets /= 2;
    buckets = buckets + rel.gt(0).to(at::kLong) * num_buckets;
    rel = at::abs(rel);
  } else {
    rel = -at::min(rel, at::zeros_like(rel));
  }
  const int64_t max_exact = num_buckets / 2;
  const at::Tensor is_small = rel.lt(max_exact);
  at::Tensor large = max_exact + (at::log(rel.to(at::kFloat) / static_cast<double>(max_exact)) /
                                  std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                                  static_cast<double>(num_buckets - max_exact))
                                     .to(at::kLong);
  large = at::min(large, at::full_like(large, num_buckets - 1));
  return buckets + at::where(is_small, rel, large);
}

// ---------------------------------------------------------------------------
// Modules

T5AttentionImpl::T5AttentionImpl(const T5Config& cfg, const at::TensorOptions& options, bool relative_bias,
                                 bool bidirectional)
    : heads_(cfg.num_heads),
      d_kv_(cfg.d_kv),
      buckets_(cfg.relative_attention_num_buckets),
      max_distance_(cfg.relative_attention_max_distance),
      bidirectional_(bidirectional) {
  const int64_t D = cfg.d_model, inner = cfg.num_heads * cfg.d_kv;
  q_ = register_module("q", Linear(D, inner, /*bias=*/false, options));
  k_ = register_module("k", Linear(D, inner, /*bias=*/false, options));
  v_ = register_module("v", Linear(D, inner, /*bias=*/false, options));
  o_ = register_module("o", Linear(inner, D, /*bias=*/false, options));
  if (relative_bias) {
    relative_attention_bias_ = register_module("relative_attention_bias", Embedding(buckets_, heads_, options));
  }
}

at::Tensor T5AttentionImpl::position_bias(int64_t tq, int64_t tk) {
  FSDP_ASSERT(has_relative_bias(), "position_bias of an attention without relative_attention_bias");
  const at::Tensor& w = relative_attention_bias_->weight();
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(w.device());
  const at::Tensor context = at::arange(tq, longs).unsqueeze(1);  // (Tq, 1)
  const at::Tensor memory = at::arange(tk, longs).unsqueeze(0);   // (1, Tk)
  const at::Tensor bucket = t5_relative_position_bucket(memory - context, bidirectional_, buckets_, max_distance_);
  return relative_attention_bias_(bucket).permute({2, 0, 1}).unsqueeze(0);  // (1, H, Tq, Tk)
}

at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& kv, const at::Tensor& bias) {
  const int64_t B = x.size(0), Tq = x.size(1), Tk = kv.size(1), H = heads_, Dh = d_kv_;
  const at::Tensor q = q_(x).view({B, Tq, H, Dh}).transpose(1, 2);   // (B, H, Tq, Dh)
  const at::Tensor k = k_(kv).view({B, Tk, H, Dh}).transpose(1, 2);  // (B, H, Tk, Dh)
  const at::Tensor v = v_(kv).view({B, Tk, H, Dh}).transpose(1, 2);  // (B, H, Tk, Dh)
  // No 1/sqrt(Dh): T5 folds it into q's initialization. Softmax in fp32.
  const at::Tensor scores = at::matmul(q, k.transpose(2, 3)) + bias;  // (B, H, Tq, Tk)
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return o_(at::matmul(probs, v).transpose(1, 2).reshape({B, Tq, H * Dh}));
}

T5DenseImpl::T5DenseImpl(const T5Config& cfg, const at::TensorOptions& options) : act_(cfg.activation()) {
  const int64_t D = cfg.d_model, F = cfg.d_ff;
  if (cfg.gated()) {
    wi_0_ = register_module("wi_0", Linear(D, F, /*bias=*/false, options));
    wi_1_ = register_module("wi_1", Linear(D, F, /*bias=*/false, options));
  } else {
    wi_ = register_module("wi", Linear(D, F, /*bias=*/false, options));
  }
  wo_ = register_module("wo", Linear(F, D, /*bias=*/false, options));
}

at::Tensor T5DenseImpl::forward(const at::Tensor& x) {
  const auto act = [this](const at::Tensor& t) {
    if (act_ == "relu") return at::relu(t);
    if (act_ == "gelu") return at::gelu(t);
    if (act_ == "gelu_new") return at::gelu(t, "tanh");
    return at::silu(t);
  };
  const at::Tensor h = wi_ ? act(wi_(x)) : act(wi_0_(x)) * wi_1_(x);  // (B, T, F)
  return wo_(h);
}

T5SublayerImpl::T5SublayerImpl(const T5Config& cfg, const at::TensorOptions& options, const std::string& kind,
                               bool relative_bias, bool bidirectional) {
  if (kind == "DenseReluDense") {
    dense_ = register_module(kind, T5Dense(cfg, options));
  } else {
    attention_ = register_module(kind, T5Attention(cfg, options, relative_bias, bidirectional));
  }
  layer_norm_ = register_module("layer_norm", RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, options));
}

at::Tensor T5SublayerImpl::forward(const at::Tensor& h, const at::Tensor& kv, const at::Tensor& bias) {
  const at::Tensor n = layer_norm_(h);
  return h + attention_(n, kv.defined() ? kv : n, bias);
}

at::Tensor T5SublayerImpl::forward(const at::Tensor& h) { return h + dense_(layer_norm_(h)); }

T5BlockImpl::T5BlockImpl(const T5Config& cfg, const at::TensorOptions& options, bool decoder, bool first)
    : first_(first) {
  layer_ = register_module("layer", torch::nn::ModuleList());
  sublayers_.push_back(T5Sublayer(cfg, options, "SelfAttention", first, /*bidirectional=*/!decoder));
  if (decoder) sublayers_.push_back(T5Sublayer(cfg, options, "EncDecAttention", false, false));
  sublayers_.push_back(T5Sublayer(cfg, options, "DenseReluDense", false, false));
  for (const auto& s : sublayers_) layer_->push_back(s.ptr());
}

std::vector<at::Tensor> T5BlockImpl::forward(const at::Tensor& h, const at::Tensor& bias) {
  at::Tensor b = bias;
  if (first_) b = sublayers_[0]->attention().position_bias(h.size(1), h.size(1)) + bias;
  const at::Tensor out = sublayers_[1]->forward(sublayers_[0]->forward(h, at::Tensor(), b));
  if (first_) return {out, b};
  return {out};
}

std::vector<at::Tensor> T5BlockImpl::forward(const at::Tensor& g, const at::Tensor& bias, const at::Tensor& enc,
                                             const at::Tensor& enc_mask) {
  at::Tensor b = bias;
  if (first_) b = sublayers_[0]->attention().position_bias(g.size(1), g.size(1)) + bias;
  at::Tensor out = sublayers_[0]->forward(g, at::Tensor(), b);
  out = sublayers_[1]->forward(out, enc, enc_mask);
  out = sublayers_[2]->forward(out);
  if (first_) return {out, b};
  return {out};
}

T5StackImpl::T5StackImpl(const T5Config& cfg, const at::TensorOptions& options, bool decoder) {
  block_ = register_module("block", torch::nn::ModuleList());
  const int64_t n = decoder ? cfg.num_decoder_layers : cfg.num_layers;
  for (int64_t i = 0; i < n; ++i) {
    T5Block block(std::make_shared<T5BlockImpl>(cfg, options, decoder, /*first=*/i == 0));
    block_->push_back(block.ptr());
    blocks_.push_back(std::move(block));
  }
  final_layer_norm_ = register_module("final_layer_norm", RMSNorm(cfg.d_model, cfg.layer_norm_epsilon, options));
}

at::Tensor T5StackImpl::forward(const at::Tensor& x, const at::Tensor& mask) {
  at::Tensor h = x, bias = mask;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::vector<at::Tensor> out = blocks_[i](h, bias);
    h = std::move(out.at(0));
    if (i == 0) bias = std::move(out.at(1));  // the position bias, for every later block
  }
  return final_layer_norm_(h);
}

at::Tensor T5StackImpl::forward(const at::Tensor& x, const at::Tensor& causal, const at::Tensor& enc,
                                const at::Tensor& enc_mask) {
  at::Tensor g = x, bias = causal;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::vector<at::Tensor> out = blocks_[i](g, bias, enc, enc_mask);
    g = std::move(out.at(0));
    if (i == 0) bias = std::move(out.at(1));
  }
  return final_layer_norm_(g);
}

T5ForConditionalGenerationImpl::T5ForConditionalGenerationImpl(const T5Config& cfg, const at::TensorOptions& options,
                                                               uint64_t seed)
    : cfg_(cfg) {
  cfg_.validate();
  shared_ = register_module("shared", Embedding(cfg_.vocab_size, cfg_.d_model, options));
  encoder_ = register_module("encoder", T5Stack(cfg_, options, /*decoder=*/false));
  decoder_ = register_module("decoder", T5Stack(cfg_, options, /*decoder=*/true));
  if (!cfg_.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", Linear(cfg_.d_model, cfg_.vocab_size, /*bias=*/false, options));
  }
  if (options.device().type() != at::kMeta) nn::init_module(*this, t5_init_rule(cfg_), seed);
}

const at::Tensor& T5ForConditionalGenerationImpl::head_weight() const {
  return lm_head_ ? lm_head_->weight() : shared_->weight();
}

at::Tensor T5ForConditionalGenerationImpl::decode(const at::Tensor& inputs, const at::Tensor& targets) {
  check_ids(cfg_, inputs, "inputs", /*ignore_ok=*/false);
  check_ids(cfg_, targets, "targets", /*ignore_ok=*/true);
  FSDP_CHECK(inputs.size(0) == targets.size(0), "model '", cfg_.name, "': inputs hold ", inputs.size(0),
             " rows but targets ", targets.size(0));
  const at::Tensor x = shared_(inputs);  // (B, Ts, D)
  const at::ScalarType dtype = x.scalar_type();
  // (B, 1, 1, Ts): padding hidden from every query (encoder, and the decoder's cross-attention).
  const at::Tensor enc_mask = additive_mask(inputs.ne(cfg_.pad_token_id).unsqueeze(1).unsqueeze(1), dtype);
  const at::Tensor enc = encoder_->forward(x, enc_mask);
  // transformers' _shift_right: start token, then the targets but the last; ignored as pad.
  const int64_t Tt = targets.size(1);
  at::Tensor dec_in = at::full_like(targets, cfg_.decoder_start_token_id);
  if (Tt > 1) dec_in.narrow(1, 1, Tt - 1).copy_(targets.narrow(1, 0, Tt - 1));
  dec_in.masked_fill_(dec_in.eq(kIgnoreIndex), cfg_.pad_token_id);
  const at::TensorOptions bools = at::TensorOptions().dtype(at::kBool).device(targets.device());
  const at::Tensor causal = additive_mask(at::ones({Tt, Tt}, bools).tril().unsqueeze(0).unsqueeze(0), dtype);
  at::Tensor g = decoder_->forward(shared_(dec_in), causal, enc, enc_mask);  // (B, Tt, D)
  if (cfg_.scale_decoder_outputs) g = g * std::pow(static_cast<double>(cfg_.d_model), -0.5);
  return g;
}

at::Tensor T5ForConditionalGenerationImpl::logits(const at::Tensor& inputs, const at::Tensor& targets) {
  return at::linear(decode(inputs, targets), head_weight());
}

at::Tensor T5ForConditionalGenerationImpl::loss(const at::Tensor& inputs, const at::Tensor& targets,
                                                LossReduction reduction) {
  const at::Tensor g = decode(inputs, targets);
  const int64_t rows = models::loss_chunk_rows(loss_chunk_rows_, cfg_.vocab_size, g.device().type());
  return chunked_cross_entropy(g.reshape({-1, cfg_.d_model}), head_weight(), targets.reshape({-1}), reduction, rows,
                               nullptr, loss_kernels_);
}

void T5ForConditionalGenerationImpl::set_loss_chunk_rows(int64_t rows) {
  FSDP_CHECK(rows >= 0, "model '", cfg_.name, "': the loss's chunk of rows must be >= 0, got ", rows);
  loss_chunk_rows_ = rows;
}

std::vector<std::string> T5ForConditionalGenerationImpl::unit_call_order() const {
  std::vector<std::string> order = {""};  // shared.weight, the root's, first used by the encoder's embedding
  for (size_t i = 0; i < encoder_->blocks().size(); ++i) order.push_back("encoder.block." + std::to_string(i));
  for (size_t i = 0; i < decoder_->blocks().size(); ++i) order.push_back("decoder.block." + std::to_string(i));
  return order;
}

nn::InitRuleFn t5_init_rule(const T5Config& cfg) {
  const double f = cfg.initializer_factor, D = static_cast<double>(cfg.d_model);
  const double F = static_cast<double>(cfg.d_ff), Dh = static_cast<double>(cfg.d_kv);
  const double HDh = static_cast<double>(cfg.num_heads) * Dh;
  return [=](const std::string& name) -> nn::InitRule {
    if (ends_with(name, "layer_norm.weight")) return nn::InitRule::constant(f);  // and final_layer_norm
    if (name == "shared.weight" || name == "lm_head.weight") return nn::InitRule::normal(f);
    if (ends_with(name, ".wi.weight") || ends_with(name, ".wi_0.weight") || ends_with(name, ".wi_1.weight")) {
      return nn::InitRule::normal(f * std::pow(D, -0.5));
    }
    if (ends_with(name, ".wo.weight")) return nn::InitRule::normal(f * std::pow(F, -0.5));
    if (ends_with(name, ".q.weight")) return nn::InitRule::normal(f * std::pow(D * Dh, -0.5));
    if (ends_with(name, ".k.weight") || ends_with(name, ".v.weight")) return nn::InitRule::normal(f * std::pow(D, -0.5));
    if (ends_with(name, ".o.weight")) return nn::InitRule::normal(f * std::pow(HDh, -0.5));
    if (ends_with(name, "relative_attention_bias.weight")) return nn::InitRule::normal(f * std::pow(D, -0.5));
    FSDP_ASSERT(false, "t5_init_rule: no rule for parameter '", name, "'");
    return nn::InitRule::zeros();
  };
}

std::type_index t5_block_type() { return std::type_index(typeid(T5BlockImpl)); }

}  // namespace fsdp::models

#include "fsdp/models/moe.h"

#include <string>

#include "fsdp/common/error.h"

namespace fsdp::models {

MixtralExpertImpl::MixtralExpertImpl(const LlamaConfig& cfg, const at::TensorOptions& options) {
  const int64_t D = cfg.hidden_size, F = cfg.intermediate_size;
  // Registration order = transformers 4's MixtralBlockSparseTop2MLP (w1, w2, w3).
  w1_ = register_module("w1", Linear(D, F, /*bias=*/false, options));
  w2_ = register_module("w2", Linear(F, D, /*bias=*/false, options));
  w3_ = register_module("w3", Linear(D, F, /*bias=*/false, options));
}

at::Tensor MixtralExpertImpl::forward(const at::Tensor& x) { return w2_(at::silu(w1_(x)) * w3_(x)); }

MixtralSparseMoeBlockImpl::MixtralSparseMoeBlockImpl(const LlamaConfig& cfg, const at::TensorOptions& options)
    : num_experts_(cfg.num_local_experts), top_k_(cfg.num_experts_per_tok) {
  FSDP_ASSERT(cfg.moe() && num_experts_ >= 1 && top_k_ >= 1 && top_k_ <= num_experts_,
              "MixtralSparseMoeBlock needs a validated mixtral config, got model_type '", cfg.model_type, "' E=",
              num_experts_, " K=", top_k_);
  gate_ = register_module("gate", Linear(cfg.hidden_size, num_experts_, /*bias=*/false, options));
  experts_ = register_module("experts", torch::nn::ModuleList());
  expert_list_.reserve(static_cast<size_t>(num_experts_));
  for (int64_t e = 0; e < num_experts_; ++e) {
    MixtralExpert expert(cfg, options);
    experts_->push_back(expert.ptr());
    expert_list_.push_back(std::move(expert));
  }
}

// Note [Expert dispatch]
// No loop over tokens. The N*K (token, choice) slots s = n*K + j are sorted by
// expert with a stable argsort, so each expert's tokens form one contiguous
// slice of a gathered (N*K, D) copy of x (in token order within the slice);
// each expert runs one set of matmuls on its slice, and index_add scatters
// the weighted results back onto their tokens. Slicing needs the per-expert
// counts on the host: one sync per layer (transformers' loop over the experts
// that were hit syncs too). Every expert runs, on zero rows when no token
// chose it: its weights then get a zero gradient instead of none, so the
// sharding engine sees every parameter's gradient in every backward rather
// than flushing absent ones at the end. For each token, index_add adds its K
// contributions in ascending expert order onto zeros — the order of
// transformers' per-expert index_add_ — so fp32 results agree to rounding of
// the matmuls alone.
std::pair<at::Tensor, at::Tensor> MixtralSparseMoeBlockImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  const int64_t N = B * T, E = num_experts_, K = top_k_;
  const at::Tensor flat = x.reshape({N, D});                  // (N, D)
  const at::Tensor router_logits = gate_(flat);               // (N, E), x's dtype
  const at::Tensor probs = at::softmax(router_logits, -1, at::kFloat);  // (N, E) fp32
  auto [top_w, top_i] = at::topk(probs, K, -1);               // (N, K) fp32, (N, K) int64
  top_w = top_w / top_w.sum(-1, /*keepdim=*/true);            // renormalised over the K chosen

  const at::Tensor expert_of = top_i.reshape({-1});                     // (N*K) expert of slot s
  const at::Tensor order = at::argsort(expert_of, /*stable=*/true);    // (N*K) slots grouped by expert
  const at::Tensor token_of = at::div(order, K, "floor");              // (N*K) token of each sorted slot
  const at::Tensor weight_of = top_w.reshape({-1}).index_select(0, order).unsqueeze(1);  // (N*K, 1) fp32
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  if (x.is_meta()) {
    counts[0] = N * K;  // shapes only: any split will do
  } else {
    const at::Tensor c = at::bincount(expert_of, /*weights=*/{}, E).to(at::kCPU);  // the one host sync
    const int64_t* cp = c.data_ptr<int64_t>();
    for (int64_t e = 0; e < E; ++e) counts[static_cast<size_t>(e)] = cp[e];
  }
  const at::Tensor routed = flat.index_select(0, token_of);  // (N*K, D), grouped by expert
  std::vector<at::Tensor> outs;
  outs.reserve(static_cast<size_t>(E));
  int64_t offset = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    outs.push_back(expert_list_[static_cast<size_t>(e)](routed.narrow(0, offset, n)));  // (n, D)
    offset += n;
  }
  FSDP_ASSERT(offset == N * K, "expert counts sum to ", offset, ", expected N*K = ", N * K);
  // transformers: (expert output * fp32 weight) in fp32, cast to x's dtype, summed per token.
  const at::Tensor weighted = (at::cat(outs) * weight_of).to(x.scalar_type());  // (N*K, D)
  const at::Tensor out = at::zeros_like(flat).index_add(0, token_of, weighted);  // (N, D)
  return {out.view({B, T, D}), router_logits};
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  FSDP_ASSERT(!router_logits.empty(), "load_balancing_loss needs the router logits of at least one layer");
  const int64_t E = num_experts;
  const at::TensorOptions f32 = router_logits.front().options().dtype(at::kFloat);
  // The same operations in the same order as transformers' function (mask-free branch).
  at::Tensor tokens_per_expert_sum = at::zeros({E}, f32);
  at::Tensor router_prob_sum = at::zeros({E}, f32);
  double total_rows = 0;
  for (const at::Tensor& layer_logits : router_logits) {
    FSDP_ASSERT(layer_logits.dim() == 2 && layer_logits.size(1) == E, "router logits must be (N, E=", E, "), got ",
                layer_logits.sizes());
    const at::Tensor routing_weights = at::softmax(layer_logits, -1);  // (N, E), the logits' dtype
    const at::Tensor selected = std::get<1>(at::topk(routing_weights, top_k, -1)).reshape({-1});  // (N*K)
    // Counts by scatter_add: no host sync (bincount needs one for its size on GPUs).
    tokens_per_expert_sum =
        tokens_per_expert_sum + at::zeros({E}, f32).scatter_add(0, selected, at::ones(selected.sizes(), f32));
    router_prob_sum = router_prob_sum + routing_weights.to(at::kFloat).sum(0);
    total_rows += static_cast<double>(routing_weights.size(0));
  }
  const at::Tensor tokens_per_expert = tokens_per_expert_sum / total_rows;
  const at::Tensor router_prob_per_expert = router_prob_sum / total_rows;
  return at::sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * static_cast<double>(E);
}

}  // namespace fsdp::models

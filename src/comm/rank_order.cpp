#include "comm/rank_order.h"

namespace fsdp::comm {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

at::Tensor raw(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {t.numel()}, at::TensorOptions().dtype(t.scalar_type()).device(t.device()));
}

void reduce_in_rank_order(const std::vector<at::Tensor>& parts, at::Tensor out, ReduceOp op,
                          const at::Tensor& acc_scratch) {
  const size_t w = parts.size();
  if (op == ReduceOp::kMax) {  // exact in any precision
    at::maximum_out(out, parts[0], parts[1]);
    for (size_t i = 2; i < w; ++i) at::maximum_out(out, out, parts[i]);
    return;
  }
  if (!is_half(out.scalar_type())) {
    at::add_out(out, parts[0], parts[1]);  // == copy of parts[0], then += parts[1]
    for (size_t i = 2; i < w; ++i) out.add_(parts[i]);
    if (op == ReduceOp::kAvg) out.div_(static_cast<int64_t>(w));
    return;
  }
  at::Tensor acc = acc_scratch.narrow(0, 0, out.numel());
  acc.copy_(parts[0]);
  for (size_t i = 1; i < w; ++i) acc.add_(parts[i]);  // fp32 += half: computed in fp32
  if (op == ReduceOp::kAvg) acc.div_(static_cast<int64_t>(w));
  out.copy_(acc);  // the one rounding
}

}  // namespace fsdp::comm

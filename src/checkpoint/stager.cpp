#include "stager.h"

#include <algorithm>

#include "fsdp/common/device.h"
#include "fsdp/common/error.h"

namespace fsdp::checkpoint {

int64_t StagingPool::bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers) n += b.defined() ? static_cast<int64_t>(b.nbytes()) : 0;
  return n;
}

Stager::Key Stager::key_of(const at::Tensor& t) {
  return {t.data_ptr(), t.numel(), static_cast<int>(t.scalar_type())};
}

const at::Tensor& Stager::add(const at::Tensor& t) {
  FSDP_ASSERT(!copied_, "a tensor registered with a Stager after its copy");
  if (t.numel() == 0) return t;  // nothing to read
  if (index_.emplace(key_of(t), tensors_.size()).second) {
    tensors_.push_back(t);
    bytes_ += static_cast<int64_t>(t.nbytes());
  }
  return t;
}

void Stager::copy(StagingPool& pool) {
  FSDP_ASSERT(!copied_, "a Stager copied twice");
  at::NoGradGuard no_grad;
  if (pool.buffers.size() < tensors_.size()) pool.buffers.resize(tensors_.size());
  std::vector<c10::Device> devices;  // GPUs copied from
  copies_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& t = tensors_[i];
    const bool pin = t.is_cuda();  // page-locked: the copy from the GPU runs without the host waiting on each
    at::Tensor& b = pool.buffers[i];
    if (!b.defined() || b.numel() != t.numel() || b.scalar_type() != t.scalar_type() || b.is_pinned() != pin) {
      b = at::empty({t.numel()}, at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU).pinned_memory(pin));
    }
    at::Tensor c = b.view(t.sizes());
    c.copy_(t, /*non_blocking=*/pin);
    if (pin && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) devices.push_back(t.device());
    copies_.push_back(c);
  }
  // Sync by host here: the writer thread reads the copies, and the caller's
  // next kernels (which change the originals) queue behind these copies.
  for (const auto& d : devices) synchronize(d);
  copied_ = true;
}

at::Tensor Stager::operator()(const at::Tensor& t) const {
  if (!copied_ || t.numel() == 0) return t;
  const auto it = index_.find(key_of(t));
  FSDP_ASSERT(it != index_.end(), "a save read a tensor it did not stage (", t.numel(), " elements)");
  return copies_[it->second];
}

}  // namespace fsdp::checkpoint

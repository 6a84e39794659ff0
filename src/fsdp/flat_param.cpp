#include "fsdp/flat_param.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <unordered_set>

#include "fsdp/common/internals.h"
#include "fsdp/common/error.h"

namespace fsdp::detail {

// Note [Flat layout]
// Offsets come from the recorded order of named_parameters(), never from an
// assumed order: LibTorch lists a module's own parameters before its
// children's. Padding sits at the end, so every parameter is contiguous in
// the flat buffer and a rank's chunk may cut through parameters anywhere.
FlatLayout FlatLayout::make(std::vector<ParamPlacement> params, int shard_size) {
  FSDP_ASSERT(shard_size >= 1);
  FlatLayout l;
  l.shard_size = shard_size;
  int64_t off = 0;
  for (auto& p : params) {
    p.flat_offset = off;
    off += p.numel;
  }
  l.params = std::move(params);
  l.numel = off;
  l.padded_numel = (off + shard_size - 1) / shard_size * shard_size;
  l.shard_numel = l.padded_numel / shard_size;
  return l;
}

std::pair<int64_t, int64_t> FlatLayout::overlap(size_t p, int64_t begin, int64_t end) const {
  const auto& pp = params.at(p);
  const int64_t lo = std::max(begin, pp.flat_offset);
  const int64_t hi = std::min(end, pp.flat_offset + pp.numel);
  if (hi <= lo) return {0, 0};
  return {lo - pp.flat_offset, hi - lo};
}

void MemoryLedger::add(BufferKind kind, int64_t bytes) {
  slot(kind) += bytes;
  if (memory_.now.total() > memory_.peak) {
    memory_.peak = memory_.now.total();
    memory_.at_peak = memory_.now;
  }
}

void MemoryLedger::release(BufferKind kind, int64_t bytes) {
  int64_t& s = slot(kind);
  FSDP_ASSERT(s >= bytes, "the unsharded-memory ledger releases ", bytes, " bytes of kind ", static_cast<int>(kind),
              " but holds ", s);
  s -= bytes;
}

void MemoryLedger::reset_peak() {
  memory_.peak = memory_.now.total();
  memory_.at_peak = memory_.now;
}

int64_t& MemoryLedger::slot(BufferKind kind) {
  switch (kind) {
    case BufferKind::kParams: return memory_.now.params;
    case BufferKind::kGrads: return memory_.now.grads;
    case BufferKind::kReductions: return memory_.now.reductions;
    case BufferKind::kAccumulated: break;
  }
  return memory_.now.accumulated;
}

FlatParam::FlatParam(std::vector<Source> params, const FlatParamOptions& options)
    : options_(options),
      single_copy_(options.replicated && options.shard_dtype == options.param_dtype &&
                   options.shard_device == options.device) {
  std::vector<ParamPlacement> placements;
  for (auto& s : params) {
    FSDP_ASSERT(s.param.requires_grad() == options_.trainable, "parameter '", s.name, "' has requires_grad ",
                s.param.requires_grad(), " in a flat parameter of ", options_.trainable ? "trainable" : "frozen",
                " parameters");
    ParamPlacement pl;
    pl.name = s.name;
    pl.shape = s.param.sizes().vec();
    pl.numel = s.param.numel();
    placements.push_back(std::move(pl));
    params_.push_back(s.param);
  }
  layout_ = FlatLayout::make(std::move(placements), options_.shard_size);
  FSDP_ASSERT(!options_.replicated || options_.shard_size == 1);
  const auto so = at::TensorOptions()
                      .dtype(options_.shard_dtype)
                      .device(options_.shard_device)
                      .pinned_memory(options_.pin_shards);
  shard_ = at::zeros({layout_.shard_numel}, so);
  if (options_.trainable) grad_shard_ = at::zeros({layout_.shard_numel}, so);
}

at::Tensor FlatParam::gather_source_values() const {
  std::vector<at::Tensor> flat;
  flat.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDP_CHECK(!params_[i].is_meta(), "parameter '", layout_.params[i].name,
               "' is on the meta device; sync_module_states needs materialized parameters on every rank "
               "(or build on meta and give FsdpOptions::init_rule instead)");
    flat.push_back(params_[i].detach().reshape({-1}).to(at::kFloat).cpu());
  }
  if (flat.empty()) return at::zeros({0});
  return at::cat(flat);
}

void FlatParam::init_shard(const at::Tensor& flat_source, const nn::InitRuleFn& rule, uint64_t seed) {
  at::NoGradGuard no_grad;
  const int64_t begin = shard_offset();
  const int64_t end = begin + layout_.shard_numel;
  shard_.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto [first, count] = layout_.overlap(i, begin, end);
    if (count == 0) continue;
    const auto& pl = layout_.params[i];
    at::Tensor dst = shard_.narrow(0, pl.flat_offset + first - begin, count);
    if (flat_source.defined()) {
      dst.copy_(flat_source.narrow(0, pl.flat_offset + first, count));
    } else if (params_[i].is_meta()) {
      FSDP_CHECK(static_cast<bool>(rule), "parameter '", pl.name,
                 "' is on the meta device but FsdpOptions::init_rule is empty; give the model's init rule "
                 "(e.g. models::llama_init_rule()) so each rank can materialize its shard");
      if (dst.scalar_type() == options_.master_dtype) {
        nn::init_slice(dst, rule(pl.name), seed, pl.name, first);
      } else {  // one rounding from the master dtype, not a direct one from the rule's doubles
        at::Tensor master = at::empty({count}, dst.options().dtype(options_.master_dtype));
        nn::init_slice(master, rule(pl.name), seed, pl.name, first);
        dst.copy_(master);
      }
    } else {
      dst.copy_(params_[i].detach().reshape({-1}).narrow(0, first, count));
    }
  }
}

void FlatParam::bind(bool keep_allocated) {
  if (single_copy_) {
    full_ = shard_;
  } else {
    full_ = new_full_buffer();
    options_.ledger->add(BufferKind::kParams, full_bytes());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& pl = layout_.params[i];
    internals::rebind_data(params_[i], full_.narrow(0, pl.flat_offset, pl.numel).view(pl.shape));
    if (!single_copy_) {
      refusing_.push_back(internals::refusing_storage(
          options_.device, "parameter '" + pl.name +
                               "' is resharded: between uses FSDP keeps only each rank's shard of it. Read it "
                               "inside the model's forward, or gather it with ShardedModel::gather_unit (a full "
                               "state dict, an export)"));
    }
  }
  storage_ = StorageState::kAllocated;
  if (!keep_allocated && !single_copy_) free_full();
}

// Note [Host buffers from mmap]
// On the CPU, unsharded buffers (parameters and gradients, one unit's worth
// each) come from mmap, through the model's HostBufferPool. Through malloc,
// glibc raises its mmap threshold to the largest block freed, after which
// unit-sized buffers are carved from the heap and stay resident once freed
// (~10% more peak RSS in the 100M-parameter memory test). Straight mmap/munmap
// per use instead faults in and zeroes fresh pages for every unit twice a step
// (about a tenth of a CPU step's time in the kernel); the pool keeps a couple of
// released unit-sized blocks for the next unit, a bounded, known cost.
at::Tensor FlatParam::new_full_buffer() const {
  if (options_.pool) return options_.pool->empty(layout_.padded_numel, options_.param_dtype);
  if (options_.device.is_cpu() && options_.host_pool) {
    return options_.host_pool->empty(layout_.padded_numel, options_.param_dtype);
  }
  return at::empty({layout_.padded_numel}, at::TensorOptions().dtype(options_.param_dtype).device(options_.device));
}

int64_t FlatParam::full_bytes() const {
  return layout_.padded_numel * static_cast<int64_t>(c10::elementSize(options_.param_dtype));
}

void FlatParam::alloc_full() {
  FSDP_ASSERT(storage_ == StorageState::kFreed);
  internals::alloc_storage(full_, static_cast<size_t>(full_bytes()));
  options_.ledger->add(BufferKind::kParams, full_bytes());
  for (auto& p : params_) internals::set_storage(p, full_.storage());
  storage_ = StorageState::kAllocated;
}

void FlatParam::alloc_full_from(const at::Tensor& buffer) {
  FSDP_ASSERT(storage_ == StorageState::kFreed);
  FSDP_CHECK(buffer.is_contiguous() && buffer.numel() == layout_.padded_numel &&
                 buffer.scalar_type() == options_.param_dtype && buffer.device() == options_.device &&
                 buffer.storage_offset() == 0 && buffer.storage().nbytes() >= static_cast<size_t>(full_bytes()),
             "a custom all-gather's allocate must return ", layout_.padded_numel, " contiguous elements of ",
             options_.param_dtype, " on ", options_.device, " at the start of their storage; got ", buffer.sizes(),
             " ", buffer.scalar_type(), " on ", buffer.device());
  internals::adopt_storage(full_, buffer);
  options_.ledger->add(BufferKind::kParams, full_bytes());
  for (auto& p : params_) internals::set_storage(p, full_.storage());
  storage_ = StorageState::kAllocated;
}

void FlatParam::free_full() {
  FSDP_ASSERT(!single_copy_, "the single-copy buffer is never freed");
  if (storage_ == StorageState::kFreed) return;
  internals::free_storage(full_);
  options_.ledger->release(BufferKind::kParams, full_bytes());
  // Note [Refusing storage]. The module's parameters point at a storage that
  // refuses every read with the parameter's name, instead of at full_'s
  // freed bytes, which kernels would read through a null pointer. full_ and
  // the tensors autograd saved keep the real storage, refilled by alloc_full.
  for (size_t i = 0; i < params_.size(); ++i) internals::set_storage(params_[i], refusing_[i]);
  storage_ = StorageState::kFreed;
}

// Note [Post-forward shards]
// reshard_after_forward = g (FSDP2's int; ZeRO++'s hpZ): after forward the
// unit keeps 1/g of its unsharded parameters — the chunk of full_ this rank
// has in its group of g consecutive ranks — instead of nothing, so that
// backward gathers over those g ranks (inside a node) rather than the whole
// shard group. The values are full_'s bits, so backward computes with exactly
// the parameters forward used. The copy is made before full_ is freed: both
// are held for a moment (the ledger and the plan count it so).
void FlatParam::keep_post_forward_shard(int group, int rank_in_group) {
  FSDP_ASSERT(storage_ == StorageState::kAllocated && !post_forward_.defined() && group >= 1 &&
              layout_.padded_numel % group == 0);
  const int64_t n = layout_.padded_numel / group;
  {
    at::NoGradGuard no_grad;
    post_forward_ = full_.narrow(0, n * rank_in_group, n).clone();
  }
  post_forward_group_ = group;
  post_forward_rank_ = rank_in_group;
  options_.ledger->add(BufferKind::kParams, n * static_cast<int64_t>(c10::elementSize(options_.param_dtype)));
  free_full();
}

at::Tensor FlatParam::refill_from_post_forward_shard() {
  FSDP_ASSERT(post_forward_.defined());
  alloc_full();
  const int64_t n = post_forward_.numel();
  at::Tensor chunk = full_.narrow(0, n * post_forward_rank_, n);
  {
    at::NoGradGuard no_grad;
    at::AutoDispatchBelowADInplaceOrView below_ad;  // the parameters view full_: no version bump
    chunk.copy_(post_forward_);
  }
  return chunk;
}

void FlatParam::drop_post_forward_shard() {
  if (!post_forward_.defined()) return;
  options_.ledger->release(BufferKind::kParams, static_cast<int64_t>(post_forward_.nbytes()));
  post_forward_ = at::Tensor();
  post_forward_group_ = 0;
}

void FlatParam::prepare_full_grad(bool keep) {
  FSDP_ASSERT(options_.trainable, "gradients prepared for frozen parameters");
  if (single_copy_) {
    full_grad_ = grad_shard_;
    if (!keep) full_grad_.zero_();
  } else if (!full_grad_.defined()) {
    full_grad_ = new_full_buffer().zero_();
    options_.ledger->add(BufferKind::kGrads, full_bytes());
  } else if (!keep) {
    full_grad_.zero_();
  }
  // Re-point every .grad each time: AccumulateGrad replaces an undefined
  // .grad instead of adding into it (docs/design.md, "Pitfalls met on the way").
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& pl = layout_.params[i];
    params_[i].mutable_grad() = full_grad_.narrow(0, pl.flat_offset, pl.numel).view(pl.shape);
  }
}

void FlatParam::release_full_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
  if (!single_copy_ && full_grad_.defined()) {
    // Back to the pool now, not when the last reference goes (a collective's
    // handle may hold one a little longer): the pool's next block is ordered
    // after this one's uses (Note [Preallocated pool]).
    internals::free_storage(full_grad_);
    full_grad_ = at::Tensor();
    options_.ledger->release(BufferKind::kGrads, full_bytes());
  }
}

}  // namespace fsdp::detail

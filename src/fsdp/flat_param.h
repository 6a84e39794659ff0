// FlatParam: one unit's parameters as a single flat, padded, sharded buffer.
//
// Layout (see Note [Flat layout]): parameters in registration order,
// flattened and concatenated into N elements, padded with zeros to
// Np = ceil(N / S) * S for a shard group of size S. Rank r owns the padded
// range [r*n, (r+1)*n), n = Np / S.
//
// Tensors owned here:
//   shard_       (n) shard dtype (fp32; bf16 for pure-bf16 training)
//                           the master copy of this rank's chunk; the optimizer
//                           updates it in place. Always resident, on the shard
//                           device (host memory with CPU offload, pinned when
//                           CUDA is present).
//   grad_shard_  (n) shard dtype, shard device: reduced gradients; valid once
//                           a reduction landed since the last zero_grad.
//                           Undefined for frozen parameters (never any gradients).
//   full_        (Np) param dtype   the unsharded buffer; the module's
//                           parameters are views of it. Its bytes exist only
//                           while unsharded (StorageState below).
//   full_grad_   (Np) param dtype   unsharded gradients during backward; the
//                           parameters' .grad are views of it, so
//                           AccumulateGrad adds in place.
// NO_SHARD with parameters in the shard dtype on the shard device keeps a
// single copy: full_ is shard_ and full_grad_ is grad_shard_.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/common/internals.h"
#include "fsdp/fsdp.h"
#include "fsdp/unsharded_pool.h"

namespace fsdp::detail {

// Pure arithmetic of the layout; unit-testable without tensors.
struct FlatLayout {
  std::vector<ParamPlacement> params;
  int64_t numel = 0;         // N
  int64_t padded_numel = 0;  // Np
  int64_t shard_numel = 0;   // n
  int shard_size = 1;        // S

  static FlatLayout make(std::vector<ParamPlacement> params, int shard_size);

  // The part of parameter p inside the padded range [begin, end):
  // returns {first element of p, count}; count 0 when disjoint.
  std::pair<int64_t, int64_t> overlap(size_t p, int64_t begin, int64_t end) const;
};

// The engine's ledger of its unsharded buffers (Note [Unsharded memory] in
// plan.cpp): every allocation and release of one is counted here, by kind.
// One per model, used from the training thread only.
enum class BufferKind { kParams, kGrads, kReductions, kAccumulated };

class MemoryLedger {
 public:
  void add(BufferKind kind, int64_t bytes);
  void release(BufferKind kind, int64_t bytes);
  const UnshardedMemory& memory() const { return memory_; }
  void reset_peak();

 private:
  int64_t& slot(BufferKind kind);
  UnshardedMemory memory_;
};

// Whether the bytes of the unsharded buffer exist.
enum class StorageState {
  kFreed,      // full_ has no bytes; reading a parameter throws, naming it (Note [Refusing storage])
  kAllocated,  // full_ has bytes (being filled, or filled)
};

struct FlatParamOptions {
  int shard_rank = 0;
  int shard_size = 1;
  at::ScalarType param_dtype = at::kFloat;  // full_, full_grad_
  at::ScalarType shard_dtype = at::kFloat;  // shard_, grad_shard_
  // The dtype values are defined in (the policy's master dtype). A frozen flat
  // parameter stores its shard in the param dtype instead (Note [Frozen shards
  // in the param dtype] in model.cpp): initial values are computed in this
  // dtype and rounded once, as a master copy would be at every gather.
  at::ScalarType master_dtype = at::kFloat;
  at::Device device = at::kCPU;             // full_, full_grad_
  at::Device shard_device = at::kCPU;       // shard_, grad_shard_
  bool pin_shards = false;                  // page-locked host shards (CPU offload with CUDA)
  bool replicated = false;                  // NO_SHARD: full_ is never freed
  bool trainable = true;                    // false: every parameter is frozen (no gradient buffers)
  // Host memory for full_ and full_grad_ on the CPU (shared by every unit of a
  // model; see Note [Host buffers from mmap]). Null: LibTorch's allocator.
  std::shared_ptr<internals::HostBufferPool> host_pool;
  // The model's preallocated pool for full_ and full_grad_ (Note [Preallocated
  // pool] in unsharded_pool.cpp): set on CUDA; takes precedence over host_pool.
  std::shared_ptr<UnshardedPool> pool;
  // Where full_ and full_grad_ are counted (never null once the engine built it).
  std::shared_ptr<MemoryLedger> ledger;
};

class FlatParam {
 public:
  struct Source {
    std::string name;
    at::Tensor param;  // the module's parameter (meta or materialized)
  };

  // `params`: the unit's own parameters in registration order, shared tensors
  // listed once. The module's parameters are not touched until bind().
  FlatParam(std::vector<Source> params, const FlatParamOptions& options);

  const FlatLayout& layout() const { return layout_; }
  int64_t shard_offset() const { return options_.shard_rank * layout_.shard_numel; }

  // Fills shard_ from `flat_source` (the unit's unpadded flat values in any
  // dtype; undefined: take the parameters' own values) or, for parameters on
  // the meta device, from `rule` (name-keyed init). Padding is zero.
  void init_shard(const at::Tensor& flat_source, const nn::InitRuleFn& rule, uint64_t seed);
  // The unit's unpadded flat values from the module's (materialized) parameters.
  at::Tensor gather_source_values() const;

  // Points every module parameter at its view of full_ (once, after init).
  // `keep_allocated`: leave full_'s bytes in place (NO_SHARD).
  void bind(bool keep_allocated);

  at::Tensor& shard() { return shard_; }
  at::Tensor& grad_shard() { return grad_shard_; }
  at::Tensor& full() { return full_; }
  at::Tensor& full_grad() { return full_grad_; }
  bool single_copy() const { return single_copy_; }
  bool trainable() const { return options_.trainable; }
  at::ScalarType param_dtype() const { return options_.param_dtype; }
  const FlatParamOptions& options() const { return options_; }

  void alloc_full();
  // alloc_full with the bytes of `buffer` (a custom all-gather's allocate):
  // Np contiguous elements of the param dtype on the device.
  void alloc_full_from(const at::Tensor& buffer);
  void free_full();
  // Note [Post-forward shards]: keeps chunk `rank_in_group` of `group` chunks
  // of full_ (param dtype), then frees full_. Requires: full_ allocated.
  void keep_post_forward_shard(int group, int rank_in_group);
  // alloc_full, and the post-forward shard copied into its chunk of full_:
  // returns that chunk (the all-gather's input over the group).
  at::Tensor refill_from_post_forward_shard();
  // Frees the post-forward shard (after the all-gather read it, or to drop it).
  void drop_post_forward_shard();
  bool holds_post_forward_shard() const { return post_forward_.defined(); }
  // This rank's chunk of full_ (valid while allocated).
  at::Tensor own_chunk() { return full_.narrow(0, shard_offset(), layout_.shard_numel); }

  // Allocates full_grad_ (zeros) and points every parameter's .grad at its
  // view. With `keep` the existing buffer and its contents stay.
  // Requires: trainable().
  void prepare_full_grad(bool keep);
  // Drops .grad of every parameter and releases full_grad_'s bytes (unless
  // single copy) at once, whoever else still holds the tensor. Requires:
  // nothing reads or writes full_grad_ on the device after work issued
  // before this call (a reduction of it was waited for). Idempotent.
  void release_full_grad();

  // The module parameters (unique), in layout order.
  const std::vector<at::Tensor>& params() const { return params_; }

 private:
  at::Tensor new_full_buffer() const;
  int64_t full_bytes() const;  // of full_ or full_grad_ (Np elements of the param dtype)

  FlatLayout layout_;
  std::vector<at::Tensor> params_;
  FlatParamOptions options_;
  bool single_copy_;
  StorageState storage_ = StorageState::kAllocated;

  at::Tensor shard_;       // (n) shard dtype, shard device
  at::Tensor grad_shard_;  // (n) shard dtype, shard device
  at::Tensor full_;        // (Np) param dtype
  at::Tensor full_grad_;   // (Np) param dtype
  at::Tensor post_forward_;  // (Np / g) param dtype: chunk post_forward_rank_ of full_, or undefined
  int post_forward_group_ = 0;
  int post_forward_rank_ = 0;
  std::vector<c10::Storage> refusing_;  // per parameter, while kFreed (Note [Refusing storage])
};

}  // namespace fsdp::detail

// The tensors one save reads, and their staged copies (internal to the
// checkpoint layer). A payload's prepare registers what its write reads
// (Note [Checkpoint payloads] in payload.h); an asynchronous save copies them
// into host buffers before training goes on (Note [Save phases] in save_job.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace fsdp::checkpoint {

// Where a save's tensors are read from while its files are written.
enum class Staging {
  kLive,  // the model's and the owners' own tensors: they must not change until the write is done
  kCopy,  // copies in host memory (page-locked when the tensor is on a GPU), made by begin_save
};

// Host buffers that can hold one save's copies, kept between saves so that a
// save copies into memory already touched (no page faults on the step's
// time). Index i holds the i-th tensor registered with a Stager.
struct StagingPool {
  std::vector<at::Tensor> buffers;
  int64_t bytes() const;
};

// The tensors one save reads, and their staged copies.
class Stager {
 public:
  // Registers `t` (once per tensor; a repeat is ignored); returns it.
  const at::Tensor& add(const at::Tensor& t);
  // Bytes of every registered tensor: the host memory a copy takes.
  int64_t bytes() const { return bytes_; }
  // Copies every registered tensor into `pool`'s buffers (reused where their
  // size, dtype and pinning fit; allocated otherwise), waits until copies from
  // a GPU are complete, and from then on maps each tensor to its copy.
  void copy(StagingPool& pool);
  bool copied() const { return copied_; }
  // What the writer reads for `t`: its copy after copy(), else t itself.
  // Thread-safe after copy() (read-only).
  at::Tensor operator()(const at::Tensor& t) const;

 private:
  using Key = std::tuple<const void*, int64_t, int>;  // data, elements, dtype
  static Key key_of(const at::Tensor& t);
  std::vector<at::Tensor> tensors_;
  std::map<Key, size_t> index_;
  std::vector<at::Tensor> copies_;
  int64_t bytes_ = 0;
  bool copied_ = false;
};

}  // namespace fsdp::checkpoint

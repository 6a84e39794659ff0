// Samples, the distributed global-batch rule, and evaluation windows.
//
// Letters: N tokens in the stream, T = seq_len, B = batch_size (per rank and
// micro-step), W = world_size, A = grad_accum, G = B * W * A (the global batch).
//
// Samples (nanoGPT / llm.c): window w covers tokens [w*T, w*T + T], inputs
// t[w*T .. w*T+T), targets t[w*T+1 .. w*T+T]. Windows do not overlap, so an epoch has
// K = (N - 1) / T of them; the last (N - 1) % T tokens never start a target row in
// training (EvalWindows covers them).
//
// Note [Global batch rule]. Step s consumes global samples g = s*G + j, j in [0, G).
// Micro-step a of rank r takes j = (a*W + r)*B + b for b in [0, B): row b of its batch.
// Sample g is window perm_e(g mod K) of epoch e = g / K. So the SET of windows a step
// sees depends only on (s, G, K, seed, shuffle), never on how G is split into W and A:
// runs at different world sizes are comparable step by step, and the ranks' shares
// are disjoint. If G > K, one step spans several epochs (still no repeats within an
// epoch).
//
// Note [Shuffle]. perm_e is a keyed pseudo-random permutation of [0, K): a 6-round
// balanced Feistel network on the smallest even number of bits that holds K, with
// round keys from SplitMix64(seed, epoch), restricted to [0, K) by cycle walking.
// Each perm_e(i) costs O(1) time and no memory (no K-sized table to build or keep
// per epoch), and is bit-identical on every platform and compiler — no std::shuffle,
// no std::uniform_int_distribution. Different epochs and seeds give unrelated orders.
// shuffle = false: perm_e is the identity for every epoch.
//
// Note [Resume]. get(step, micro_step) is a pure function of its arguments and the
// options: the data position to save for an exact resume is the step alone.
//
// Note [Rows]. What the rule orders are K rows of a RowSource: the windows of
// a token stream above (token_windows), or the examples of an encoder-decoder's
// (input, target) pairs (pairs.h), whose inputs and targets have widths of
// their own. Everything above holds for either.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::data {

class TokenDataset;

// Targets that are padding (EvalWindows); pass it as cross_entropy's ignore_index.
constexpr int64_t kIgnoreIndex = -100;

struct Batch {
  at::Tensor inputs;   // (B, T) int64, CPU, contiguous (pairs: (B, Ts))
  at::Tensor targets;  // (B, T) int64, CPU, contiguous (pairs: (B, Tt))
  int64_t step = -1;        // training: the step and micro-step it belongs to
  int64_t micro_step = -1;  // (eval batches: step = batch index, micro_step = 0)
};

// A keyed permutation of [0, n) (Note [Shuffle]). Cheap to construct and copy.
class WindowPermutation {
 public:
  WindowPermutation(int64_t n, uint64_t seed, int64_t epoch);
  // Requires 0 <= i < n.
  int64_t operator()(int64_t i) const;

 private:
  uint64_t encrypt(uint64_t x) const;

  static constexpr int kRounds = 6;
  int64_t n_;
  int half_bits_ = 0;
  uint64_t half_mask_ = 0;
  uint64_t round_keys_[kRounds] = {};
};

// The K rows a BatchSampler draws from (Note [Rows]). Immutable, thread-safe.
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t rows() const = 0;          // K
  virtual int64_t input_width() const = 0;   // a row's inputs
  virtual int64_t target_width() const = 0;  // a row's targets
  // Row `row` in [0, K): input_width() inputs and target_width() targets.
  virtual void fill(int64_t row, int64_t* inputs, int64_t* targets) const = 0;
  // Row `row`'s targets that are not kIgnoreIndex.
  virtual int64_t targets(int64_t row) const = 0;
  // Whether every row has target_width() targets (windows): a rank's mean over
  // its rows is then the mean over the global batch (Note [Loss over rows] in
  // src/train/step.cpp).
  virtual bool uniform_targets() const = 0;
  virtual std::string describe() const = 0;  // for logs and messages
};

// The K = (N - 1) / T windows of a token stream (inputs t[w*T .. w*T+T), targets
// one further). UsageError, naming the dataset, when N < T + 1.
std::shared_ptr<const RowSource> token_windows(std::shared_ptr<const TokenDataset> dataset, int64_t seq_len);

struct SamplerOptions {
  int64_t seq_len = 0;     // T
  int64_t batch_size = 0;  // B: rows per rank per micro-step
  int64_t world_size = 1;  // W
  int64_t rank = 0;        // r in [0, W)
  int64_t grad_accum = 1;  // A: micro-steps per step
  uint64_t seed = 0;
  bool shuffle = true;
};

class BatchSampler {
 public:
  // UsageError if an option is out of range, or if the dataset is shorter than one
  // window (N < T + 1): the message gives N, T and the fix.
  BatchSampler(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options);
  // Rows of any source (Note [Rows]); options.seq_len is then not used.
  // UsageError when the source has no rows.
  BatchSampler(std::shared_ptr<const RowSource> rows, SamplerOptions options);

  struct Sample {
    int64_t epoch;
    int64_t window;  // in [0, K)
    bool operator==(const Sample& o) const { return epoch == o.epoch && window == o.window; }
    bool operator<(const Sample& o) const {
      return epoch != o.epoch ? epoch < o.epoch : window < o.window;
    }
  };

  // This rank's rows for (step, micro_step): Note [Global batch rule].
  // Requires step >= 0, 0 <= micro_step < grad_accum (UsageError otherwise).
  Batch get(int64_t step, int64_t micro_step) const;
  // The samples behind get(step, micro_step), row by row.
  std::vector<Sample> samples(int64_t step, int64_t micro_step) const;
  // Global sample g -> (epoch, window).
  Sample sample(int64_t g) const;

  int64_t samples_per_epoch() const { return windows_per_epoch_; }  // K
  int64_t global_batch_size() const;                                // G
  // The targets (not kIgnoreIndex) of step `step`'s G rows over every rank and
  // micro-step: the same on every rank, without communication.
  int64_t step_targets(int64_t step) const;
  int64_t tokens_per_step() const { return global_batch_size() * rows_->input_width(); }
  // Epochs completed after `steps` steps (fractional), for logs.
  double epochs_after(int64_t steps) const;
  const SamplerOptions& options() const { return options_; }
  const RowSource& rows() const { return *rows_; }

 private:
  void check_options() const;

  std::shared_ptr<const RowSource> rows_;
  SamplerOptions options_;
  int64_t windows_per_epoch_ = 0;  // K
};

// Evaluation: consecutive windows from the start of a (validation) dataset, window
// m covering inputs t[m*T .. m*T+T), targets t[m*T+1 .. m*T+T], m = 0, 1, ... The
// windows cover every target position 1..N-1 exactly once: there are
// M = ceil((N-1)/T) of them and the last one may be partial, its missing targets
// set to kIgnoreIndex (and inputs to 0; causal attention keeps them from affecting
// the real positions). With max_windows > 0 only the first min(M, max_windows) count.
//
// Rank r takes windows r, r+W, r+2W, ... Every rank runs the same number of
// batches, num_batches(B) = ceil(ceil(M/W) / B), so collectives inside the model's
// forward stay matched; rows past a rank's last window are padding (all targets
// kIgnoreIndex). The mean loss over the whole set is
//   all_reduce_sum(sum of per-token losses, ignore_index = kIgnoreIndex) / total_targets().
// What evaluation iterates: the same number of batches on every rank, and
// the count of targets they hold over all ranks (the mean's denominator).
class EvalBatches {
 public:
  virtual ~EvalBatches() = default;
  virtual int64_t num_batches(int64_t batch_size) const = 0;
  virtual Batch batch(int64_t index, int64_t batch_size) const = 0;
  virtual int64_t total_targets() const = 0;
};

class EvalWindows final : public EvalBatches {
 public:
  // UsageError if N < 2, T < 1, or the rank/world size are out of range.
  EvalWindows(std::shared_ptr<const TokenDataset> dataset, int64_t seq_len, int64_t world_size = 1,
              int64_t rank = 0, int64_t max_windows = 0);

  int64_t total_windows() const { return total_windows_; }  // M, all ranks
  int64_t windows_for_rank(int64_t r) const;
  int64_t local_windows() const { return windows_for_rank(rank_); }
  // Target tokens that are not kIgnoreIndex, over all ranks / this rank.
  int64_t total_targets() const override;
  int64_t targets_for_rank(int64_t r) const;
  int64_t local_targets() const { return targets_for_rank(rank_); }

  // Batches per rank for batch size B: the same on every rank.
  int64_t num_batches(int64_t batch_size) const override;
  // Batch `index` in [0, num_batches(B)) of this rank: rows are its local windows
  // index*B .. index*B+B-1 (padding past the last).
  Batch batch(int64_t index, int64_t batch_size) const override;
  // Global window index of this rank's local window i.
  int64_t global_window(int64_t local_i) const { return rank_ + local_i * world_size_; }

 private:
  int64_t valid_targets(int64_t window) const;

  std::shared_ptr<const TokenDataset> dataset_;
  int64_t seq_len_, world_size_, rank_;
  int64_t total_windows_ = 0;
};

// Evaluation over the first max_rows rows (0: all) of a RowSource (Note
// [Rows]): rank r takes rows r, r+W, r+2W, ...; every rank runs the same
// number of batches, rows past its last are padding (inputs `pad`, targets
// kIgnoreIndex). The targets are counted at construction (RowSource::targets).
class EvalRows final : public EvalBatches {
 public:
  // UsageError when the source has no rows or the rank is out of range.
  EvalRows(std::shared_ptr<const RowSource> rows, int64_t world_size, int64_t rank, int64_t max_rows, int64_t pad);
  int64_t num_batches(int64_t batch_size) const override;
  Batch batch(int64_t index, int64_t batch_size) const override;
  int64_t total_targets() const override { return total_targets_; }

 private:
  std::shared_ptr<const RowSource> rows_;
  int64_t world_size_, rank_, count_, pad_;
  int64_t total_targets_ = 0;
};

}  // namespace fsdp::data

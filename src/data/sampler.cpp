// The global-batch rule, the window permutation and evaluation windows.
#include "fsdp/data/sampler.h"

#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/data/dataset.h"

#include <algorithm>

namespace fsdp::data {
namespace {


// Copies window rows: inputs t[start .. start+len), targets t[start+1 .. start+len].
void fill_row(const TokenDataset& data, int64_t start, int64_t len, std::vector<int32_t>& buf, int64_t* in,
              int64_t* tgt) {
  buf.resize(static_cast<size_t>(len + 1));
  data.read(start, len + 1, buf.data());
  for (int64_t t = 0; t < len; ++t) {
    in[t] = buf[t];
    tgt[t] = buf[t + 1];
  }
}

class TokenWindows final : public RowSource {
 public:
  TokenWindows(std::shared_ptr<const TokenDataset> data, int64_t seq_len) : data_(std::move(data)), t_(seq_len) {
    FSDP_CHECK(data_ != nullptr, "BatchSampler needs a dataset, got none");
    FSDP_CHECK(t_ >= 1, "SamplerOptions::seq_len must be >= 1, got ", t_);
    const int64_t n = data_->size();
    FSDP_CHECK(n >= t_ + 1, "dataset ", data_->describe(), " is shorter than one training window: ", n,
               " tokens < SamplerOptions::seq_len + 1 = ", t_ + 1, " (inputs t[i..i+T), targets t[i+1..i+T]) — use "
               "SamplerOptions::seq_len <= ", n - 1, " or more data");
    k_ = (n - 1) / t_;
  }
  int64_t rows() const override { return k_; }
  int64_t input_width() const override { return t_; }
  int64_t target_width() const override { return t_; }
  void fill(int64_t row, int64_t* inputs, int64_t* targets) const override {
    thread_local std::vector<int32_t> buf;
    fill_row(*data_, row * t_, t_, buf, inputs, targets);
  }
  int64_t targets(int64_t) const override { return t_; }
  bool uniform_targets() const override { return true; }
  std::string describe() const override { return data_->describe(); }

 private:
  std::shared_ptr<const TokenDataset> data_;
  int64_t t_;
  int64_t k_ = 0;
};

}  // namespace

std::shared_ptr<const RowSource> token_windows(std::shared_ptr<const TokenDataset> dataset, int64_t seq_len) {
  return std::make_shared<TokenWindows>(std::move(dataset), seq_len);
}

// --- WindowPermutation -------------------------------------------------------------

WindowPermutation::WindowPermutation(int64_t n, uint64_t seed, int64_t epoch) : n_(n) {
  FSDP_CHECK(n >= 1, "a permutation needs at least one element, got n = ", n);
  FSDP_CHECK(epoch >= 0, "epoch must be >= 0, got ", epoch);
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  bits = std::max(2, bits + (bits & 1));  // balanced halves of >= 1 bit
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t key = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x5851F42D4C957F2Dull));
  for (auto& k : round_keys_) {
    key = splitmix64(key);
    k = key;
  }
}

uint64_t WindowPermutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (const uint64_t k : round_keys_) {
    const uint64_t f = splitmix64(right ^ k) & half_mask_;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

int64_t WindowPermutation::operator()(int64_t i) const {
  FSDP_ASSERT(i >= 0 && i < n_, "index ", i, " outside [0, ", n_, ")");
  if (n_ == 1) return 0;
  // Cycle walking: encrypt is a bijection of [0, 2^bits) and 2^bits < 4n, so the
  // walk from i returns inside [0, n) after fewer than 4 steps on average.
  uint64_t y = encrypt(static_cast<uint64_t>(i));
  while (y >= static_cast<uint64_t>(n_)) y = encrypt(y);
  return static_cast<int64_t>(y);
}

// --- BatchSampler ------------------------------------------------------------------

void BatchSampler::check_options() const {
  const auto& o = options_;
  FSDP_CHECK(o.batch_size >= 1, "batch_size must be >= 1, got ", o.batch_size);
  FSDP_CHECK(o.grad_accum >= 1, "grad_accum must be >= 1, got ", o.grad_accum);
  FSDP_CHECK(o.world_size >= 1, "world_size must be >= 1, got ", o.world_size);
  FSDP_CHECK(o.rank >= 0 && o.rank < o.world_size, "rank ", o.rank, " is outside [0, world_size ", o.world_size, ")");
}

BatchSampler::BatchSampler(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options)
    : options_(options) {
  FSDP_CHECK(dataset != nullptr, "BatchSampler needs a dataset, got none");
  FSDP_CHECK(options_.seq_len >= 1, "seq_len must be >= 1, got ", options_.seq_len);
  check_options();
  rows_ = token_windows(std::move(dataset), options_.seq_len);
  windows_per_epoch_ = rows_->rows();
}

BatchSampler::BatchSampler(std::shared_ptr<const RowSource> rows, SamplerOptions options)
    : rows_(std::move(rows)), options_(options) {
  FSDP_CHECK(rows_ != nullptr, "BatchSampler needs rows, got none");
  check_options();
  windows_per_epoch_ = rows_->rows();
  FSDP_CHECK(windows_per_epoch_ >= 1, "data ", rows_->describe(), " holds no examples — give a non-empty file");
}

int64_t BatchSampler::global_batch_size() const {
  return options_.batch_size * options_.world_size * options_.grad_accum;
}

int64_t BatchSampler::step_targets(int64_t step) const {
  FSDP_CHECK(step >= 0, "step must be >= 0, got ", step);
  const int64_t g0 = step * global_batch_size();
  int64_t n = 0;
  for (int64_t j = 0; j < global_batch_size(); ++j) n += rows_->targets(sample(g0 + j).window);
  return n;
}

double BatchSampler::epochs_after(int64_t steps) const {
  return static_cast<double>(steps) * static_cast<double>(global_batch_size()) /
         static_cast<double>(windows_per_epoch_);
}

BatchSampler::Sample BatchSampler::sample(int64_t g) const {
  FSDP_CHECK(g >= 0, "global sample index must be >= 0, got ", g);
  const int64_t k = windows_per_epoch_;
  const int64_t epoch = g / k, i = g % k;
  if (!options_.shuffle) return {epoch, i};
  return {epoch, WindowPermutation(k, options_.seed, epoch)(i)};
}

std::vector<BatchSampler::Sample> BatchSampler::samples(int64_t step, int64_t micro_step) const {
  const auto& o = options_;
  FSDP_CHECK(step >= 0, "step must be >= 0, got ", step);
  FSDP_CHECK(micro_step >= 0 && micro_step < o.grad_accum, "micro_step ", micro_step, " is outside [0, grad_accum ",
             o.grad_accum, ")");
  // Note [Global batch rule]: j = (a*W + r)*B + b.
  const int64_t first = step * global_batch_size() + (micro_step * o.world_size + o.rank) * o.batch_size;
  std::vector<Sample> out;
  out.reserve(static_cast<size_t>(o.batch_size));
  for (int64_t b = 0; b < o.batch_size; ++b) out.push_back(sample(first + b));
  return out;
}

Batch BatchSampler::get(int64_t step, int64_t micro_step) const {
  const auto rows = samples(step, micro_step);
  const int64_t bsz = options_.batch_size, ti = rows_->input_width(), tt = rows_->target_width();
  Batch batch;
  batch.inputs = at::empty({bsz, ti}, at::kLong);
  batch.targets = at::empty({bsz, tt}, at::kLong);
  batch.step = step;
  batch.micro_step = micro_step;
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* tgt = batch.targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < bsz; ++b) rows_->fill(rows[b].window, in + b * ti, tgt + b * tt);
  return batch;
}

// --- EvalWindows -------------------------------------------------------------------

EvalWindows::EvalWindows(std::shared_ptr<const TokenDataset> dataset, int64_t seq_len, int64_t world_size,
                         int64_t rank, int64_t max_windows)
    : dataset_(std::move(dataset)), seq_len_(seq_len), world_size_(world_size), rank_(rank) {
  FSDP_CHECK(dataset_ != nullptr, "EvalWindows needs a dataset, got none");
  FSDP_CHECK(seq_len >= 1, "seq_len must be >= 1, got ", seq_len);
  FSDP_CHECK(world_size >= 1, "world_size must be >= 1, got ", world_size);
  FSDP_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " is outside [0, world_size ", world_size, ")");
  FSDP_CHECK(max_windows >= 0, "max_windows must be >= 0 (0: all), got ", max_windows);
  const int64_t n = dataset_->size();
  FSDP_CHECK(n >= 2, "evaluation dataset ", dataset_->describe(), " has ", n,
             " tokens; at least 2 are needed for one target — give a larger validation set");
  total_windows_ = (n - 1 + seq_len - 1) / seq_len;
  if (max_windows > 0) total_windows_ = std::min(total_windows_, max_windows);
}

int64_t EvalWindows::valid_targets(int64_t window) const {
  return std::min(seq_len_, dataset_->size() - 1 - window * seq_len_);
}

int64_t EvalWindows::windows_for_rank(int64_t r) const {
  FSDP_CHECK(r >= 0 && r < world_size_, "rank ", r, " is outside [0, world_size ", world_size_, ")");
  return r < total_windows_ ? (total_windows_ - r + world_size_ - 1) / world_size_ : 0;
}

int64_t EvalWindows::total_targets() const {
  return (total_windows_ - 1) * seq_len_ + valid_targets(total_windows_ - 1);
}

int64_t EvalWindows::targets_for_rank(int64_t r) const {
  const int64_t last = total_windows_ - 1;
  const int64_t short_by = last % world_size_ == r ? seq_len_ - valid_targets(last) : 0;
  return windows_for_rank(r) * seq_len_ - short_by;
}

int64_t EvalWindows::num_batches(int64_t batch_size) const {
  FSDP_CHECK(batch_size >= 1, "batch_size must be >= 1, got ", batch_size);
  const int64_t most = windows_for_rank(0);  // rank 0 has the most windows
  return (most + batch_size - 1) / batch_size;
}

Batch EvalWindows::batch(int64_t index, int64_t batch_size) const {
  const int64_t nb = num_batches(batch_size);
  FSDP_CHECK(index >= 0 && index < nb, "eval batch ", index, " is outside [0, num_batches ", nb, ")");
  const int64_t t = seq_len_;
  Batch batch;
  batch.inputs = at::zeros({batch_size, t}, at::kLong);
  batch.targets = at::full({batch_size, t}, kIgnoreIndex, at::kLong);
  batch.step = index;
  batch.micro_step = 0;
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* tgt = batch.targets.data_ptr<int64_t>();
  std::vector<int32_t> buf;
  const int64_t local = local_windows();
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t i = index * batch_size + b;
    if (i >= local) break;
    const int64_t m = global_window(i);
    fill_row(*dataset_, m * t, valid_targets(m), buf, in + b * t, tgt + b * t);
  }
  return batch;
}

// --- EvalRows ----------------------------------------------------------------------

EvalRows::EvalRows(std::shared_ptr<const RowSource> rows, int64_t world_size, int64_t rank, int64_t max_rows,
                   int64_t pad)
    : rows_(std::move(rows)), world_size_(world_size), rank_(rank), pad_(pad) {
  FSDP_CHECK(rows_ != nullptr && rows_->rows() >= 1, "evaluation needs at least one example");
  FSDP_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " is outside [0, world_size ",
             world_size, ")");
  FSDP_CHECK(max_rows >= 0, "max_rows must be >= 0 (0: all), got ", max_rows);
  count_ = max_rows > 0 ? std::min(max_rows, rows_->rows()) : rows_->rows();
  for (int64_t i = 0; i < count_; ++i) total_targets_ += rows_->targets(i);
}

int64_t EvalRows::num_batches(int64_t batch_size) const {
  FSDP_CHECK(batch_size >= 1, "batch_size must be >= 1, got ", batch_size);
  const int64_t most = (count_ + world_size_ - 1) / world_size_;  // rank 0's
  return (most + batch_size - 1) / batch_size;
}

Batch EvalRows::batch(int64_t index, int64_t batch_size) const {
  const int64_t nb = num_batches(batch_size);
  FSDP_CHECK(index >= 0 && index < nb, "eval batch ", index, " is outside [0, num_batches ", nb, ")");
  const int64_t ti = rows_->input_width(), tt = rows_->target_width();
  Batch batch;
  batch.inputs = at::full({batch_size, ti}, pad_, at::kLong);
  batch.targets = at::full({batch_size, tt}, kIgnoreIndex, at::kLong);
  batch.step = index;
  batch.micro_step = 0;
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* tgt = batch.targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t row = rank_ + (index * batch_size + b) * world_size_;
    if (row >= count_) break;
    rows_->fill(row, in + b * ti, tgt + b * tt);
  }
  return batch;
}

}  // namespace fsdp::data

// Sequence-to-sequence examples: (input, target) pairs from JSON lines, for
// encoder-decoder models (T5).
//
// Each non-blank line of the files is one object with two string fields
// (PairOptions::input_field, target_field; the data's path is a file, a
// directory or a pattern, as dataset.h's, of JSON lines, gzip-compressed or
// not). Both texts are tokenized at load as T5's tokenizer does with
// truncation: the ids of the text, cut to the width less one, then EOS. A row
// (sampler.h's RowSource) holds the input ids padded with pad_id to
// input_len, and the target ids followed by kIgnoreIndex up to target_len.
//
// Errors (UsageError, naming the file and line): a line that is not a JSON
// object, a missing or non-string field (listing the fields it has), an empty
// input or target, no examples at all, a tokenizer without EOS, more tokens
// than the memory budget.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/data/sampler.h"

namespace fsdp::data {

class Tokenizer;

struct PairOptions {
  std::string path;                   // file, directory or pattern of JSON lines
  std::string input_field = "input";
  std::string target_field = "target";
  int64_t input_len = 0;              // Ts >= 2: the encoder's width
  int64_t target_len = 0;             // Tt >= 2: the decoder's width
  int64_t pad_id = 0;                 // the inputs' padding (T5: 0)
  int64_t memory_budget = -1;         // bytes the tokens may take; -1: RLIMIT_DATA's half only
};

class PairDataset final : public RowSource {
 public:
  int64_t rows() const override { return static_cast<int64_t>(input_begin_.size()) - 1; }
  int64_t input_width() const override { return options_.input_len; }
  int64_t target_width() const override { return options_.target_len; }
  void fill(int64_t row, int64_t* inputs, int64_t* targets) const override;
  int64_t targets(int64_t row) const override;
  bool uniform_targets() const override { return false; }
  std::string describe() const override;
  // UsageError naming the file and example when an id is outside [0, vocab_size).
  void validate(int64_t vocab_size) const;
  // Examples whose input / target was cut to fit.
  int64_t truncated_inputs() const { return truncated_inputs_; }
  int64_t truncated_targets() const { return truncated_targets_; }

 private:
  friend std::shared_ptr<const PairDataset> load_pairs(const PairOptions& options, const Tokenizer& tokenizer);
  explicit PairDataset(PairOptions options) : options_(std::move(options)) {}

  PairOptions options_;
  std::vector<int32_t> inputs_, targets_;           // every example's ids, back to back
  std::vector<int64_t> input_begin_{0}, target_begin_{0};  // example i: [begin[i], begin[i+1])
  std::vector<std::pair<int64_t, std::string>> files_;     // (first example, path)
  int64_t truncated_inputs_ = 0, truncated_targets_ = 0;
};

// Reads and tokenizes the pairs (see above).
std::shared_ptr<const PairDataset> load_pairs(const PairOptions& options, const Tokenizer& tokenizer);

}  // namespace fsdp::data

// (input, target) pairs for encoder-decoders (data/pairs.h): rows as T5's
// tokenizer truncates them, their errors, and the counts the trainer's loss
// and evaluation divide by (sampler.h: step_targets, EvalRows).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "fsdp/common/error.h"
#include "fsdp/data/pairs.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"

using namespace fsdp::data;
using namespace fsdp::data::testing;

namespace {

constexpr int64_t kEos = ByteTokenizer::kEos;
constexpr int64_t kPad = 0;

PairOptions options(const std::string& path, int64_t input_len, int64_t target_len) {
  PairOptions o;
  o.path = path;
  o.input_len = input_len;
  o.target_len = target_len;
  o.pad_id = kPad;
  return o;
}

std::vector<int64_t> row_inputs(const RowSource& rows, int64_t row) {
  std::vector<int64_t> in(static_cast<size_t>(rows.input_width())), tgt(static_cast<size_t>(rows.target_width()));
  rows.fill(row, in.data(), tgt.data());
  return in;
}

std::vector<int64_t> row_targets(const RowSource& rows, int64_t row) {
  std::vector<int64_t> in(static_cast<size_t>(rows.input_width())), tgt(static_cast<size_t>(rows.target_width()));
  rows.fill(row, in.data(), tgt.data());
  return tgt;
}

// n pairs whose targets have 1 + (i % 4) bytes: rows of different target counts.
std::string varied_pairs(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += "{\"input\": \"in" + std::to_string(i) + "\", \"target\": \"" + std::string(1 + i % 4, 'a' + i % 26) +
            "\"}\n";
  }
  return text;
}

int64_t counted(const at::Tensor& targets) { return targets.ne(kIgnoreIndex).sum().item<int64_t>(); }

}  // namespace

TEST(Pairs, RowsAreCutToTheWidthLessOneThenEosAndPadded) {
  TempDir dir;
  write_file(dir.file("p.jsonl"),
             "{\"input\": \"abcdef\", \"target\": \"xy\", \"id\": 7}\n"
             "\n"
             "{\"input\": \"a\", \"target\": \"longer\"}\n");
  ByteTokenizer tok;
  const auto d = load_pairs(options(dir.file("p.jsonl"), 4, 5), tok);
  ASSERT_EQ(d->rows(), 2);
  EXPECT_EQ(row_inputs(*d, 0), (std::vector<int64_t>{'a', 'b', 'c', kEos}));
  EXPECT_EQ(row_targets(*d, 0), (std::vector<int64_t>{'x', 'y', kEos, kIgnoreIndex, kIgnoreIndex}));
  EXPECT_EQ(row_inputs(*d, 1), (std::vector<int64_t>{'a', kEos, kPad, kPad}));
  EXPECT_EQ(row_targets(*d, 1), (std::vector<int64_t>{'l', 'o', 'n', 'g', kEos}));
  EXPECT_EQ(d->targets(0), 3);
  EXPECT_EQ(d->targets(1), 5);
  EXPECT_FALSE(d->uniform_targets());
  EXPECT_EQ(d->truncated_inputs(), 1);
  EXPECT_EQ(d->truncated_targets(), 1);
  EXPECT_CONTAINS(d->describe(), "2 examples");
  EXPECT_NO_THROW(d->validate(ByteTokenizer::kVocabSize));
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { d->validate(100); }), "example 0's input holds token id 257");
}

TEST(Pairs, OtherFieldNames) {
  TempDir dir;
  write_file(dir.file("p.jsonl"), "{\"question\": \"q\", \"answer\": \"r\"}\n");
  ByteTokenizer tok;
  PairOptions o = options(dir.file("p.jsonl"), 3, 3);
  o.input_field = "question";
  o.target_field = "answer";
  const auto d = load_pairs(o, tok);
  EXPECT_EQ(row_inputs(*d, 0), (std::vector<int64_t>{'q', kEos, kPad}));
  EXPECT_EQ(row_targets(*d, 0), (std::vector<int64_t>{'r', kEos, kIgnoreIndex}));
}

TEST(Pairs, ErrorsNameTheFileTheLineAndTheFix) {
  TempDir dir;
  ByteTokenizer tok;
  const auto error_for = [&](const std::string& text) {
    write_file(dir.file("bad.jsonl"), text);
    return error_of<fsdp::UsageError>([&] { load_pairs(options(dir.file("bad.jsonl"), 8, 8), tok); });
  };
  std::string msg = error_for("{\"input\": \"a\", \"target\": \"b\"}\n[1, 2]\n");
  EXPECT_CONTAINS(msg, "bad.jsonl' line 2 is not a JSON object");
  msg = error_for("{\"input\": \"a\", \"text\": \"b\", \"id\": 3}\n");
  EXPECT_CONTAINS(msg, "bad.jsonl' line 1: no field \"target\" (fields: \"id\", \"input\", \"text\")");
  EXPECT_CONTAINS(msg, "set PairOptions::target_field");
  msg = error_for("{\"input\": 5, \"target\": \"b\"}\n");
  EXPECT_CONTAINS(msg, "field \"input\" is not a string");
  EXPECT_CONTAINS(msg, "set PairOptions::input_field");
  EXPECT_CONTAINS(error_for("{\"input\": \"a\", \"target\": \"\"}\n"), "line 1: the target is empty");
  EXPECT_CONTAINS(error_for("\n  \n"), "holds no pairs");

  write_file(dir.file("ok.jsonl"), "{\"input\": \"a\", \"target\": \"b\"}\n");
  PairOptions same = options(dir.file("ok.jsonl"), 8, 8);
  same.target_field = "input";
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_pairs(same, tok); }), "must name two different fields");
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_pairs(options(dir.file("ok.jsonl"), 1, 8), tok); }),
                  "at least 2 tokens");
  PairOptions small = options(dir.file("ok.jsonl"), 8, 8);
  small.memory_budget = 4;
  EXPECT_CONTAINS(error_of<fsdp::UsageError>([&] { load_pairs(small, tok); }), "bytes of memory");
}

// Every rank counts the same targets for a step, and they are the targets of
// the rows the ranks' batches hold over every micro-step (Note [Loss over rows]).
TEST(Pairs, StepTargetsCountTheGlobalBatchOnEveryRank) {
  TempDir dir;
  write_file(dir.file("p.jsonl"), varied_pairs(37));
  ByteTokenizer tok;
  const std::shared_ptr<const RowSource> rows = load_pairs(options(dir.file("p.jsonl"), 6, 6), tok);
  SamplerOptions o;
  o.batch_size = 3;
  o.world_size = 2;
  o.grad_accum = 2;
  o.seed = 5;
  for (int64_t step : {0, 1, 4}) {
    int64_t in_batches = 0;
    std::vector<int64_t> per_rank;
    for (int64_t r = 0; r < o.world_size; ++r) {
      SamplerOptions ro = o;
      ro.rank = r;
      const BatchSampler s(rows, ro);
      per_rank.push_back(s.step_targets(step));
      for (int64_t a = 0; a < o.grad_accum; ++a) in_batches += counted(s.get(step, a).targets);
    }
    EXPECT_EQ(per_rank[0], per_rank[1]) << "step " << step;
    EXPECT_EQ(per_rank[0], in_batches) << "step " << step;
    // The same global batch at one process (Note [Global batch rule]).
    SamplerOptions one = o;
    one.world_size = 1;
    one.batch_size = 6;
    EXPECT_EQ(BatchSampler(rows, one).step_targets(step), in_batches) << "step " << step;
  }
}

// Evaluation over pairs: every one of the first N pairs on exactly one rank,
// the same number of batches everywhere, padding rows ignored.
TEST(Pairs, EvalRowsCoverTheFirstRowsOnceAcrossRanks) {
  TempDir dir;
  write_file(dir.file("p.jsonl"), varied_pairs(11));
  ByteTokenizer tok;
  const std::shared_ptr<const RowSource> rows = load_pairs(options(dir.file("p.jsonl"), 6, 6), tok);
  for (int64_t max_rows : {0, 7}) {
    const int64_t n = max_rows > 0 ? max_rows : rows->rows();
    int64_t expected = 0;
    for (int64_t i = 0; i < n; ++i) expected += rows->targets(i);
    int64_t seen = 0;
    std::set<int64_t> batches;
    for (int64_t r = 0; r < 3; ++r) {
      const EvalRows e(rows, 3, r, max_rows, kPad);
      EXPECT_EQ(e.total_targets(), expected);
      batches.insert(e.num_batches(2));
      for (int64_t b = 0; b < e.num_batches(2); ++b) seen += counted(e.batch(b, 2).targets);
    }
    EXPECT_EQ(batches.size(), 1u) << "every rank runs the same number of batches";
    EXPECT_EQ(seen, expected) << "max_rows " << max_rows;
  }
}

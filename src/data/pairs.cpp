// (input, target) pairs from JSON lines (pairs.h).
#include "fsdp/data/pairs.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

#include "data_file.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"

namespace fsdp::data {
namespace {

// The string field `field` of line `line_no`; UsageError naming what the line has.
const std::string& text_field(const nlohmann::json& j, const std::string& field, const std::string& path,
                              int64_t line_no, const char* flag) {
  const auto it = j.find(field);
  if (it == j.end() || !it->is_string()) {
    std::string keys;
    for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + ("\"" + k + "\"");
    FSDP_CHECK(false, "data file '", path, "' line ", line_no, ": ", it == j.end() ? "no field \"" : "field \"",
               field, it == j.end() ? "\"" : "\" is not a string", " (fields: ", keys.empty() ? "none" : keys,
               ") — set ", flag, " to the field holding it");
  }
  return it->get_ref<const std::string&>();
}

// T5's tokenizer with truncation: the ids cut to width - 1, then EOS. Returns whether it cut.
bool append_truncated(const Tokenizer& tok, const std::string& text, int64_t width, std::vector<int32_t>& out) {
  std::vector<int32_t> ids = tok.encode(text);
  const bool cut = static_cast<int64_t>(ids.size()) > width - 1;
  if (cut) ids.resize(static_cast<size_t>(width - 1));
  out.insert(out.end(), ids.begin(), ids.end());
  out.push_back(tok.eos_id());
  return cut;
}

}  // namespace

void PairDataset::fill(int64_t row, int64_t* inputs, int64_t* targets) const {
  FSDP_ASSERT(row >= 0 && row < rows(), "example ", row, " outside [0, ", rows(), ")");
  const auto i = static_cast<size_t>(row);
  const int64_t ni = input_begin_[i + 1] - input_begin_[i], nt = target_begin_[i + 1] - target_begin_[i];
  for (int64_t t = 0; t < options_.input_len; ++t) {
    inputs[t] = t < ni ? inputs_[static_cast<size_t>(input_begin_[i] + t)] : options_.pad_id;
  }
  for (int64_t t = 0; t < options_.target_len; ++t) {
    targets[t] = t < nt ? targets_[static_cast<size_t>(target_begin_[i] + t)] : kIgnoreIndex;
  }
}

int64_t PairDataset::targets(int64_t row) const {
  FSDP_ASSERT(row >= 0 && row < rows(), "example ", row, " outside [0, ", rows(), ")");
  const auto i = static_cast<size_t>(row);
  return std::min(target_begin_[i + 1] - target_begin_[i], options_.target_len);
}

std::string PairDataset::describe() const {
  return fmt::format("{} (jsonl pairs \"{}\" -> \"{}\", {} examples, {} + {} tokens; cut to {} / {} tokens: {} "
                     "inputs, {} targets)", options_.path, options_.input_field, options_.target_field, rows(),
                     inputs_.size(), targets_.size(), options_.input_len, options_.target_len, truncated_inputs_,
                     truncated_targets_);
}

void PairDataset::validate(int64_t vocab_size) const {
  for (const auto* ids : {&inputs_, &targets_}) {
    const auto bad = std::find_if(ids->begin(), ids->end(), [&](int32_t t) { return t < 0 || t >= vocab_size; });
    if (bad == ids->end()) continue;
    const int64_t pos = bad - ids->begin();
    const auto& begin = ids == &inputs_ ? input_begin_ : target_begin_;
    const int64_t example = std::upper_bound(begin.begin(), begin.end(), pos) - begin.begin() - 1;
    std::string file = options_.path;
    for (const auto& [first, path] : files_) {
      if (first <= example) file = path;
    }
    FSDP_CHECK(false, "data ", file, ": example ", example, "'s ", ids == &inputs_ ? "input" : "target",
               " holds token id ", *bad, ", outside the model's vocabulary [0, ", vocab_size,
               ") — use the model's own tokenizer");
  }
}

std::shared_ptr<const PairDataset> load_pairs(const PairOptions& o, const Tokenizer& tok) {
  FSDP_CHECK(o.input_len >= 2 && o.target_len >= 2, "pairs need at least 2 tokens of input and of target (a token "
             "and EOS), got PairOptions::input_len ", o.input_len, " and PairOptions::target_len ", o.target_len);
  FSDP_CHECK(tok.eos_id() >= 0, "tokenizer ", tok.name(), " has no EOS token, which ends every input and target "
             "of a pair — use the model's tokenizer (T5's spiece.model has </s>)");
  FSDP_CHECK(!o.input_field.empty() && !o.target_field.empty() && o.input_field != o.target_field,
             "PairOptions::input_field '", o.input_field, "' and PairOptions::target_field '", o.target_field,
             "' must name two different fields");
  std::shared_ptr<PairDataset> d(new PairDataset(o));
  DatasetOptions files;
  files.path = o.path;
  files.format = DataFormat::kJsonl;
  for (const std::string& path : data_files(files)) {
    d->files_.emplace_back(d->rows(), path);
    DataFileReader in(path);
    std::string line;
    int64_t line_no = 0;
    while (in.next_line(line)) {
      ++line_no;
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::string why;
      const std::optional<nlohmann::json> j = parse_json_input(line, why);
      FSDP_CHECK(j.has_value() && j->is_object(), "data file '", path, "' line ", line_no, " is not a JSON object",
                 j ? std::string() : " (" + why + ")", " — each line must be one object such as {\"", o.input_field,
                 "\": \"...\", \"", o.target_field, "\": \"...\"}");
      const std::string& input = text_field(*j, o.input_field, path, line_no, "PairOptions::input_field");
      const std::string& target = text_field(*j, o.target_field, path, line_no, "PairOptions::target_field");
      FSDP_CHECK(!input.empty() && !target.empty(), "data file '", path, "' line ", line_no, ": the ",
                 input.empty() ? "input" : "target", " is empty — every pair needs both texts");
      d->truncated_inputs_ += append_truncated(tok, input, o.input_len, d->inputs_) ? 1 : 0;
      d->truncated_targets_ += append_truncated(tok, target, o.target_len, d->targets_) ? 1 : 0;
      d->input_begin_.push_back(static_cast<int64_t>(d->inputs_.size()));
      d->target_begin_.push_back(static_cast<int64_t>(d->targets_.size()));
      const int64_t held = static_cast<int64_t>((d->inputs_.size() + d->targets_.size()) * sizeof(int32_t));
      FSDP_CHECK(o.memory_budget < 0 || held <= o.memory_budget, "data file '", path, "': its pairs' tokens need "
                 "more than ", held, " bytes of memory (the limit here is ", o.memory_budget, ") — split the data");
    }
  }
  FSDP_CHECK(d->rows() > 0, "data ", o.path, " holds no pairs — give JSON lines such as {\"", o.input_field,
             "\": \"...\", \"", o.target_field, "\": \"...\"}");
  return d;
}

}  // namespace fsdp::data

// Fuzz target: data files (what --data and --val-data read, data::load_dataset)
// with the byte tokenizer. Input: one control byte, then the file's bytes.
// Control bits 0-1: the format (auto, text, jsonl, bin); 2-3 the file's name
// (data.txt, data.jsonl, data.bin, data.json.gz: what kAuto goes by); 4: uint32
// tokens; 5: BOS before documents; 6: a directory, its files split at NUL bytes
// (data-0.<ext>, data-1.<ext>, ...). Text may be gzip-compressed (recognised by
// content). Promises checked on a dataset it accepts: it is not empty, every
// token reads back in order, and describe/locate work on every file. A JSON-lines
// name is also read as (input, target) pairs (data::load_pairs, what an
// encoder-decoder's --data reads): rows of the widths asked, each target
// counted as fill() writes it, ending in EOS.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/data/dataset.h"
#include "fsdp/data/pairs.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fuzz_util.h"

using fsdp::fuzz::fuzz_require;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t control = data[0];
  const std::string content(reinterpret_cast<const char*>(data + 1), size - 1);
  static const fsdp::data::DataFormat kFormats[] = {fsdp::data::DataFormat::kAuto, fsdp::data::DataFormat::kText,
                                                   fsdp::data::DataFormat::kJsonl, fsdp::data::DataFormat::kBinary};
  static const char* const kExtensions[] = {".txt", ".jsonl", ".bin", ".json.gz"};
  fsdp::data::DatasetOptions o;
  o.format = kFormats[control & 3];
  const std::string ext = kExtensions[(control >> 2) & 3];
  o.token_dtype = (control & 16) != 0 ? fsdp::data::TokenDtype::kUint32 : fsdp::data::TokenDtype::kUint16;
  o.add_bos = (control & 32) != 0;

  const std::string dir = fsdp::fuzz::scratch_dir() + "/data";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  if ((control & 64) != 0) {
    size_t begin = 0;
    for (int i = 0; begin <= content.size() && i < 8; ++i) {
      size_t end = content.find('\0', begin);
      if (end == std::string::npos || i == 7) end = content.size();
      fsdp::fuzz::write_scratch("data/data-" + std::to_string(i) + ext, content.substr(begin, end - begin));
      begin = end + 1;
    }
    o.path = dir;
  } else {
    o.path = fsdp::fuzz::write_scratch("data/data" + ext, content);
  }

  const fsdp::data::ByteTokenizer tokenizer;
  fsdp::fuzz::expect_documented_errors([&] {
    const auto ds = fsdp::data::load_dataset(o, &tokenizer);
    const int64_t n = ds->size();
    fuzz_require(n > 0, "a loaded dataset has tokens");
    std::vector<int32_t> all(static_cast<size_t>(n));
    ds->read(0, n, all.data());
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 16)) {
      fuzz_require(ds->at(i) == all[static_cast<size_t>(i)], "at() agrees with read()");
      fuzz_require(!ds->locate(i).empty(), "every token can be located");
    }
    fuzz_require(!ds->describe().empty(), "the dataset describes itself");
    ds->validate(o.token_dtype == fsdp::data::TokenDtype::kUint16 ? 65536 : tokenizer.vocab_size());
  });
  if (ext == ".jsonl" || ext == ".json.gz") {
    fsdp::fuzz::expect_documented_errors([&] {
      fsdp::data::PairOptions po;
      po.path = o.path;
      po.input_len = 2 + ((control >> 4) & 3);
      po.target_len = 2 + ((control >> 5) & 3);
      const auto pairs = fsdp::data::load_pairs(po, tokenizer);
      fuzz_require(pairs->rows() > 0, "loaded pairs are not empty");
      std::vector<int64_t> in(static_cast<size_t>(po.input_len)), tgt(static_cast<size_t>(po.target_len));
      for (int64_t r = 0; r < std::min<int64_t>(pairs->rows(), 64); ++r) {
        pairs->fill(r, in.data(), tgt.data());
        const int64_t n = std::count_if(tgt.begin(), tgt.end(), [](int64_t t) { return t != fsdp::data::kIgnoreIndex; });
        fuzz_require(n == pairs->targets(r) && n >= 1 && tgt[static_cast<size_t>(n - 1)] == tokenizer.eos_id(),
                     "a pair's targets are counted as filled and end in EOS");
      }
      fuzz_require(!pairs->describe().empty(), "the pairs describe themselves");
      pairs->validate(tokenizer.vocab_size());
    });
  }
  return 0;
}

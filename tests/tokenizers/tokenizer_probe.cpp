// tokenizer_probe: fsdp-cpp's side of the comparison with the `tokenizers` library
// (test_hf_tokenizers.py drives it and does the comparing).
//
//   tokenizer_probe encode TOKENIZER IN OUT
//       TOKENIZER as --tokenizer takes it (data::make_tokenizer). IN: JSON
//       {"texts": [str...], "decode": [[id...]...]}. OUT: JSON {"name", "vocab_size",
//       "bos", "eos", "adds_bos", "ids": [encode(text)...], "decoded":
//       [decode(encode(text))...], "decoded_ids": [decode(ids)... for IN's "decode"]}.
//   tokenizer_probe dataset TOKENIZER DATA OUT [FORMAT [FIELD]]
//       data::load_dataset(DATA) as fsdp-train loads --data (BOS before each document
//       when the tokenizer adds one). OUT: JSON {"tokens": [...], "describe", "files"}.
//
// Exit status (fsdp::run_main): 0; 2 with "tokenizer_probe: error: <message>" when the
// tokenizer or the data is refused (a UsageError); 1 on failures.
#include "fsdp/common/error.h"
#include "fsdp/common/main.h"
#include "fsdp/data/dataset.h"
#include "fsdp/data/tokenizer.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_CHECK(in.good(), "cannot open ", path);
  return json::parse(in);
}

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << j.dump();
  if (!out) FSDP_FAIL("cannot write ", path);
}

int encode(const std::string& spec, const std::string& in_path, const std::string& out_path) {
  const auto tok = fsdp::data::make_tokenizer(spec);
  const json in = read_json(in_path);
  json ids = json::array(), decoded = json::array(), decoded_ids = json::array();
  for (const auto& t : in.at("texts")) {
    const std::vector<int32_t> v = tok->encode(t.get<std::string>());
    ids.push_back(v);
    decoded.push_back(tok->decode(v));
  }
  if (in.contains("decode")) {
    for (const auto& d : in["decode"]) decoded_ids.push_back(tok->decode(d.get<std::vector<int32_t>>()));
  }
  write_json(out_path, {{"name", tok->name()},
                        {"vocab_size", tok->vocab_size()},
                        {"bos", tok->bos_id()},
                        {"eos", tok->eos_id()},
                        {"adds_bos", tok->adds_bos()},
                        {"ids", ids},
                        {"decoded", decoded},
                        {"decoded_ids", decoded_ids}});
  return 0;
}

int dataset(const std::vector<std::string>& args) {
  FSDP_CHECK(args.size() >= 5, "usage: tokenizer_probe dataset TOKENIZER DATA OUT [FORMAT [FIELD]]");
  const auto tok = fsdp::data::make_tokenizer(args[2]);
  fsdp::data::DatasetOptions o;
  o.path = args[3];
  if (args.size() > 5) o.format = fsdp::data::parse_data_format(args[5]);
  if (args.size() > 6) o.text_field = args[6];
  o.add_bos = tok->adds_bos();
  const auto d = fsdp::data::load_dataset(o, tok.get());
  std::vector<int32_t> tokens(static_cast<size_t>(d->size()));
  d->read(0, d->size(), tokens.data());
  write_json(args[4], {{"tokens", tokens}, {"describe", d->describe()}, {"files", fsdp::data::data_files(o)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fsdp::run_main("tokenizer_probe", [&] {
    const std::vector<std::string> args(argv, argv + argc);
    FSDP_CHECK(args.size() >= 2, "usage: tokenizer_probe encode|dataset ...");
    if (args[1] == "encode") {
      FSDP_CHECK(args.size() == 5, "usage: tokenizer_probe encode TOKENIZER IN OUT");
      return encode(args[2], args[3], args[4]);
    }
    if (args[1] == "dataset") return dataset(args);
    FSDP_CHECK(false, "unknown command '", args[1], "': encode or dataset");
    return 2;
  });
}

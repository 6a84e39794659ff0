// Fuzz target: tokenizer files (what --tokenizer reads), recognised by content
// as make_tokenizer does: a Hugging Face tokenizer.json (first non-blank byte
// '{'), optionally followed by a NUL byte and the tokenizer_config.json beside
// it; or a tiktoken rank file (Llama 3's tokenizer.model). Other bytes would go
// to libsentencepiece's protobuf reader, which is not ours and is not fuzzed.
// Promises checked on a tokenizer it accepts: on fixed sample texts, encode
// gives ids in [0, vocab_size) that decode without error, and the byte-level
// tiktoken tokenizer decodes every text back to its bytes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/data/tokenizer.h"
#include "fuzz_util.h"

using fsdp::fuzz::fuzz_require;

namespace {

const char* const kSamples[] = {
    "Hello world! It's 2024: 3.14159 and  spaces\n\n\ttabs",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 e\xcc\x81",
    "<|begin_of_text|><s></s><eos><unk>[INST] x [/INST]",
    "abcabcab ba  cab\r\n",
    "\xff\xfe invalid \xc3( utf-8",
    "",
};

void exercise(const fsdp::data::Tokenizer& tok, bool byte_level) {
  const int32_t v = tok.vocab_size();
  fuzz_require(v > 0, "a vocabulary is not empty");
  fuzz_require(tok.bos_id() < v && tok.eos_id() < v, "BOS and EOS are in the vocabulary");
  for (const char* s : kSamples) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(s);
    } catch (const fsdp::UsageError&) {
      continue;  // e.g. HfTokenizer: invalid UTF-8, an unknown character without unk_token
    }
    for (int32_t id : ids) fuzz_require(id >= 0 && id < v, "encode returns ids in [0, vocab_size)");
    const std::string back = tok.decode(ids);
    if (byte_level) fuzz_require(back == s, "a byte-level tokenizer decodes its encoding back to the text");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t first = 0;
  while (first < size && (data[first] == ' ' || data[first] == '\t' || data[first] == '\r' || data[first] == '\n')) {
    ++first;
  }
  if (first < size && data[first] == '{') {
    const size_t nul = input.find('\0');
    const std::string path = fsdp::fuzz::write_scratch("tokenizer.json", input.substr(0, nul));
    const std::string config = nul == std::string::npos ? std::string() : input.substr(nul + 1);
    const std::string config_path = fsdp::fuzz::scratch_dir() + "/tokenizer_config.json";
    if (nul == std::string::npos) {
      std::remove(config_path.c_str());
    } else {
      fsdp::fuzz::write_scratch("tokenizer_config.json", config);
    }
    fsdp::fuzz::expect_documented_errors([&] {
      const fsdp::data::HfTokenizer tok(path);
      exercise(tok, false);
    });
    return 0;
  }
  const std::string path = fsdp::fuzz::write_scratch("tokenizer.model", input);
  fsdp::fuzz::expect_documented_errors([&] {
    if (!fsdp::data::looks_like_tiktoken_file(path)) return;
    const fsdp::data::TiktokenTokenizer tok(path);
    exercise(tok, true);
  });
  return 0;
}

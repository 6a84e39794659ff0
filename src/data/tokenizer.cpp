// The byte tokenizer, the factory and format detection.
#include "fsdp/data/tokenizer.h"

#include "fsdp/common/error.h"
#include "fsdp/common/files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace fsdp::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (id == kBos) {
      out += "<|begin_of_text|>";
    } else if (id == kEos) {
      out += "<|end_of_text|>";
    } else {
      FSDP_CHECK(false, "byte tokenizer: cannot decode id ", id, " at position ", i,
                 ": ids must be in [0, ", kVocabSize, ") — were these ids made by another tokenizer?");
    }
  }
  return out;
}

bool looks_like_tiktoken_file(const std::string& path) {
  constexpr size_t kHead = 1024;
  const std::string text = read_input_head(path, "tokenizer file", kHead, "check the path given as the tokenizer");
  const std::string_view head(text);
  // "<base64> <digits>" then '\n', "\r\n" or the end of the file.
  size_t i = 0;
  auto is_b64 = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/' || c == '=';
  };
  while (i < head.size() && is_b64(head[i])) ++i;
  if (i == 0 || i >= head.size() || head[i] != ' ') return false;
  const size_t digits = ++i;
  while (i < head.size() && head[i] >= '0' && head[i] <= '9') ++i;
  if (i == digits) return false;
  if (i == head.size()) return head.size() < kHead;  // whole file read
  return head[i] == '\n' || (head[i] == '\r' && i + 1 < head.size() && head[i + 1] == '\n');
}

namespace {

// A tokenizer.json: the first non-blank byte is '{' (none of the other formats can
// start so: a SentencePiece model is a protobuf whose first byte is a field tag, a
// tiktoken file starts with base64).
bool looks_like_json_object(const std::string& path) {
  const std::string head = read_input_head(path, "tokenizer file", 4096, "check the path given as the tokenizer");
  for (const char c : head) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return c == '{';
  }
  return false;
}

}  // namespace

std::string tokenizer_file(const std::string& spec) {
  FSDP_CHECK(!spec.empty(), "empty tokenizer spec — use \"byte\", or the path of a tokenizer.json, a SentencePiece "
                            "model or a tiktoken BPE file (Llama 3's tokenizer.model), or a model directory");
  if (spec == "byte") return spec;
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(spec, ec);
  FSDP_CHECK(fs::exists(status), "tokenizer '", spec, "' is neither \"byte\" nor an existing file or directory — ",
             "give \"byte\", or the path of a tokenizer.json, a SentencePiece model or a tiktoken BPE file");
  std::string file = spec;
  if (fs::is_directory(status)) {
    // A model directory: the Hugging Face tokenizer.json first (transformers' fast
    // tokenizer, the reference), else the tokenizer.model beside it.
    const fs::path dir(spec);
    if (fs::exists(dir / "tokenizer.json", ec)) {
      file = (dir / "tokenizer.json").string();
    } else if (fs::exists(dir / "tokenizer.model", ec)) {
      file = (dir / "tokenizer.model").string();
    } else {
      FSDP_CHECK(false, "tokenizer directory '", spec, "' has neither tokenizer.json nor tokenizer.model — give the ",
                 "tokenizer file itself, or the model directory that holds one");
    }
  }
  // A device or a FIFO would be read without end or block (Note in fsdp/common/files.h).
  require_regular_file(file, "tokenizer file", "give \"byte\", a tokenizer.json, a SentencePiece model, a tiktoken "
                       "BPE file or a model directory holding one");
  FSDP_CHECK(fs::file_size(file, ec) > 0 || ec, "tokenizer file '", file, "' is empty — give a tokenizer.json, a ",
             "SentencePiece model or a tiktoken BPE file");
  return file;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  const std::string file = tokenizer_file(spec);
  if (file == "byte") return std::make_unique<ByteTokenizer>();
  if (looks_like_json_object(file)) return std::make_unique<HfTokenizer>(file);
  if (looks_like_tiktoken_file(file)) return std::make_unique<TiktokenTokenizer>(file);
  return std::make_unique<SentencePieceTokenizer>(file);
}

}  // namespace fsdp::data

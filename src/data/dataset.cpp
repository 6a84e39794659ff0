// Token datasets: text and JSON lines tokenized at load, binary shards mmapped.
#include "fsdp/data/dataset.h"

#include "data_file.h"
#include "fsdp/common/encoding.h"
#include "fsdp/common/error.h"
#include "fsdp/common/json_input.h"
#include "fsdp/common/files.h"
#include "fsdp/common/output_file.h"
#include "fsdp/data/tokenizer.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

namespace fsdp::data {
namespace fs = std::filesystem;

namespace {

constexpr bool kHostLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

std::string errno_text() { return std::strerror(errno); }

size_t dtype_bytes(TokenDtype d) { return d == TokenDtype::kUint16 ? 2 : 4; }

// --- in memory --------------------------------------------------------------------

class MemoryDataset final : public TokenDataset {
 public:
  // files: (index of the file's first token, the file) in stream order; empty for
  // tokens that come from no file (make_token_dataset).
  MemoryDataset(std::vector<int32_t> tokens, std::string name, std::string kind, int64_t documents,
                std::vector<std::pair<int64_t, std::string>> files = {})
      : tokens_(std::move(tokens)),
        name_(std::move(name)),
        kind_(std::move(kind)),
        documents_(documents),
        files_(std::move(files)) {}

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void read(int64_t begin, int64_t count, int32_t* out) const override {
    FSDP_ASSERT(begin >= 0 && count >= 0 && begin + count <= size(), "read [", begin, ", ", begin + count,
                ") of ", size(), " tokens");
    std::copy_n(tokens_.data() + begin, count, out);
  }
  std::string locate(int64_t pos) const override {
    if (files_.size() <= 1) return detail::cat("file ", name_, ", token ", pos, " after tokenization");
    const auto it = std::upper_bound(files_.begin(), files_.end(), pos,
                                     [](int64_t p, const auto& f) { return p < f.first; });
    const auto& f = *std::prev(it);
    return detail::cat("file ", f.second, ", token ", pos - f.first, " of the file after tokenization");
  }
  std::string describe() const override {
    std::string s = detail::cat(kind_, " ", name_, ": ", size(), " tokens");
    if (documents_ >= 0) s += detail::cat(" in ", documents_, " documents");
    if (files_.size() > 1) s += detail::cat(" from ", files_.size(), " files");
    return s;
  }

 private:
  std::vector<int32_t> tokens_;
  std::string name_, kind_;
  int64_t documents_;  // -1: not made of documents
  std::vector<std::pair<int64_t, std::string>> files_;
};

// --- memory-mapped binary shards ----------------------------------------------------

// Note [Shrinking token files]
// Binary shards are memory-mapped. When another process truncates a shard during
// the run, touching a mapped page past the new end raises SIGBUS, which would kill
// the process without a word (exit 135). So every copy out of a mapping runs under
// a guard: a thread-local jump target that a SIGBUS handler returns to
// (siglongjmp), after which the read throws a Failure naming the file and its old
// and new sizes. A SIGBUS outside a guarded copy gets the action it had before
// (by default the process dies, as it always did). The mapping is kept rather than
// reading with pread: it holds no descriptor per shard (directories of thousands
// of shards stay under the open-file limit), and a shard renamed or deleted during
// the run keeps being read as it was. A cut inside the last mapped page raises no
// signal: the kernel reads that page's lost bytes as zeros (at most one page of a
// shard, token id 0).

thread_local sigjmp_buf* t_bus_guard = nullptr;  // set only around a copy out of a mapping
struct sigaction g_previous_bus_action {};

extern "C" void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* target = t_bus_guard) {
    t_bus_guard = nullptr;
    siglongjmp(*target, 1);
  }
  const struct sigaction& prev = g_previous_bus_action;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: the faulting access runs again and the process dies of SIGBUS.
  ::signal(SIGBUS, SIG_DFL);
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    ::sigaction(SIGBUS, &sa, &g_previous_bus_action);
  });
}

class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    const int fd = open_input_file(path, "token file", "give .bin files of token ids (Note [Input files])");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const std::string why = errno_text();
      ::close(fd);
      FSDP_FAIL("cannot stat token file '", path, "': ", why);
    }
    bytes_ = static_cast<size_t>(st.st_size);
    if (bytes_ == 0) {
      ::close(fd);
      FSDP_CHECK(false, "token file '", path, "' is empty — remove it or regenerate it");
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    const std::string why = errno_text();
    ::close(fd);  // the mapping keeps the file alive
    if (p == MAP_FAILED) FSDP_FAIL("cannot mmap token file '", path, "' (", bytes_, " bytes): ", why);
    data_ = static_cast<const unsigned char*>(p);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), bytes_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  size_t bytes() const { return bytes_; }
  const unsigned char* data() const { return data_; }

 private:
  std::string path_;
  size_t bytes_ = 0;
  const unsigned char* data_ = nullptr;
};

class MappedDataset final : public TokenDataset {
 public:
  MappedDataset(const std::vector<std::string>& paths, TokenDtype dtype, std::string source)
      : dtype_(dtype), width_(dtype_bytes(dtype)), source_(std::move(source)) {
    install_sigbus_guard();
    int64_t total = 0;
    for (const auto& p : paths) {
      auto file = std::make_unique<MappedFile>(p);
      FSDP_CHECK(file->bytes() % width_ == 0, "token file '", p, "' has ", file->bytes(),
                 " bytes, not a multiple of ", width_, " (DatasetOptions::token_dtype ", to_string(dtype_),
                 ") — is DatasetOptions::token_dtype right? (u16 for vocabularies up to 65536, else u32)");
      starts_.push_back(total);
      total += static_cast<int64_t>(file->bytes() / width_);
      files_.push_back(std::move(file));
    }
    starts_.push_back(total);
  }

  int64_t size() const override { return starts_.back(); }

  void read(int64_t begin, int64_t count, int32_t* out) const override {
    FSDP_ASSERT(begin >= 0 && count >= 0 && begin + count <= size(), "read [", begin, ", ", begin + count,
                ") of ", size(), " tokens");
    const int64_t lost = guarded_copy(begin, count, out);
    if (lost < 0) return;
    // See Note [Shrinking token files].
    const MappedFile& file = *files_[static_cast<size_t>(lost)];
    struct stat st {};
    const std::string now = ::stat(file.path().c_str(), &st) == 0 ? detail::cat(st.st_size, " bytes")
                                                                    : std::string("gone: ") + errno_text();
    FSDP_FAIL("token file '", file.path(), "' shrank while it was being read: ", file.bytes(),
              " bytes when the run started, now ", now, " — a data file must not change during a run; restore it "
              "(or write new shards under new names) and resume from the last checkpoint");
  }

  std::string locate(int64_t pos) const override {
    const size_t f = file_of(pos);
    return detail::cat("file ", files_[f]->path(), ", token ", pos - starts_[f], " of the file (byte offset ",
                       (pos - starts_[f]) * static_cast<int64_t>(width_), ")");
  }

  std::string describe() const override {
    return detail::cat("binary ", to_string(dtype_), " ", source_, ": ", size(), " tokens in ", files_.size(),
                       files_.size() == 1 ? " file" : " files");
  }

 private:
  // Copies tokens [begin, begin + count) under the SIGBUS guard. Returns -1, or the
  // index of the file whose mapping faulted (it was truncated under us).
  int64_t guarded_copy(int64_t begin, int64_t count, int32_t* out) const {
    sigjmp_buf target;
    volatile int64_t current = -1;  // read after siglongjmp: must live in memory
    if (sigsetjmp(target, /*savemask=*/1) != 0) return current;  // SIGBUS stays blocked otherwise
    t_bus_guard = &target;
    size_t f = file_of(begin);
    while (count > 0) {
      current = static_cast<int64_t>(f);
      const int64_t local = begin - starts_[f];
      const int64_t n = std::min(count, starts_[f + 1] - begin);
      decode(files_[f]->data() + local * static_cast<int64_t>(width_), n, out);
      out += n;
      begin += n;
      count -= n;
      ++f;
    }
    t_bus_guard = nullptr;
    return -1;
  }

  // Index of the file holding global token `pos` (skips nothing: files are non-empty).
  size_t file_of(int64_t pos) const {
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), pos);
    return static_cast<size_t>(it - starts_.begin()) - 1;
  }

  void decode(const unsigned char* p, int64_t n, int32_t* out) const {
    if (dtype_ == TokenDtype::kUint16) {
      for (int64_t i = 0; i < n; ++i, p += 2) out[i] = static_cast<int32_t>(p[0] | (p[1] << 8));
    } else if (kHostLittleEndian) {
      // uint32 ids >= 2^31 become negative and fail validate(), as they should.
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
    } else {
      for (int64_t i = 0; i < n; ++i, p += 4)
        out[i] = static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                                      (uint32_t{p[3]} << 24));
    }
  }

  TokenDtype dtype_;
  size_t width_;
  std::string source_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<int64_t> starts_;  // starts_[f]: global index of file f's first token; back(): N
};

// --- which files -------------------------------------------------------------------

struct DataFile {
  std::string path;
  DataFormat format;  // resolved: never kAuto
};

// The last path component holds a wildcard: the path is a pattern over one directory.
bool is_pattern(const std::string& path) {
  return fs::path(path).filename().string().find_first_of("*?[") != std::string::npos;
}

// The format a file name stands for ("x.json.gz" -> kJsonl); kAuto when it names none.
// `.gz` is dropped first: compressed and plain files are read alike (Note [gzip data
// files] in data_file.h), except binary token files, which are memory-mapped.
DataFormat format_of_name(const std::string& name) {
  const std::string base = ends_with(name, ".gz") ? name.substr(0, name.size() - 3) : name;
  if (ends_with(base, ".bin")) return DataFormat::kBinary;
  if (ends_with(base, ".jsonl") || ends_with(base, ".json") || ends_with(base, ".ndjson")) return DataFormat::kJsonl;
  if (ends_with(base, ".txt")) return DataFormat::kText;
  return DataFormat::kAuto;
}

// The regular files of `dir` whose names `keep` accepts, in byte order of their names;
// hidden files (".name") are never data, subdirectories are skipped. An entry
// `keep` accepts that is neither (a dangling symbolic link, a FIFO, a device) is
// refused by name: skipping it would train silently on less than the user gave.
template <class Keep>
std::vector<std::string> list_dir(const std::string& dir, Keep keep) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code ec2;
    if (name.empty() || name[0] == '.' || !keep(name) || it->is_directory(ec2)) continue;
    if (!it->is_regular_file(ec2)) {
      const std::string path = it->path().string();
      std::error_code ec3;
      const fs::path target = fs::is_symlink(it->symlink_status(ec3)) ? fs::read_symlink(path, ec3) : fs::path();
      FSDP_CHECK(false, "data directory '", dir, "' holds '", name, "', which is ", path_kind(path),
                 target.empty() ? std::string() : " (-> " + target.string() + ")",
                 ", not a regular file — restore it or remove it from the directory (its files are all read)");
    }
    names.push_back(name);
  }
  FSDP_CHECK(!ec, "cannot list data directory '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back((fs::path(dir) / n).string());
  return paths;
}

std::vector<DataFile> resolve_files(const DatasetOptions& o) {
  FSDP_CHECK(!o.path.empty(), "no data path given — set the dataset path (a text, JSON-lines or .bin file, a "
                              "directory of them, or a pattern such as c4/en/c4-train.*.json.gz)");
  std::error_code ec;
  std::vector<DataFile> files;
  // A file's format: the one asked for, else its name's, else plain text.
  auto single = [&](const std::string& p) {
    // A device (/dev/zero) or a FIFO would be read without end or block.
    require_regular_file(p, "data file", "give a text, JSON-lines or binary token file, a directory of them, or a "
                         "pattern such as c4/en/c4-train.*.json.gz");
    DataFormat f = o.format != DataFormat::kAuto ? o.format : format_of_name(fs::path(p).filename().string());
    if (f == DataFormat::kAuto) f = DataFormat::kText;
    FSDP_CHECK(!(f == DataFormat::kBinary && ends_with(p, ".gz")), "data file '", p, "' is a compressed binary ",
               "token file, which cannot be memory-mapped — decompress it (gunzip) first");
    files.push_back({p, f});
  };
  if (fs::is_directory(o.path, ec)) {
    if (o.format == DataFormat::kText || o.format == DataFormat::kJsonl) {
      for (const auto& p : list_dir(o.path, [](const std::string&) { return true; })) files.push_back({p, o.format});
      FSDP_CHECK(!files.empty(), "data directory '", o.path, "' has no files");
      return files;
    }
    // Binary shards when there are any (other files ignored); otherwise the text and
    // JSON-lines files, each read in the format of its name.
    for (const auto& p : list_dir(o.path, [](const std::string& n) { return ends_with(n, ".bin"); }))
      files.push_back({p, DataFormat::kBinary});
    if (!files.empty() || o.format == DataFormat::kBinary) {
      FSDP_CHECK(!files.empty(), "data directory '", o.path, "' has no *.bin files — give a directory of ",
                 "pre-tokenized .bin shards, or a single data file");
      return files;
    }
    for (const auto& p : list_dir(o.path, [](const std::string& n) {
           const DataFormat f = format_of_name(n);
           return f == DataFormat::kText || f == DataFormat::kJsonl;
         })) {
      files.push_back({p, format_of_name(fs::path(p).filename().string())});
    }
    FSDP_CHECK(!files.empty(), "data directory '", o.path, "' has no data files: no *.bin files and no ",
               "*.jsonl, *.json, *.ndjson or *.txt files (each optionally .gz) — give a directory of data files, or ",
               "name the files with DatasetOptions::format text or jsonl");
    return files;
  }
  if (fs::exists(o.path, ec)) {
    single(o.path);
    return files;
  }
  FSDP_CHECK(is_pattern(o.path), "data path '", o.path, "' does not exist — check the path",
             " (run scripts/prepare_data.sh to build the default corpus)");
  // A pattern: fnmatch over the names in its directory (no wildcards in the directory).
  const fs::path pattern(o.path);
  const std::string dir = pattern.has_parent_path() ? pattern.parent_path().string() : std::string(".");
  const std::string glob = pattern.filename().string();
  FSDP_CHECK(fs::is_directory(dir, ec), "data pattern '", o.path, "': directory '", dir, "' does not exist — ",
             "wildcards are allowed only in the last path component");
  for (const auto& p : list_dir(dir, [&](const std::string& n) { return ::fnmatch(glob.c_str(), n.c_str(), 0) == 0; }))
    single(p);
  FSDP_CHECK(!files.empty(), "data pattern '", o.path, "' matches no file in '", dir, "' — check the pattern");
  return files;
}

// --- loading ----------------------------------------------------------------------

void check_tokenizer(const Tokenizer* tokenizer, const std::string& path, const char* kind) {
  FSDP_CHECK(tokenizer != nullptr, "data file '", path, "' is ", kind, ", which needs a tokenizer — pass one ",
             "(e.g. make_tokenizer(\"byte\")) or give pre-tokenized .bin data");
  FSDP_CHECK(tokenizer->eos_id() >= 0, "tokenizer ", tokenizer->name(), " has no EOS token, which packing ",
             "documents needs (EOS goes between them) — use a model trained with an EOS piece, or for a ",
             "tokenizer.json put its tokenizer_config.json (eos_token) beside it");
}

void append_document(const Tokenizer& tok, std::string_view text, bool add_bos, std::vector<int32_t>& out) {
  if (add_bos) out.push_back(tok.bos_id());
  const auto ids = tok.encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
  out.push_back(tok.eos_id());
}

// A tokenizer whose vocabulary cannot represent the text (an empty or
// degenerate one) turns every document into its BOS/EOS markers alone:
// training on that learns nothing, so it is refused.
void check_tokens_carry_text(const Tokenizer& tok, const std::string& path, int64_t documents,
                             const std::vector<int32_t>& tokens) {
  for (const int32_t t : tokens) {
    if (t != tok.eos_id() && t != tok.bos_id()) return;
  }
  FSDP_CHECK(false, "data ", path, ": tokenizer ", tok.name(), " encodes its ", documents, " document",
             documents == 1 ? "" : "s", " into end-of-sequence markers only (", tokens.size(), " tokens, none of "
             "them text): its vocabulary cannot represent the text — give the model's real tokenizer");
}

// Bytes a text source may hold in memory: DatasetOptions::memory_budget, within RLIMIT_DATA.
int64_t text_memory_budget(const DatasetOptions& o) {
  int64_t budget = o.memory_budget;
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_DATA, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const int64_t half = static_cast<int64_t>(std::min<rlim_t>(lim.rlim_cur, INT64_MAX)) / 2;
    budget = budget < 0 ? half : std::min(budget, half);
  }
  return budget;
}

// `budget`: text_memory_budget's bytes, -1 for no limit.
void check_tokens_fit(int64_t budget, const std::string& path, const std::vector<int32_t>& tokens) {
  const int64_t held = static_cast<int64_t>(tokens.size() * sizeof(int32_t));
  FSDP_CHECK(budget < 0 || held <= budget, "data file '", path, "': its tokens need more than ", held,
             " bytes of memory (the limit for tokenized text here is ", budget, ") — ", kTooLargeForMemoryFix);
}

// A plain text file (after decompression) is one document.
int64_t load_text_file(const DatasetOptions& o, int64_t budget, const std::string& path, const Tokenizer& tok,
                       std::vector<int32_t>& tokens) {
  DataFileReader in(path);
  const std::string text = in.read_all(budget);
  FSDP_CHECK(!text.empty(), "data file '", path, "' is empty — give a file with text in it");
  append_document(tok, text, o.add_bos, tokens);
  return 1;
}

int64_t load_jsonl_file(const DatasetOptions& o, int64_t budget, const std::string& path, const Tokenizer& tok,
                        std::vector<int32_t>& tokens) {
  DataFileReader in(path);
  std::string line;
  int64_t line_no = 0, documents = 0, nonblank = 0;
  while (in.next_line(line)) {
    ++line_no;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++nonblank;
    std::string why;
    std::optional<nlohmann::json> parsed = parse_json_input(line, why);
    FSDP_CHECK(parsed.has_value(), "data file '", path, "' line ", line_no, " is not valid JSON (", why,
               ") — each line must be one object such as {\"", o.text_field, "\": \"...\"}");
    const nlohmann::json j = std::move(*parsed);
    FSDP_CHECK(j.is_object(), "data file '", path, "' line ", line_no, " is JSON but not an object — each ",
               "line must be one object such as {\"", o.text_field, "\": \"...\"}");
    const auto it = j.find(o.text_field);
    if (it == j.end() || !it->is_string()) {
      std::string keys;
      for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + ("\"" + k + "\"");
      FSDP_CHECK(false, "data file '", path, "' line ", line_no, ": ",
                 it == j.end() ? "no field \"" : "field \"", o.text_field,
                 it == j.end() ? "\"" : "\" is not a string", " (fields: ", keys.empty() ? "none" : keys,
                 ") — set DatasetOptions::text_field to the field holding the text");
    }
    const auto& text = it->get_ref<const std::string&>();
    if (text.empty()) continue;
    append_document(tok, text, o.add_bos, tokens);
    if ((++documents & 1023) == 0) check_tokens_fit(budget, path, tokens);
  }
  FSDP_CHECK(documents > 0, "data file '", path, "' has no documents (", line_no, " lines, ", nonblank,
             " non-blank, none with a non-empty \"", o.text_field, "\") — give a non-empty JSON lines file");
  return documents;
}

std::shared_ptr<const TokenDataset> load_text_sources(const DatasetOptions& o, const std::vector<DataFile>& files,
                                                      const Tokenizer* tok) {
  bool any_text = false, any_jsonl = false;
  for (const auto& f : files) (f.format == DataFormat::kText ? any_text : any_jsonl) = true;
  check_tokenizer(tok, files.front().path, any_jsonl ? "JSON lines" : "plain text");
  FSDP_CHECK(!o.add_bos || tok->bos_id() >= 0, "documents should start with BOS but tokenizer ", tok->name(),
             " has no BOS token");
  FSDP_CHECK(!any_jsonl || !o.text_field.empty(),
             "DatasetOptions::text_field is empty — name the JSON field holding each document (default \"text\")");
  const int64_t budget = text_memory_budget(o);
  std::vector<int32_t> tokens;
  std::vector<std::pair<int64_t, std::string>> starts;
  int64_t documents = 0;
  for (const auto& f : files) {
    starts.emplace_back(static_cast<int64_t>(tokens.size()), f.path);
    try {
      documents += f.format == DataFormat::kText ? load_text_file(o, budget, f.path, *tok, tokens)
                                                 : load_jsonl_file(o, budget, f.path, *tok, tokens);
    } catch (const std::bad_alloc&) {
      FSDP_CHECK(false, "data file '", f.path, "' does not fit in memory (out of memory after ", tokens.size(),
                 " tokens) — ", kTooLargeForMemoryFix);
    }
    check_tokens_fit(budget, f.path, tokens);
  }
  tokens.shrink_to_fit();
  check_tokens_carry_text(*tok, o.path, documents, tokens);
  const std::string kind = any_text && any_jsonl ? "text+jsonl" : any_text ? "text" : "jsonl";
  return std::make_shared<MemoryDataset>(std::move(tokens), o.path, kind, documents, std::move(starts));
}

}  // namespace

DataFormat parse_data_format(const std::string& s) {
  if (s == "auto") return DataFormat::kAuto;
  if (s == "text") return DataFormat::kText;
  if (s == "jsonl") return DataFormat::kJsonl;
  if (s == "bin") return DataFormat::kBinary;
  FSDP_CHECK(false, "unknown data format \"", s, "\" — choose auto, text, jsonl or bin");
  return DataFormat::kAuto;
}

TokenDtype parse_token_dtype(const std::string& s) {
  if (s == "uint16" || s == "u16") return TokenDtype::kUint16;
  if (s == "uint32" || s == "u32") return TokenDtype::kUint32;
  FSDP_CHECK(false, "unknown DatasetOptions::token_dtype \"", s, "\" — choose u16 or u32");
  return TokenDtype::kUint16;
}

const char* to_string(DataFormat f) {
  switch (f) {
    case DataFormat::kAuto: return "auto";
    case DataFormat::kText: return "text";
    case DataFormat::kJsonl: return "jsonl";
    case DataFormat::kBinary: return "bin";
  }
  return "?";
}

const char* to_string(TokenDtype d) { return d == TokenDtype::kUint16 ? "uint16" : "uint32"; }

int32_t TokenDataset::at(int64_t pos) const {
  FSDP_CHECK(pos >= 0 && pos < size(), "token position ", pos, " is outside the dataset [0, ", size(), ")");
  int32_t v = 0;
  read(pos, 1, &v);
  return v;
}

void TokenDataset::validate(int64_t vocab_size) const {
  FSDP_CHECK(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<int32_t> buf(static_cast<size_t>(std::min(kChunk, size())));
  for (int64_t begin = 0; begin < size(); begin += kChunk) {
    const int64_t n = std::min(kChunk, size() - begin);
    read(begin, n, buf.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = buf[i];
      if (v >= 0 && v < vocab_size) continue;
      // uint32 ids >= 2^31 read back negative: report them as the unsigned value.
      const int64_t shown = v < 0 ? v + (int64_t{1} << 32) : v;
      FSDP_CHECK(false, "token id ", shown, " at position ", begin + i, " (", locate(begin + i),
                 ") is outside the vocabulary [0, ", vocab_size, ") — the data was tokenized for a different ",
                 "vocabulary (check load_dataset: tokenizer and the model's vocab_size), or "
                 "DatasetOptions::token_dtype is wrong (u16 vs u32)");
    }
  }
}

std::vector<std::string> data_files(const DatasetOptions& options) {
  std::vector<std::string> out;
  for (const auto& f : resolve_files(options)) out.push_back(f.path);
  return out;
}

std::shared_ptr<const TokenDataset> load_dataset(const DatasetOptions& options, const Tokenizer* tokenizer) {
  const std::vector<DataFile> files = resolve_files(options);
  const bool binary = files.front().format == DataFormat::kBinary;
  for (const auto& f : files) {
    FSDP_CHECK((f.format == DataFormat::kBinary) == binary, "data path '", options.path, "' mixes binary token ",
               "files (", binary ? files.front().path : f.path, ") with text (", binary ? f.path : files.front().path,
               ") — give one kind");
  }
  if (!binary) return load_text_sources(options, files, tokenizer);
  std::vector<std::string> paths;
  for (const auto& f : files) paths.push_back(f.path);
  return std::make_shared<MappedDataset>(paths, options.token_dtype, options.path);
}

std::shared_ptr<const TokenDataset> make_token_dataset(std::vector<int32_t> tokens, std::string name) {
  return std::make_shared<MemoryDataset>(std::move(tokens), std::move(name), "memory", -1);
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, TokenDtype dtype) {
  const int64_t max = dtype == TokenDtype::kUint16 ? 0xFFFF : 0x7FFFFFFF;
  std::vector<unsigned char> bytes;
  bytes.reserve(tokens.size() * dtype_bytes(dtype));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    FSDP_CHECK(t >= 0 && t <= max, "token ", t, " at position ", i, " does not fit ", to_string(dtype),
               " — use uint32 for vocabularies above 65536");
    for (size_t b = 0; b < dtype_bytes(dtype); ++b) bytes.push_back(static_cast<unsigned char>(t >> (8 * b)));
  }
  write_output_file(path, std::string(bytes.begin(), bytes.end()), "token file");
}

}  // namespace fsdp::data

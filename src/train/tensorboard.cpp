#include "train/tensorboard.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <algorithm>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include "fsdp/checkpoint/crc32c.h"
#include "fsdp/common/error.h"
#include "fsdp/common/output_file.h"

namespace fsdp::train {
namespace {

// Protocol-buffer wire format, the few pieces an Event needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as the wire format is (and this host)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);  // wall_time: double
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);  // step: int64 varint
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TFRecord's checksum: CRC-32C rotated and offset, so that a CRC of data that
// holds CRCs is not degenerate.
uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = checkpoint::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

std::string tensorboard_scalar_event(double wall_time, int64_t step,
                                     const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    put_tag(v, 2, 5);  // simple_value: float
    put_fixed(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resumed_at) : dir_(dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  FSDP_CHECK(!ec && std::filesystem::is_directory(dir), "LogOptions::tensorboard_dir ", dir,
             ": cannot create the directory (", ec ? ec.message() : "not a directory", "); choose another");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double now = wall_seconds();
  // Readers take a directory's files in name order, and a resume's START must
  // come after the files it supersedes: the seconds field is past theirs even
  // when a resume starts within the same second (Note [TensorBoard after a
  // resume]).
  int64_t seconds = static_cast<int64_t>(now);
  const std::string prefix = "events.out.tfevents.";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    try {
      seconds = std::max<int64_t>(seconds, std::stoll(name.substr(prefix.size())) + 1);
    } catch (const std::exception&) {
      // another tool's name: not ours to order against
    }
  }
  path_ = (std::filesystem::path(dir) / (prefix + std::to_string(seconds) + "." + host + "." + std::to_string(getpid())))
              .string();
  // A new file (O_EXCL): never over something already there (Note [Output targets]).
  const int fd = open_output_fd(path_, "LogOptions::tensorboard_dir", StreamMode::kCreateNew);
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int e = errno;
    ::close(fd);
    FSDP_FAIL("LogOptions::tensorboard_dir ", dir, ": cannot write ", path_, " (", std::strerror(e), ")");
  }
  std::string version = event_header(now, 0);
  put_bytes(version, 3, "brain.Event:2");
  write_record(version);
  if (resumed_at >= 0) {
    std::string start = event_header(now, resumed_at);
    std::string log;
    put_tag(log, 1, 0);  // status: START
    put_varint(log, 1);
    put_bytes(start, 7, log);  // session_log (6 is the deprecated log_message)
    write_record(start);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  write_record(tensorboard_scalar_event(wall_seconds(), step, values));
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string rec;
  const uint64_t n = event.size();
  put_fixed(rec, n);
  put_fixed(rec, masked_crc(rec.data(), sizeof(n)));
  rec += event;
  put_fixed(rec, masked_crc(event.data(), event.size()));
  errno = 0;
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0) {
    FSDP_FAIL("LogOptions::tensorboard_dir ", dir_, ": writing ", path_, " failed (",
              errno != 0 ? std::strerror(errno) : "stream error", "); free space on its disk or choose another");
  }
}

}  // namespace fsdp::train

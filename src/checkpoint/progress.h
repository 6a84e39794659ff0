// A one-line progress bar on stderr for long checkpoint I/O:
//   saving step_00000100 [##########          ]  52%  1.31/2.52 GB  0.84 GB/s
// Drawn only when enabled (the caller decides: rank 0 and isatty(stderr)), only
// once the operation has run for kDelay, at most every kInterval; the line is
// erased when done, so logs never contain it.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::checkpoint::io {

class Progress {
 public:
  Progress(std::string what, int64_t total_bytes, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(int64_t bytes);
  void finish();

 private:
  void draw();

  std::string what_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  int64_t done_ = 0;
  double start_;
  double last_draw_ = 0;
};

}  // namespace fsdp::checkpoint::io
